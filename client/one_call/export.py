"""Export: the model traced by ``torch.export`` for the example inputs, saved for the build child."""
from __future__ import annotations

import copy
from typing import Any, Sequence


def export(model: Any, example_inputs: Sequence[Any], path: str) -> None:
    """``torch.export`` a copy of ``model`` for ``example_inputs`` and save the program at ``path`` (.pt2).

    Called in the serving thread, between two calls (one_call.py): export sets torch.fx's module-level
    node metadata, which a compiled call running at the same time in another thread also sets, and
    torch 2.11's compiled ViT-B/16 died of that race (KeyError 'custom', then terminate) when export
    ran in the background thread."""
    import torch

    twin = copy.deepcopy(model)  # export may patch the module it traces; the process keeps the original
    with torch.no_grad():
        torch.export.save(torch.export.export(twin, tuple(example_inputs)), path)
