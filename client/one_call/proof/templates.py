"""Guard sources' texts, each compiled once per process.

torch reads a chained guard source's value (``L['self'].encoder.layer[3].weight``) one link at a time, with
``eval`` of a short template (``tmp.weight``, ``tmp[3]``) that it compiles again at every call
(``torch/_guards.py``, ``Source.get_value``). A proof's load reads every guard's source twice, once to
compare it with the build's description and once in torch's own guard tree: BERT-large's load evaluated
6,080 templates, of 239 distinct texts. ``compiled_once()`` gives that module an ``eval`` that compiles each
text once; the expression, its globals and its locals are still torch's, so every value is the one the
builtin would give.
"""
from __future__ import annotations

import builtins
import contextlib
import functools
import sys
import threading
from typing import Any, Iterator, Optional

_lock = threading.Lock()
_users = 0


@functools.lru_cache(maxsize=4096)
def compiled(text: str) -> Any:
    """A guard source's text (or one of torch's templates), compiled for ``eval``."""
    return compile(text, "<guard source>", "eval")


def _eval(expression: Any, globals: Optional[dict] = None, locals: Optional[dict] = None) -> Any:  # noqa: A002
    if globals is None:  # the caller's own scope, as the builtin would take it (torch always passes its own)
        frame = sys._getframe(1)
        globals, locals = frame.f_globals, frame.f_locals if locals is None else locals
    if isinstance(expression, str):
        expression = compiled(expression.strip(" \t"))  # the builtin strips these from a string too
    return builtins.eval(expression, globals, locals)  # noqa: S307 - torch's own source text


@contextlib.contextmanager
def compiled_once() -> Iterator[None]:
    """Inside: ``torch._guards``' ``eval`` compiles each text once (nested and concurrent uses share it)."""
    global _users
    import torch._guards as torch_guards

    with _lock:
        _users += 1
        torch_guards.eval = _eval  # a module global shadows the builtin for that module's code only
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and vars(torch_guards).get("eval") is _eval:
                del torch_guards.eval
