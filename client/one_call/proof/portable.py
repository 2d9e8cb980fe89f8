"""Descriptions of Python values that mean the same in every process: what proof.py compares.

Dynamo's guards pin a value by what it is in *this* process: an object's id, a class's id, a code
object. A restarted process has other ids for the same things, and may have the same names for other
things (a changed helper, a monkeypatched function). proof.py records, for every guard whose value
comes from the model or the globals, a description of that value that another process can compute
and compare: a constant by its value, a class by its qualified name and the code of its methods, a
function by its code, a tensor by its layout.

A description says only what the guard's kind checks (``describe(kind, value)``): a TYPE_MATCH on a
dict pins its type, not its contents (the contents it depends on have guards of their own). Code is
described without file names or line numbers (moving a file or adding a comment above a function is
not another computation); everything else that a code object holds is in it.

Descriptions are strings; ``None`` means the value cannot be described portably, and the build
refuses to publish a proof for it (proof.NoProof): correctness first.
"""
from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import threading
import types
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

#: how deep a description follows what a function closes over, a partial's function or a container's
#: items: the values further down have guards of their own
MAX_DEPTH = 4
#: a longer container or string is described by a digest of its items
MAX_ITEMS = 64

PLAIN = (bool, int, float, complex, str, bytes)


def _fqn(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None) or '?'}.{getattr(obj, '__qualname__', None) or getattr(obj, '__name__', '?')}"


def _digest(parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode("utf-8", "backslashreplace")).hexdigest()[:20]


@functools.lru_cache(maxsize=8192)
def code(c: types.CodeType) -> str:
    """A code object's instructions, names and constants (nested code included), not where it lives.
    Cached by the code object: code objects that compare equal hold the same instructions, names and
    constants (CPython tells 1, 1.0 and True apart there), so they have one description; a transformer's
    layers share their methods, and GPT-2's proof described 2,667 code objects, most of them again."""
    consts = tuple(code(k) if isinstance(k, types.CodeType) else constant(k) for k in c.co_consts)
    return _digest((c.co_name, c.co_argcount, c.co_posonlyargcount, c.co_kwonlyargcount, c.co_flags, c.co_code,
                    c.co_names, c.co_varnames, c.co_freevars, c.co_cellvars, consts))


def function(fn: Any, depth: int = 0) -> str:
    """A Python function: its qualified name, code, defaults, what it closes over and what it wraps."""
    parts = [_fqn(fn), code(fn.__code__), constant(fn.__defaults__, depth + 1),
             constant(tuple(sorted((fn.__kwdefaults__ or {}).items())), depth + 1)]
    for cell in fn.__closure__ or ():
        try:
            parts.append(identity(cell.cell_contents, depth + 1))
        except ValueError:  # an empty cell
            parts.append("empty")
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None and wrapped is not fn:
        parts.append(identity(wrapped, depth + 1))
    return "fn:" + _digest(parts)


#: each class's own part of a description, with the members it was made from and the classes those named:
#: (members, parts, {class: its description then}) by class
_OWN: "weakref.WeakKeyDictionary[type, Tuple[tuple, list, dict]]" = weakref.WeakKeyDictionary()
#: class attributes that are caches, not members: copyreg writes ``__slotnames__`` on a class the first time
#: one of its instances is pickled or copied (a proof's capture pickles tensors: torch.Tensor gains it, and a
#: restart that had pickled none described torch.Tensor, and every class annotated with it, otherwise)
CACHED = frozenset({"__slotnames__"})
#: per thread, for each ``_own`` being made (innermost last), the classes its members named, described
_NAMED = threading.local()


