"""What of a model the key covers beyond its structure: the code that runs and its non-tensor configuration.

Two models with the same module tree and the same parameter names and shapes are not the same
model when ``forward`` changed (relu to tanh) or a setting did (``LeakyReLU(0.01)`` to
``LeakyReLU(0.9)``): a package built for one would answer for the other. So the key also holds

- ``code``: a digest of the bytecode of every method of every module class in the model (its whole
  MRO outside torch), of the functions and classes those methods reach through their globals in
  their own file (helpers, followed to any depth) and of plain module-level values they read
  (``SLOPE = 0.1``), of closures and default values, and of the hooks registered on the modules.
  Code in the deploy's other files is followed too (``from helpers import offset``, ``import helpers;
  helpers.offset()``); code of an installed distribution (installed.py: a file under site-packages, or in a folder that
  holds the distribution's metadata: ``pip install --target``) is keyed by the
  distribution's name and version instead of its bytecode (transformers' BERT reaches 8 s of its library
  when followed). Not keyed: tensors held in module-level globals, and an installed package whose
  files changed under the same version (``verify=True`` is the check for those). Bytecode, not source: it needs no source files and leaves
  out line numbers and file paths (a comment or a moved file is the same model), and its digest is
  the same in every process (a frozenset constant is hashed in sorted order, never in set order).
  torch's own code is left out: the key's environment holds torch's version.
- ``config``: every module's ``extra_repr()`` and its plain-valued attributes (numbers, strings,
  dtypes, tuples and dicts of them), and a transformers ``config.to_dict()`` where a module has one.

A changed one is another key, hence a miss. The key is an index, not a proof: it finds the package
most likely to be this model's, so two versions of a deploy do not take turns at one entry, and the
proof (proof/) decides whether that package serves. Both walks never raise: an object they cannot read
is keyed as unreadable. Both are computed at ``compile()``, on the hit path too: the mlp's take well
under a millisecond (docs/client.md).
"""
from __future__ import annotations

import collections
import enum
import functools
import hashlib
import json
import sys
import types
from typing import Any, Callable, Deque, Optional, Set, Tuple

from . import installed

FINGERPRINT_CHARS = 16
#: packages whose code the key's environment already pins (torch's version) or that are the language's
COVERED = frozenset({"torch", "builtins", "typing", "functools", "collections", "abc", "math", "operator",
                     "contextlib", "dataclasses", "enum", "warnings", "inspect", "copy", "itertools"})
#: a bound on the code objects followed (a model reaching a whole library through its globals)
MAX_CODE_OBJECTS = 20000
#: nn.Module's own bookkeeping: not configuration (the tensors and submodules are keyed elsewhere)
# _is_torch_compile: torch.compile sets it on the module it compiles (a miss does), so without this a later
# compile() of the same model in the process (a second CompiledModel, a reload) had another key
MODULE_INTERNALS = frozenset({"training", "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
                              "_is_torch_compile"})


def _covered(module_name: Optional[str]) -> bool:
    top = (module_name or "builtins").split(".", 1)[0]
    return top in COVERED or top in getattr(sys, "stdlib_module_names", ())


