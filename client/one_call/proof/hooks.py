"""The module hook dicts a trace saw empty, checked by cachesvc instead of torch's guard tree.

Dynamo guards every module's hook dicts the trace passed through as empty (EMPTY_NN_MODULE_HOOKS_DICT): a third
of a transformer's guards. The proof's trees are built with torch's ``skip_nnmodule_hook_guards`` (check.py's
TREE_CONFIG), which makes nothing of them, and ``Hooks`` checks them: at load, each dict is there and empty; before
each call, one attribute read tells whether any hook was registered anywhere since, and only then are the dicts
looked at again.
"""
from __future__ import annotations

import builtins
from typing import Any, List, Optional

from .container import NoProof

HOOK_KIND = "EMPTY_NN_MODULE_HOOKS_DICT"


class Hooks:
    """The module hook dicts the build saw empty (its EMPTY_NN_MODULE_HOOKS_DICT guards), checked at load and
    again whenever a hook handle has been made anywhere since (``RemovableHandle.next_id``, one attribute
    read a call): a hook registered after the load is seen at the next call. The dicts are found from their
    guards' sources once (and again by ``refresh`` after a submodule was swapped): a check is one ``len``
    a dict."""

    def __init__(self, model: Any):
        from torch.utils.hooks import RemovableHandle

        self._handles, self._sources, self._scope, self._seen = RemovableHandle, [], {}, -1
        self._dicts: List[Any] = []

    def add(self, sources: List[Any], live_locals: dict, live_globals: dict) -> None:
        """At load: every dict the build saw must be here and empty (the comparison leaves these guards to this)."""
        self._sources.extend(sources)
        self._scope = {"L": live_locals, "G": live_globals, "__builtins__": builtins.__dict__}
        self.refresh(at_load=True)
        why = self._check()
        if why:
            raise NoProof(why)

    def refresh(self, at_load: bool = False) -> None:
        """Find the hook dicts again from their sources (the model's modules may have been swapped)."""
        from torch._dynamo.guards import _get_closure_vars

        cache, closure_vars, found = {}, _get_closure_vars(), []
        for source in self._sources:
            try:
                found.append((source.name, source.get_value(self._scope, closure_vars, cache)))
            except Exception:  # noqa: BLE001 - the module is gone: its slot's guards say so
                if at_load:
                    raise NoProof(f"{source.name} is not there in this process (the build read it)") from None
                continue
        self._dicts = found
        self._seen = -1

    def why(self) -> Optional[str]:
        """None while no module the trace ran has a hook it did not have at build; else which."""
        if self._handles.next_id == self._seen:
            return None
        return self._check()

    def _check(self) -> Optional[str]:
        seen = self._handles.next_id
        for name, hooks in self._dicts:
            if hooks:
                return f"{name} has a hook the package was not built with"
        self._seen = seen
        return None