def _own(c: type) -> list:
    """``c``'s name and the members it defines, described. Kept per class and used again only while the
    class holds the very same member objects and every class those name (an annotation's ``torch.Tensor``,
    a class attribute's class) is still described as it was: a method replaced after a description (a
    monkeypatch in the same process), here or in a class a member names, is described anew. The members
    kept alive by the cache cannot have their ids reused. A transformer's classes share most of their MRO
    (nn.Module's 150 members): GPT-2's proof described them for each of its 40 classes."""
    members = tuple(sorted(((k, v) for k, v in vars(c).items() if k not in CACHED), key=lambda kv: kv[0]))
    try:
        kept = _OWN.get(c)
    except TypeError:  # a class that cannot be a weak key: described each time
        kept = None
    if kept is not None and len(kept[0]) == len(members) and all(
            a[0] == b[0] and a[1] is b[1] for a, b in zip(kept[0], members)) and all(
            klass(named) == then for named, then in kept[2].items()):
        return kept[1]
    stack = _NAMED.__dict__.setdefault("stack", [])
    stack.append({})
    try:
        parts = [_fqn(c)] + [(name, _member(attr)) for name, attr in members]
    finally:
        named = stack.pop()
    try:
        _OWN[c] = (members, parts, named)
    except TypeError:
        pass
    return parts


def _klass(cls: type) -> str:
    parts: list = []
    for c in cls.__mro__:
        if c is not object:
            parts.extend(_own(c))
    return _digest(parts)


def klass(cls: type) -> str:
    """A class: the qualified names along its MRO and every member each defines (methods by code).

    A class reached again while it is being described (``A.kinds = (B,)`` and ``B.kinds = (A,)``) is named
    there, not described again: without that the description never ends (RecursionError, no proof)."""
    busy, tainted = _BUSY.__dict__.setdefault("stack", []), _BUSY.__dict__.setdefault("tainted", set())
    if id(cls) in busy:
        tainted.update(busy)  # what each class on the way says now depends on where it began: not kept
        text = f"class:{_fqn(cls)}:cycle"
    else:
        busy.append(id(cls))
        try:
            text = _described(cls, tainted)
        finally:
            busy.pop()
            tainted.discard(id(cls))
    stack = getattr(_NAMED, "stack", None)
    if stack:  # a member of the class being described names this one: its kept description depends on it
        stack[-1][cls] = text
    return text


def _described(cls: type, tainted: set) -> str:
    """``cls``'s description, kept for the session unless a cycle was named inside it (then what it says
    depends on where the description began; one kept without a cycle reads the same from anywhere)."""
    classes = getattr(_SESSION, "classes", None)
    described = classes.get(id(cls)) if classes is not None else None
    if described is not None and described[0] is cls:
        return described[1]
    text = f"class:{_fqn(cls)}:" + _klass(cls)
    if classes is not None and id(cls) not in tainted:
        classes[id(cls)] = (cls, text)
    return text


#: the classes described inside ``session()``, per thread: ``{id(cls): (cls, description)}``
_SESSION = threading.local()
#: per thread, the ids of the classes being described (``stack``, outermost first: one reached again is named,
#: a cycle), and those described inside such a cycle (``tainted``)
_BUSY = threading.local()


@contextlib.contextmanager
def session():
    """Within the block, each class is described once: a proof's load describes a class for each of its
    TYPE_MATCH guards (the 768-wide Llama's: 429 guards on some 50 classes), and each description checked
    the members of every class along the MRO (nn.Module's 150) again. Nothing the block runs changes a
    class: the next block describes anew (a monkeypatch between two loads is seen)."""
    if getattr(_SESSION, "classes", None) is not None:  # nested: the outer block's
        yield
        return
    _SESSION.classes = {}
    try:
        yield
    finally:
        _SESSION.classes = None


def _member(attr: Any) -> str:
    """A class member, as far as a class's description goes (deeper values have guards of their own)."""
    if isinstance(attr, (staticmethod, classmethod)):
        attr = attr.__func__
    if isinstance(attr, property):
        return "property:" + ",".join(_member(f) for f in (attr.fget, attr.fset) if f is not None)
    if isinstance(attr, types.FunctionType):
        return "fn:" + ",".join(code(fn.__code__) for fn in unwrapped(attr))
    if isinstance(attr, type):
        return "type:" + _fqn(attr)
    plain = constant(attr, MAX_DEPTH - 1)  # an enum's members and value maps, a tuple of settings
    return plain if plain is not None else "obj:" + _fqn(type(attr))


def unwrapped(fn: Any) -> List[Any]:
    """``fn`` and the Python functions it wraps (functools.wraps' ``__wrapped__`` chain), outermost first:
    a decorated method runs the code of each."""
    chain = [fn]
    while len(chain) <= MAX_DEPTH:
        inner = getattr(chain[-1], "__wrapped__", None)
        if not isinstance(inner, types.FunctionType) or inner in chain:
            break
        chain.append(inner)
    return chain


