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


#: where torch.export's messages name the model's line that failed (strict and non-strict export)
WHERE_MARKERS = ("from user code", "The following call raised this error")


def why_failed(exc: BaseException) -> str:
    """One line for a failed export: the error's type and first line, and where: the model's line
    that failed (the frame torch.export's message names, else the innermost frame of the traceback
    outside torch) or the node a serializer names in its first line."""
    lines = str(exc).strip().splitlines()
    first = lines[0].strip()[:300] if lines else ""
    where = ""
    for i, line in enumerate(lines):
        if any(marker in line for marker in WHERE_MARKERS):
            frames = [(j, x.strip()) for j, x in enumerate(lines[i + 1:], i + 1) if x.strip().startswith("File ")]
            if frames:
                j, frame = frames[-1]
                code = lines[j + 1].strip() if j + 1 < len(lines) else ""
                where = f"{frame[5:]}: {code}" if code and not code.startswith("File ") else frame[5:]
            break
    if not where:
        import traceback

        mine = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in f.filename
                and "/cachesvc_client/" not in f.filename and "/one_call/" not in f.filename]
        if mine:
            where = f'"{mine[-1].filename}", line {mine[-1].lineno}, in {mine[-1].name}: {mine[-1].line or ""}'.rstrip(": ")
    return f"{type(exc).__name__}: {first}" + (f" (at {where[:300]})" if where else "")
