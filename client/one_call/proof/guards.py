"""What the build and the restart agree on about a guard: its kind's family, the frame local it starts
from, the key its description is filed under."""
from __future__ import annotations

import hashlib
import re
import sys
from typing import Any, Dict, Optional, Sequence

#: guard kinds whose expectation comes from the traced process's global state (grad mode, autocast,
#: default device, ...): serialized by torch and checked as the build saw it
GLOBAL_KINDS = frozenset({"GRAD_MODE", "DETERMINISTIC_ALGORITHMS", "FSDP_TRAINING_STATE", "GLOBAL_STATE",
                          "TORCH_FUNCTION_STATE", "DEFAULT_DEVICE", "SHAPE_ENV", "DUAL_LEVEL",
                          "FUNCTORCH_STACK_MATCH", "AUTOGRAD_SAVED_TENSORS_HOOKS"})
#: guard kinds whose description holds a class's members' code (portable.klass)
CLASS_KINDS = frozenset({"TYPE_MATCH", "CLASS_MATCH", "ID_MATCH"})
#: the frame's locals that are the call (their guards keep torch's serialized expectations)
CALL_LOCALS = ("args", "kwargs")
#: the described-entry prefix of a graph input read from the model or the globals (capture._record_inputs)
INPUT = "INPUT "
#: a graph input Dynamo reads from a module's own slot: the package binds the live tensor there (runner.py)
SLOT = re.compile(r"\._(parameters|buffers)\[[^\]]+\]$")
#: a graph input Dynamo reads from a plain attribute of the model or a submodule (GPT-J's sinusoidal table on
#: transformers 4.57, ``self.embed_positions = create_sinusoidal_positions(...)``): the model's own tensor,
#: bound live by its path like a buffer (export.bind_attributes makes it one in the program)
ATTRIBUTE = re.compile(r"^L\['self'\]((?:\._modules\['[^'\]]+'\])*)\.([A-Za-z_]\w*)$")
#: Python's own modules: their code is the interpreter's (the key holds the Python version)
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))


def root(source: Any, memo: Optional[Dict[int, Optional[str]]] = None) -> Optional[str]:
    """The frame local (``self``, ``args``, ``kwargs``) or ``G`` a guard's source starts from. ``memo`` (one per
    pass over a trace's guards, while they hold their sources) keeps each chain link's answer: the guards of a
    module tree share their paths from ``self`` (15 links deep on average in a RegNet), and torch's own
    lookups walk each path to its end again, for a fifth of the proof's comparison."""
    from torch._dynamo.source import ChainedSource, LocalSource, get_global_source_name

    walked, node, found = [], source, _UNSEEN
    while isinstance(node, ChainedSource):
        found = memo.get(id(node), _UNSEEN) if memo is not None else _UNSEEN
        if found is not _UNSEEN:
            break
        walked.append(node)
        node = node.base
    if found is _UNSEEN:
        if isinstance(node, LocalSource):
            found = node.local_name
        else:
            found = "G" if get_global_source_name(node) is not None else None
    if memo is not None:
        for link in walked:
            memo[id(link)] = found
    return found


_UNSEEN = object()


def attribute_fqn(source_name: str) -> Optional[str]:
    """``"transformer.h.0.attn.embed_positions"`` for the source ``L['self']._modules['transformer']...
    ._modules['attn'].embed_positions`` (what torch.export names the tensor), None for any other source."""
    found = ATTRIBUTE.match(source_name)
    if found is None:
        return None
    return ".".join([*re.findall(r"\['([^'\]]+)'\]", found.group(1)), found.group(2)])


def key(guard: Any) -> str:
    """Where a guard's description is filed: its kind and its source's text."""
    return f"{guard.create_fn_name()} {guard.name}"


def lines_digest(lines: Sequence[str]) -> str:
    return hashlib.sha256("".join(lines).encode("utf-8", "backslashreplace")).hexdigest()


def short(text: Optional[str]) -> str:
    text = "(not portable)" if text is None else text
    return text if len(text) <= 80 else text[:77] + "..."


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")