def identity(value: Any, depth: int = 0) -> str:
    """What an object *is*, for guards that compare identity (ID_MATCH and its kin)."""
    if value is None or value is Ellipsis or value is NotImplemented or isinstance(value, bool):
        return repr(value)
    if isinstance(value, types.ModuleType):
        return "module:" + value.__name__
    if isinstance(value, type):  # past MAX_DEPTH by name: a closure's class has guards of its own if it is read
        return klass(value) if depth <= MAX_DEPTH else "type:" + _fqn(value)
    if isinstance(value, enum.Enum):
        return f"enum:{_fqn(type(value))}.{value.name}={constant(value.value, depth + 1)}"
    if isinstance(value, types.FunctionType):
        return function(value, depth) if depth <= MAX_DEPTH else "fn:" + _fqn(value)
    if isinstance(value, types.MethodType):
        return f"method:{identity(value.__func__, depth + 1)} of {_fqn(type(value.__self__))}"
    if isinstance(value, functools.partial):
        return (f"partial:{identity(value.func, depth + 1)}({constant(value.args, depth + 1)}, "
                f"{constant(tuple(sorted(value.keywords.items())), depth + 1)})")
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType, types.WrapperDescriptorType,
                          types.MethodWrapperType, types.MethodDescriptorType)):
        owner = getattr(value, "__self__", None)
        owner = "" if owner is None or isinstance(owner, types.ModuleType) else f" of {_fqn(type(owner))}"
        return f"builtin:{type(value).__name__}:{getattr(value, '__module__', None)}.{value.__qualname__}{owner}"
    script = getattr(value, "code", None)
    if type(value).__name__ in ("ScriptFunction", "RecursiveScriptModule") and isinstance(script, str):
        return f"script:{_fqn(type(value))}:{getattr(value, 'qualified_name', '')}:" + _digest(script)
    wrapped = getattr(value, "__wrapped__", None)  # functools.lru_cache, functools.wraps on a callable object
    if wrapped is not None and depth <= MAX_DEPTH:
        return f"wrapper:{_fqn(type(value))}:{_fqn(value)}:" + identity(wrapped, depth + 1)
    plain = constant(value, depth)
    if plain is not None:
        return plain
    # any other object: it is the object this source holds, whatever made it (the guards on its
    # attributes say what was read of it); its class says what it does
    return "object:" + klass(type(value))


def constant(value: Any, depth: int = 0) -> Optional[str]:
    """A value compared by equality (CONSTANT_MATCH, EQUALS_MATCH): its type and value; None when it is
    not a plain value (its repr would hold an address, or it is too deep)."""
    if value is None or isinstance(value, PLAIN):
        if isinstance(value, (str, bytes)) and len(value) > 4096:
            return f"{type(value).__name__}:#{_digest(value)}"
        return f"{_fqn(type(value))}:{value!r}"
    if isinstance(value, enum.Enum):  # its value too: torch folds an enum's value into the trace
        inner = constant(value.value, depth + 1) if depth <= MAX_DEPTH else None
        return f"enum:{_fqn(type(value))}.{value.name}={inner}"
    if isinstance(value, types.CodeType):
        return "code:" + code(value)
    kind = type(value).__module__.split(".")[0], type(value).__name__
    if kind[0] == "torch" and kind[1] in ("dtype", "device", "Size", "memory_format", "layout", "qscheme"):
        return f"torch.{kind[1]}:{value!r}"
    if kind[0] == "numpy" and hasattr(value, "dtype") and getattr(value, "ndim", None) == 0:
        return f"numpy.{value.dtype}:{value.item()!r}"
    if depth > MAX_DEPTH:
        return None
    if isinstance(value, (tuple, list, set, frozenset)):
        items = [constant(v, depth + 1) for v in value]
        if None in items:
            return None
        if isinstance(value, (set, frozenset)):  # set order follows PYTHONHASHSEED
            items.sort()
        text = ",".join(items)  # type: ignore[arg-type]
        return f"{_fqn(type(value))}[{text if len(items) <= MAX_ITEMS else _digest(text)}]"
    if isinstance(value, dict):
        pairs = [(constant(k, depth + 1), constant(v, depth + 1)) for k, v in value.items()]
        if any(k is None or v is None for k, v in pairs):
            return None
        return f"{_fqn(type(value))}{{" + ",".join(f"{k}={v}" for k, v in pairs) + "}"
    if isinstance(value, (types.FunctionType, type, types.ModuleType, functools.partial)):
        return identity(value, depth)
    if isinstance(value, slice):
        return constant((value.start, value.stop, value.step), depth + 1)
    return None


