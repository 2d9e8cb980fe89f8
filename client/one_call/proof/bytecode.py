"""Why the proof's imports can be slow: a torch installed without bytecode caches.

The proof imports Dynamo (check.py), about 1.2 s on an H100 host with torch's ``__pycache__`` folders in
place. An image that removed them, or that never wrote them (``PYTHONDONTWRITEBYTECODE=1`` at install,
a read-only site-packages), compiles every module from source in every process: 5.4-6.2 s for the same
import there, and ``import torch`` itself 3.7-5.0 s instead of 1.4-1.6 s (docs/benchmarks.md, section 10).
Nothing here can fix that at run time; the log line says what to change in the image, once per process.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import sys
from typing import Optional

log = logging.getLogger("cachesvc_client")
#: an import of Dynamo slower than this is worth a look at the bytecode caches (1.0-1.2 s with them)
SLOW_IMPORT_S = 2.0
_warned = False


def missing(package_file: str, module: str = "_dynamo/guards.py") -> Optional[str]:
    """Why ``module`` (a path under the package whose ``__init__`` is ``package_file``) has no bytecode
    cache, or None when it has one (or the source is not there: a zipped or frozen install)."""
    source = os.path.join(os.path.dirname(package_file), *module.split("/"))
    if not os.path.isfile(source):
        return None
    try:
        cached = importlib.util.cache_from_source(source)  # sys.pycache_prefix's place when it is set
    except (NotImplementedError, ValueError):
        return None
    if os.path.isfile(cached):
        return None
    why = f"{source} has no bytecode cache ({cached})"
    if sys.dont_write_bytecode:
        why += "; PYTHONDONTWRITEBYTECODE is set, so no process writes one"
    return why


def warn_if_slow(import_seconds: float) -> None:
    """Log once when Dynamo's import took long and torch's modules have no bytecode caches."""
    global _warned
    if _warned or import_seconds < SLOW_IMPORT_S:
        return
    torch = sys.modules.get("torch")
    why = missing(getattr(torch, "__file__", "") or "") if torch is not None else None
    if why is None:
        return
    _warned = True
    log.warning("cachesvc compile: the proof's import of Dynamo took %.1f s: %s. Every process compiles torch "
                "from source: run `python -m compileall -q` over the image's site-packages when it is built (and keep "
                "its __pycache__ folders) to cut torch's imports several times over", import_seconds, why)