class _Walker:
    """Feeds one sha256 with the code a model runs; each function and class once.

    Iterative (a work queue, not recursion): a forward reaching a chain of hundreds of helpers in the
    deploy's own code is walked to its end (recursion stopped at Python's frame limit)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.seen: Set[int] = set()
        self.libraries: Set[str] = set()
        self.count = 0
        self.todo: Deque[Tuple[Callable[..., None], tuple]] = collections.deque()

    def put(self, text: str) -> None:
        self.h.update(text.encode("utf-8", "backslashreplace") + b"\n")

    def later(self, step: Callable[..., None], *args: Any) -> None:
        self.todo.append((step, args))

    def run(self) -> None:
        while self.todo:
            step, args = self.todo.popleft()
            step(*args)

    def klass(self, cls: type) -> None:
        if id(cls) in self.seen or _covered(cls.__module__):
            return
        self.seen.add(id(cls))
        self.put(f"class {cls.__module__}.{cls.__qualname__}")
        for base in cls.__mro__[1:]:
            self.later(self.klass, base)
        for attr in sorted(vars(cls)):
            fn = _function_of(vars(cls)[attr])
            if fn is not None:
                self.put(f"attr {attr}")
                self.later(self.function, fn)

    def function(self, fn: Callable) -> None:
        fn = getattr(fn, "__func__", fn)
        wrapped = getattr(fn, "__wrapped__", None)  # functools.wraps: the code that runs is inside too
        if wrapped is not None and wrapped is not fn:
            self.later(self.value, wrapped)
        if not isinstance(fn, types.FunctionType) or id(fn) in self.seen or _covered(fn.__module__):
            return
        self.seen.add(id(fn))
        self.put(f"def {fn.__module__}.{fn.__qualname__} {_plain(fn.__defaults__)} {_plain(fn.__kwdefaults__)}")
        for cell in fn.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                self.put("cell -")
                continue
            self.later(self.value, contents)
        self.later(self.code, fn.__code__, fn.__globals__)

    def code(self, code: types.CodeType, globals_: dict) -> None:
        self.count += 1
        if self.count > MAX_CODE_OBJECTS:
            return
        self.h.update(code.co_code)
        self.put(f"names {code.co_names} vars {code.co_varnames} free {code.co_freevars}")
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self.later(self.code, const, globals_)
            else:
                self.put(f"const {_const(const)}")
        home = globals_.get("__name__")
        for name in code.co_names:  # what the code reaches through its globals: helpers, classes, settings
            target = globals_.get(name)
            if isinstance(target, types.ModuleType):  # `import helpers; helpers.offset()`
                self.later(self.module, target, code.co_names)
            elif getattr(target, "__module__", None) == home or not callable(target):
                self.later(self.value, target)
            else:  # `from helpers import offset`: another file's code
                self.later(self.foreign, target)

    def foreign(self, target: Any) -> None:
        module = getattr(target, "__module__", None)
        if not isinstance(module, str) or _covered(module):
            return
        if installed.installed(module, target):
            self.library(module)
        else:
            self.value(target)

    def module(self, module: types.ModuleType, names: tuple) -> None:
        """A module the code reaches by name: the attributes the code may read of it."""
        if _covered(module.__name__):
            return
        if installed.installed_file(getattr(module, "__file__", None)):
            self.library(module.__name__)
            return
        for name in names:
            if name in vars(module):
                self.put(f"module {module.__name__}.{name}")
                self.later(self.value, vars(module)[name])

    def library(self, module_name: str) -> None:
        top = module_name.split(".", 1)[0]
        if top not in self.libraries:
            self.libraries.add(top)
            self.put(f"library {top} {installed.versions(top)}")

    def value(self, value: Any) -> None:
        if isinstance(value, type):
            self.klass(value)
        elif callable(value) and _function_of(value) is not None:
            self.function(_function_of(value))
        else:
            text = _plain(value)
            if text is not None:
                self.put(f"value {text}")


def _function_of(value: Any) -> Optional[Callable]:
    """The Python function behind a class attribute or a callable, if any (methods, static and class
    methods, properties' getters, functools.partial's function)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    elif isinstance(value, functools.partial):
        value = value.func
    value = getattr(value, "__func__", value)
    return value if isinstance(value, types.FunctionType) else None


def _const(value: Any) -> str:
    if isinstance(value, frozenset):  # set order changes with PYTHONHASHSEED: sorted, so every process agrees
        return "frozenset(" + ",".join(sorted(_const(v) for v in value)) + ")"
    if isinstance(value, tuple):
        return "(" + ",".join(_const(v) for v in value) + ")"
    return f"{type(value).__name__}:{value!r}"


