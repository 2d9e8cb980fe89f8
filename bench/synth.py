"""Synthetic Inductor-shaped cache folders with realistic compressibility (deterministic per seed).

Shapes follow real caches: many small generated sources (.py/.cpp, text,
~4-5x under zstd), compiled kernels (.so / cubin, ~3x), pickled graph
entries (~3x), a few multi-MB artifacts and one precompiled header (~7x,
like the 150 MB cpp_prefix.h.gch that every CPU cache holds).
"""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Dict, List, Tuple

#: (subdir template, suffix, count, min KB, max KB, incompressible fraction)
SMALL: List[Tuple[str, str, int, float, float, float]] = [
    # modelled on the mlp cache this repo's demo produces (19 files + headers)
    ("{h2}", ".cpp", 7, 0.15, 4.5, 0.10),
    ("{h2}", ".so", 7, 17, 52, 0.25),
    ("{h2}", ".py", 2, 4, 8, 0.12),
    ("fxgraph/{h2}/{h}", "", 2, 60, 90, 0.25),
    ("aotautograd/{h}", "", 2, 60, 80, 0.25),
    ("pch:", ".h", 1, 0.04, 0.05, 0.5),
    ("pch:", ".h.gch", 1, 152_000, 152_000, 0.06),
]

LARGE: List[Tuple[str, str, int, float, float, float]] = [
    ("{h2}", ".py", 1300, 2, 30, 0.14),
    ("{h2}", ".cpp", 500, 1, 20, 0.12),
    ("{h2}", ".so", 500, 20, 200, 0.25),
    ("fxgraph/{h2}/{h}", "", 350, 20, 300, 0.25),
    ("aotautograd/{h}", "", 150, 20, 200, 0.25),
    ("triton/0/{h}", ".cubin", 150, 10, 500, 0.30),
    ("triton/0/{h}", ".json", 150, 1, 4, 0.15),
    ("{h2}", ".kernel.bin", 10, 4_000, 24_000, 0.30),
    ("pch:", ".h.gch", 1, 152_000, 152_000, 0.06),
]

SHAPES = {"small": SMALL, "large": LARGE}


def _content(rng: random.Random, size: int, incompressible: float) -> bytes:
    """``size`` bytes: random runs (incompressible) between runs drawn from a small token vocabulary."""
    vocab = [rng.randbytes(12) for _ in range(48)]
    out = bytearray()
    while len(out) < size:
        n = rng.randint(256, 4096)
        if rng.random() < incompressible:
            out += rng.randbytes(n)
        else:
            out += b"".join(rng.choices(vocab, k=n // 12))
    return bytes(out[:size])


def make(dest: Path, shape: str, seed: int = 0) -> Dict[str, Dict[str, str]]:
    """Fill ``dest/inductor`` (and ``dest/pch``) with the ``shape`` cache; return the roots and totals."""
    rng = random.Random(f"{shape}-{seed}")
    roots = {"inductor": dest / "inductor", "pch": dest / "pch"}
    files = size = 0
    for tmpl, suffix, count, lo, hi, incompressible in SHAPES[shape]:
        for _ in range(count):
            h = "c" + "".join(rng.choices("abcdefghijklmnopqrstuvwxyz234567", k=51))
            if tmpl.startswith("pch:"):
                path = roots["pch"] / f"{h}{suffix}"
            else:
                path = roots["inductor"] / tmpl.format(h2=h[1:3], h=h) / f"{h}{suffix}"
            n = int(rng.uniform(lo, hi) * 1024)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_content(rng, n, incompressible))
            if suffix == ".so":
                os.chmod(path, 0o755)
            files += 1
            size += n
    return {"roots": {k: str(v) for k, v in roots.items()}, "files": files, "bytes": size}
