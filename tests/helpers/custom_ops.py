"""A custom operator the way a model library defines one (``torch.library.custom_op``, as transformers 5 defines
``transformers::grouped_mm_fallback`` for its mixture-of-experts layers), and a small model that calls it.

Importing this module registers the operator; a process that has not imported it cannot read back a program
that calls it, nor run a package built from one (tests/client/test_custom_ops.py)."""
from __future__ import annotations

import torch


@torch.library.custom_op("cachesvc_test::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    return x + y * scale


@scaled_add.register_fake
def _(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


class CallsACustomOp(torch.nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = torch.nn.Linear(8, 8)
        self.skip = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        return torch.ops.cachesvc_test.scaled_add(self.fc(x), self.skip.expand_as(x), 0.5).relu()