def _plain(value: Any, depth: int = 0) -> Optional[str]:
    """A stable text for a plain value (numbers, strings, dtypes, devices, enums, containers of them);
    None for anything else (tensors, modules, functions, objects whose repr holds an address)."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device", "Size", "memory_format"):
        return repr(value)
    if depth > 4:
        return None
    if isinstance(value, (tuple, list)):
        items = [_plain(v, depth + 1) for v in value]
        return None if None in items else f"{type(value).__name__}[" + ",".join(items) + "]"  # type: ignore[arg-type]
    if isinstance(value, (set, frozenset)):
        items = [_plain(v, depth + 1) for v in value]
        return None if None in items else "set[" + ",".join(sorted(items)) + "]"  # type: ignore[arg-type]
    if isinstance(value, dict):
        pairs = [(_plain(k, depth + 1), _plain(v, depth + 1)) for k, v in value.items()]
        if any(k is None or v is None for k, v in pairs):
            return None
        return "dict{" + ",".join(sorted(f"{k}={v}" for k, v in pairs)) + "}"
    return None


def code_fingerprint(model: Any) -> str:
    """A short digest of the code ``model`` runs (module docstring: what it covers); never raises (an
    object the walk cannot read gives a digest that says so: the proof decides, not the key)."""
    walker = _Walker()
    try:
        for _, module in model.named_modules():
            walker.later(walker.klass, type(module))
            for hooks in ("_forward_pre_hooks", "_forward_hooks"):
                for hook in getattr(module, hooks, {}).values():
                    walker.put(f"hook {hooks}")
                    walker.later(walker.value, hook)
        walker.run()
    except Exception as exc:  # noqa: BLE001 - an unusual object (a proxy, a C extension): still a key
        walker.put(f"unreadable {type(exc).__name__}")
    walker.put(f"code objects {min(walker.count, MAX_CODE_OBJECTS)}")
    return walker.h.hexdigest()[:FINGERPRINT_CHARS]


def config_fingerprint(model: Any) -> str:
    """A short digest of ``model``'s non-tensor configuration (module docstring: what it covers); never
    raises (an attribute it cannot read is keyed as such: the proof decides, not the key)."""
    h = hashlib.sha256()
    configs: dict = {}  # id -> index: transformers hands one config object to many modules
    for name, module in model.named_modules():
        try:
            h.update(f"m {name} {module.extra_repr()}\n".encode("utf-8", "backslashreplace"))
            for attr, value in sorted(vars(module).items()):
                if attr in MODULE_INTERNALS or attr.endswith("hooks") or attr == "config":
                    continue
                text = _plain(value)
                if text is not None:
                    h.update(f"a {attr}={text}\n".encode("utf-8", "backslashreplace"))
            _config(h, getattr(module, "config", None), configs)
        except Exception as exc:  # noqa: BLE001 - an unusual attribute: still a key
            h.update(f"m {name} unreadable {type(exc).__name__}\n".encode())
    return h.hexdigest()[:FINGERPRINT_CHARS]


def _config(h: Any, config: Any, configs: dict) -> None:
    """A transformers-style ``config`` (one with ``to_dict()``), once per object. Anything else under that
    name (a dict subclass whose ``__getattr__`` is ``dict.__getitem__``: ``KeyError('to_dict')``, a proxy)
    is keyed by its type alone: the proof decides what it holds."""
    if config is None:
        return
    try:
        to_dict = getattr(config, "to_dict", None)
        text = json.dumps(to_dict(), sort_keys=True, default=repr) if callable(to_dict) else None
    except Exception as exc:  # noqa: BLE001
        text = f"unreadable {type(exc).__name__}"
    if text is None:
        text = _plain(config) or f"type {type(config).__module__}.{type(config).__qualname__}"
    if id(config) not in configs:
        configs[id(config)] = len(configs)
        h.update(f"c {text}\n".encode("utf-8", "backslashreplace"))
    h.update(f"c# {configs[id(config)]}\n".encode())
