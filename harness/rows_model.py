"""A deploy's files for the proof's attack rows: one model that reads every kind of state the issue's rows
change (class constant, enum value, module-level dataclass and partial, lru_cache helper, a helper reached as
``pkg.sub.fn()``, a TorchScript helper, attributes holding a dataclass, a callable object, a dict and a
numpy scalar, hooks given as a partial and as a stateful object, an environment variable, grad mode, a
tied weight, a convolution, a module-level dict, a closure's cell, a method of its own class), and two more
for a train-mode build and a declared range over a ``squeeze()``.

``write(folder, **edits)`` writes ``rowmodel.py``, ``rowpkg/sub.py`` and ``rowpkg/settings.py`` there, each value from ``DEFAULTS``
unless edited: a restart writes the same folder with one edit, as a deploy of changed files would.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

#: every value the model's files hold, as the build writes them
DEFAULTS: Dict[str, Any] = {
    "scale": 1.0, "enum_a": 1.0, "global_gain": 0.5, "slope": 0.1, "lru_k": 0.25, "sub_k": 0.75, "jit_k": 1.5,
    "dict_k": 3, "attr_gain": 0.9, "call_k": 1.25, "np_k": 0.5, "hook_k": 1.1, "stateful_k": 0.8,
    "table_bias": 0.05, "closure_k": 0.7,
}

MODEL = '''\
import dataclasses
import enum
import functools
import os

import numpy
import torch
import torch.nn.functional as F
from torch import nn

import rowpkg.sub
from rowpkg import settings


class Mode(enum.Enum):
    A = {enum_a!r}
    B = 2.0


@dataclasses.dataclass
class Settings:
    gain: float = 1.0


SETTINGS = Settings(gain={global_gain!r})
ACT = functools.partial(F.leaky_relu, negative_slope={slope!r})
TABLE = {{"bias": {table_bias!r}}}


def _scaled_by(k):
    def scale(y):
        return y * k
    return scale


CLOSED = _scaled_by({closure_k!r})


@functools.lru_cache(maxsize=None)
def table(n):
    return n * {lru_k!r}


@torch.jit.script
def jit_helper(x):
    return x * {jit_k!r}


class Scaler:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x * self.k


def scale_hook(module, inputs, output, k=1.0):
    return output * k


class StatefulHook:
    def __init__(self, k):
        self.k = k

    def __call__(self, module, inputs, output):
        return output * self.k


class Rows(nn.Module):
    SCALE = {scale!r}

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(8, 8)
        self.mid = nn.Linear(8, 8)
        self.conv = nn.Conv2d(2, 2, 1)
        self.bn = nn.BatchNorm1d(8)
        self.dec = nn.Linear(8, 8, bias=False)
        self.dec.weight = self.enc.weight  # tied
        # from another file: the class's own code stays the same when these change
        self.config = {{"k": settings.DICT_K}}
        self.opts = Settings(gain=settings.ATTR_GAIN)
        self.scaler = Scaler(settings.CALL_K)
        self.np_scale = numpy.float32(settings.NP_K)

    def extra(self, y):
        return y

    def forward(self, x):
        y = self.enc(x) * self.SCALE * Mode.A.value * SETTINGS.gain
        y = ACT(y) + rowpkg.sub.fn(y) + table(3) * y
        y = self.extra(CLOSED(y) + TABLE["bias"])
        y = jit_helper(self.mid(y))
        y = self.conv(y.reshape(-1, 2, 2, 2)).reshape(-1, 8)
        y = self.scaler(y) * self.config["k"] * self.opts.gain * self.np_scale
        if os.environ.get("ROWS_FLAG") == "1":
            y = y * 2
        if torch.is_grad_enabled():
            y = y + 1
        y = F.gelu(self.bn(y))
        return self.dec(y)


def attach_hooks(model):
    """The build's hooks: a partial on one module, a stateful object on another."""
    model.mid.register_forward_hook(functools.partial(scale_hook, k={hook_k!r}))
    model.conv.register_forward_hook(StatefulHook({stateful_k!r}))
    return model


class Squeezer(nn.Module):
    """Served for a declared batch range: its squeeze() drops the batch dim at 1, and only there."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=-1).squeeze()
'''

SUB = '''\
def fn(y):
    return y * {sub_k!r}
'''

SETTINGS = '''\
DICT_K = {dict_k!r}
ATTR_GAIN = {attr_gain!r}
CALL_K = {call_k!r}
NP_K = {np_k!r}
'''


def write(folder: Path, **edits: Any) -> Dict[str, Any]:
    """Write the deploy's files into ``folder`` with ``edits`` over ``DEFAULTS``; return the values written."""
    unknown = sorted(set(edits) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"no such value in the rows model: {unknown}")
    values = {**DEFAULTS, **edits}
    folder = Path(folder)
    (folder / "rowpkg").mkdir(parents=True, exist_ok=True)
    (folder / "rowpkg" / "__init__.py").write_text("")
    (folder / "rowpkg" / "sub.py").write_text(SUB.format(**values))
    (folder / "rowpkg" / "settings.py").write_text(SETTINGS.format(**values))
    (folder / "rowmodel.py").write_text(MODEL.format(**values))
    return values