def tensor(t: Any) -> str:
    """A tensor, as TENSOR_MATCH pins it: class, dtype, device, sizes, strides, requires_grad, dispatch keys."""
    import torch

    keys = torch._C._dispatch_keys(t) if hasattr(torch._C, "_dispatch_keys") else ""
    return (f"tensor:{_fqn(type(t))}:{t.dtype}:{t.device}:{tuple(t.shape)}:{tuple(t.stride())}:"
            f"{bool(t.requires_grad)}:{t.layout}:{keys}")


#: a graph input's value is described by its bytes up to this many elements; a larger one is refused
MAX_INPUT_ELEMENTS = 1 << 16


def graph_input(value: Any) -> Optional[str]:
    """A value the package holds as a constant though Dynamo passes it in: its layout and its bytes (a
    tensor or numpy value of at most ``MAX_INPUT_ELEMENTS``), or a plain value; None otherwise."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.numel() > MAX_INPUT_ELEMENTS or value.is_sparse:
            return None
        data = value.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        return tensor(value) + ":" + hashlib.sha256(data).hexdigest()[:32]
    return constant(value)


def _length(value: Any) -> str:
    return f"len:{len(value)}"


def _keys(value: Any) -> Optional[str]:
    keys = [constant(k) for k in value.keys()]
    return None if None in keys else "keys:" + ",".join(keys)  # type: ignore[arg-type]


def _type_only(value: Any) -> str:
    return "type:" + _fqn(type(value))


def _type_match(value: Any) -> str:
    return "type:" + klass(type(value))


def _dispatch_keys(value: Any) -> str:
    import torch

    return f"keys:{torch._C._dispatch_keys(value)}"


def _tuple_iterator_len(value: Any) -> str:
    return f"len:{value.__length_hint__()}"


#: guard kind -> how its value is described. Kinds not here and not in proof.py's other lists are
#: refused (proof.NoProof): a kind this module does not understand could pin a value nobody compares.
DESCRIBE: Dict[str, Callable[[Any], Optional[str]]] = {
    # identity: an object's id in the process that traced
    "ID_MATCH": identity, "FUNCTION_MATCH": identity, "CLOSURE_MATCH": identity, "BUILTIN_MATCH": identity,
    "MODULE_MATCH": identity, "CLASS_MATCH": identity, "NN_MODULE": identity,
    # value
    "CONSTANT_MATCH": constant, "CONSTANT_SUBCLASS_MATCH": constant, "EQUALS_MATCH": constant,
    "BOOL_MATCH": constant, "NONE_MATCH": constant,
    "TYPE_MATCH": _type_match, "TENSOR_MATCH": tensor, "DISPATCH_KEY_SET_MATCH": _dispatch_keys,
    "DICT_KEYS_MATCH": _keys, "MAPPING_KEYS_CHECK": _keys,
    "SEQUENCE_LENGTH": _length, "TUPLE_ITERATOR_LEN": _tuple_iterator_len,
    # checked on the live objects as they are (proof.py: the guard tree is checked once at load);
    # described by type so a build and a restart that disagree on what the source holds differ
    "HASATTR": _type_only, "NOT_PRESENT_IN_GENERIC_DICT": _type_only, "DICT_CONTAINS": _type_only,
    "DICT_NOT_CONTAINS": _type_only, "SET_CONTAINS": _type_only, "SET_NOT_CONTAINS": _type_only,
    "EMPTY_NN_MODULE_HOOKS_DICT": _type_only, "NOT_NONE_MATCH": _type_only, "DUPLICATE_INPUT": _type_only,
}


def describe(kind: str, value: Any) -> Optional[str]:
    """The description of ``value`` as a guard of ``kind`` pins it; None: not portable. KeyError: an
    unknown kind."""
    return DESCRIBE[kind](value)
