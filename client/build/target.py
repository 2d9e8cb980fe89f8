"""The build job's TARGET: ``module:function`` or ``path/to/file.py:function``, a function that takes no
arguments and returns the model and its example call, ``(model, args)`` or ``(model, args, kwargs)``
(torch.export's form). ``load`` imports and calls it; every way it can go wrong is a ``TargetError``
whose message names the problem and what to do, in one line (the CLI prints it and exits 2).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Dict, Mapping, Tuple

FORM = "MODULE:FUNCTION or PATH.py:FUNCTION"
RETURNS = "(model, args) or (model, args, kwargs)"


class TargetError(ValueError):
    """TARGET cannot give the example call; the message says why and what to do."""


@dataclass(frozen=True)
class Example:
    """What TARGET gave: the model and its example call."""

    model: Any
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]


def load(target: str) -> Example:
    """Import TARGET's function (the current directory on sys.path; a file's own folder for a .py path), call
    it and check what it returns. Raises TargetError."""
    where, sep, function = target.rpartition(":")
    if not sep or not where or not function.isidentifier():
        raise TargetError(f"TARGET {target!r} is not {FORM} (e.g. app.model:build)")
    module = _import_file(where) if where.endswith(".py") else _import_module(where)
    factory = getattr(module, function, None)
    if factory is None:
        raise TargetError(f"{where} has no {function!r}: define it there, or name another function after the colon")
    if not callable(factory):
        raise TargetError(f"{target} is {_kind(factory)}, not a function: name a function that "
                          f"returns {RETURNS}")
    try:
        made = factory()
    except Exception as exc:  # noqa: BLE001 - the user's code: said in one line with where it failed
        raise TargetError(f"{target}() raised {_where(exc)}: fix it, then run the build again") from None
    return _checked(target, made)


def _import_module(name: str) -> ModuleType:
    if os.getcwd() not in sys.path:  # as `python -m` would: the folder the job runs in
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise TargetError(f"no module {name!r} here ({os.getcwd()}): run the build from the folder that "
                              f"holds it, or give PATH.py:FUNCTION") from None
        raise TargetError(f"importing {name} failed: {_where(exc)}: install what it needs") from None
    except Exception as exc:  # noqa: BLE001 - the user's module: said in one line
        raise TargetError(f"importing {name} failed: {_where(exc)}") from None


def _import_file(path: str) -> ModuleType:
    if not os.path.isfile(path):
        raise TargetError(f"no file {path!r}: give the path of the .py file that defines the function")
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:  # as `python path/to/file.py` would: its neighbours import
        sys.path.insert(0, folder)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickling and dataclasses look a class's module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file: said in one line
        sys.modules.pop(name, None)
        raise TargetError(f"importing {path} failed: {_where(exc)}") from None
    return module


def _checked(target: str, made: Any) -> Example:
    try:
        import torch
    except ImportError as exc:
        raise TargetError(f"the build needs torch ({exc}): run it where the app runs, in its image") from None

    if not isinstance(made, (tuple, list)) or len(made) not in (2, 3):
        raise TargetError(f"{target}() returned {_kind(made)}; it must return {RETURNS}")
    model, args, kwargs = (*made, {}) if len(made) == 2 else made
    if not isinstance(model, torch.nn.Module):
        raise TargetError(f"{target}() returned {_kind(model)} as the model; it must be a torch.nn.Module")
    if not isinstance(args, (tuple, list)):
        raise TargetError(f"{target}() returned {_kind(args)} as args; it must be a tuple of the example's "
                          f"positional arguments (one tensor: (x,))")
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise TargetError(f"{target}() returned {_kind(kwargs)} as kwargs; it must be a dict of keyword arguments")
    return Example(model, tuple(args), dict(kwargs))


def _kind(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    if value is None:
        return "None"
    kind = type(value).__name__
    return f"{'an' if kind[0].lower() in 'aeiou' else 'a'} {kind}"


def _where(exc: BaseException) -> str:
    """``ValueError: boom (app/model.py:12)``: the exception and the innermost line that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}{at}"
