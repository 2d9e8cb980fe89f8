"""Triton's driver helper module: publish it from the process that compiled, too.

Triton builds its driver's C helpers (``cuda_utils<EXT_SUFFIX>``, ``hip_utils`` on ROCm; ~32 KB)
with the C compiler the first time a process starts the GPU driver, into
``<Triton cache dir>/<key>/`` (the key hashes the helper's C source and the platform:
``triton.runtime.build.compile_module_from_src``). Every process starts the driver before Inductor
points ``TRITON_CACHE_DIR`` at ``<inductor cache dir>/triton/<device>``, so the helper lives in
Triton's own dir, ``~/.triton/cache`` (or ``$TRITON_HOME/.triton/cache``): the compiling process
and the one that loads the model from the cache both load it from there (on an H200, read from
each process's ``/proc/self/maps`` after its first call).

By the time the compiling process publishes, Inductor has set ``TRITON_CACHE_DIR``, so its roots
(``roots.default_roots``) leave Triton's own dir out, and its snapshot lacked the helper: every
restore of it built the helper again (0.3-3.2 s on an H200). ``add``
lists the helpers this process loaded (``/proc/self/maps``) that no root covers, under a
``triton`` root for Triton's own dir.

Stdlib only. Linux only (elsewhere, and on the CPU, it finds nothing and adds nothing).
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple

from . import roots as roots_mod
from ..codec.encoding import file_sha256

#: file names of Triton's driver helpers (cuda_utils.cpython-312-x86_64-linux-gnu.so, hip_utils...)
HELPER = re.compile(r"^(?:cuda|hip)_utils\.[^/]*so$")


def loaded(maps: Optional[str] = None) -> List[str]:
    """The driver helper files this process has loaded and that still exist, from ``/proc/self/maps``
    (or the ``maps`` text given)."""
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return []
    found = set()
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and HELPER.match(os.path.basename(parts[5])) and os.path.isfile(parts[5]):
            found.add(parts[5])
    return sorted(found)


def add(files: List[dict], where: Dict[Tuple[str, str], str], roots: List[roots_mod.Root], *,
        maps: Optional[str] = None) -> List[roots_mod.Root]:
    """List each loaded driver helper that lies in Triton's own dir and in no root, in ``files`` /
    ``where`` (as ``snapshot`` makes them; edited in place), under a ``triton`` root for that dir.
    Returns the roots, with that root added when a helper needed it."""
    own = roots_mod.triton_home_dir()
    helpers = [h for h in loaded(maps) if roots_mod.inside(h, own)
               and not any(roots_mod.inside(h, r.path) for r in roots)]
    if not helpers or any(r.role == "triton" for r in roots):  # a triton root elsewhere: the user set it
        return roots
    for helper in helpers:
        st = os.stat(helper)
        rel = os.path.relpath(helper, own).replace(os.sep, "/")
        files.append({"root": "triton", "path": rel, "sha256": file_sha256(helper), "size": st.st_size,
                      "mode": 0o755 if st.st_mode & 0o111 else 0o644})
        where[("triton", rel)] = helper
    return list(roots) + [roots_mod.Root("triton", own)]
