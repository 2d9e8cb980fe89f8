"""What the one call's per-call check that a hit still runs on the model's tensors costs (one_call/binding.py).

    python bench/probes/binding_check.py [--out bench/results/binding-check-cpu.json]

``Binding.changed()`` runs before every call a package serves: one ``dict.get`` per parameter and buffer
slot (a tensor written straight into ``_parameters``/``_buffers`` is another object there) and one
``data_ptr()`` per bound tensor (``.data =`` swaps the storage). Timed on harness/models.py's mlp and on a
stack of 160 Linear layers (320 tensors, a transformer's count at these sizes), against the storage
pointers alone (what the check cost before it looked at the slots). Where torch has its C++ comparison of
storage pointers (CUDA builds), the check is also timed with the Python loop. Median of 7 repeats of 2,000 calls.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def per_call_us(fn, number: int = 2000, repeat: int = 7) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import torch

    from cachesvc_client.one_call.binding import Binding
    from harness.models import build

    torch.set_num_threads(1)
    models = {"mlp": build("mlp")[0], "linear160": torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(160)])}
    rows = []
    for name, model in models.items():
        binding = Binding(model)
        assert binding.changed() is None
        objects, data_ptr = binding._tensors, torch.Tensor.data_ptr
        row = {"model": name, "tensors": len(objects), "check_us": round(per_call_us(binding.changed), 2),
               "storage_pointers_only_us": round(per_call_us(lambda: list(map(data_ptr, objects))), 2),
               "torch_pointer_check": binding._ptrs_equal is not None}
        if binding._ptrs_equal is not None:  # the same check with the Python loop (a CPU build's)
            binding._ptrs_equal = None
            row["check_python_loop_us"] = round(per_call_us(binding.changed), 2)
        rows.append(row)
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
