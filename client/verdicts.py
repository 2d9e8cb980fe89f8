"""The verdicts of `client.verify()`: after the process compiled, did the restore pay off?

Reads what this process itself recorded, not what the service promised:

* torch's counters (``torch._dynamo.utils.counters``): FX-graph cache hits and
  misses (``inductor.fxgraph_cache_hit/miss``), AOTAutograd cache hits and
  misses (``aot_autograd.autograd_cache_hit/miss``), and Triton kernels
  Inductor asked for (``inductor.async_compile_cache_miss``);
* the roots on disk: compile artifacts written since the restore began that
  the restore did not place (its stamp, ``restored.json``, lists those):
  Triton kernels still compiled (new files under a ``triton`` folder or the
  ``triton`` root) and C++ kernels still built (new ``.so`` files elsewhere).

Verdicts: ``paid_off`` (FX-graph hits, no miss), ``partial`` (hits and
misses), ``no_hits`` (files restored, every graph missed: the restore cost
time and saved none), ``nothing_restored`` (the restore missed),
``not_compiled`` (no graph compiled yet: call verify after the first call).
The first three are sent to the service (``POST /api/v1/verdicts``), which
shows versions whose restores get no hits as problems.

The verdict is also added to the restore's record in the cache dir (``restored.json``), which
``cachesvc-client status`` shows.

torch is read from ``sys.modules`` and never imported here.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from filelock import FileLock, Timeout

from .process import roots as roots_mod
from .report import RestoreReport
from .restore.place import load_stamp, stamp_file

REPORTED = ("paid_off", "partial", "no_hits")
#: the counters a verdict recorded in restored.json keeps
_COUNTS = ("fxgraph_hits", "fxgraph_misses", "aotautograd_hits", "aotautograd_misses", "triton_compiles",
           "cpp_builds")
_TRITON_BINARIES = (".cubin", ".hsaco", ".spv")


@dataclass
class Verdict:
    verdict: str
    name: str = ""
    shape: str = ""
    versions: List[int] = field(default_factory=list)
    fallback: str = ""
    fxgraph_hits: int = 0
    fxgraph_misses: int = 0
    aotautograd_hits: int = 0
    aotautograd_misses: int = 0
    triton_kernels: int = 0       # Triton kernels Inductor loaded or compiled in this process
    triton_compiles: int = 0      # new Triton kernel files on disk since the restore
    cpp_builds: int = 0           # new C++ kernel libraries (.so) on disk since the restore
    new_files: Dict[str, int] = field(default_factory=dict)  # role -> files written since the restore
    restored_files: int = 0
    reported: bool = False        # the service recorded it

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        label = f" (fallback '{self.fallback}')" if self.fallback else ""
        return (f"verify {self.name} [{self.shape}]: {self.verdict}{label}: restored {self.restored_files} files "
                f"of version(s) {', '.join(map(str, self.versions)) or '-'}; FX graph {self.fxgraph_hits} hit(s) "
                f"{self.fxgraph_misses} miss(es), AOTAutograd {self.aotautograd_hits} hit(s) "
                f"{self.aotautograd_misses} miss(es); still compiled: {self.triton_compiles} Triton kernel "
                f"file(s), {self.cpp_builds} C++ kernel(s)")


def read_counters() -> Dict[str, int]:
    """This process's cache counters (zeros when torch's dynamo was never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None) or {}
    inductor, aot = counters.get("inductor", {}), counters.get("aot_autograd", {})
    return {"fxgraph_hits": inductor.get("fxgraph_cache_hit", 0), "fxgraph_misses": inductor.get("fxgraph_cache_miss", 0),
            "aotautograd_hits": aot.get("autograd_cache_hit", 0), "aotautograd_misses": aot.get("autograd_cache_miss", 0),
            "triton_kernels": inductor.get("async_compile_cache_miss", 0)}


def new_artifacts(cache_dir: str, since: float, placed: Dict[str, list]) -> Dict[str, List[str]]:
    """role -> relative paths of files in the roots modified at or after ``since`` that the restore did not place."""
    out: Dict[str, List[str]] = {}
    try:
        roots = roots_mod.default_roots(cache_dir)
    except ValueError:  # a bad CACHESVC_EXTRA_ROOTS (the restore said so): judge the built-in roots
        roots = roots_mod.default_roots(cache_dir, {})
    for root in roots:
        for rel, abspath, _size, _mode in roots_mod.walk(root.path, root.exclude):
            if f"{root.role}/{rel}" in placed:
                continue
            try:
                if os.stat(abspath).st_mtime >= since:
                    out.setdefault(root.role, []).append(rel)
            except OSError:
                pass
    return out


def stamped_report(cache_dir: str) -> Optional[RestoreReport]:
    """The last restore into ``cache_dir`` as its record tells it (``restored.json``), or None: how a process
    judges a restore another process did (an init container), with ``client.verify()`` and no report."""
    doc = load_stamp(cache_dir)
    key = doc.get("key") or {}
    if not doc.get("versions") or not key:
        return None
    return RestoreReport(hit=True, name=key.get("name", ""), shape=key.get("shape", ""), versions=doc["versions"],
                         version_id=doc.get("version_id"), fallback=doc.get("fallback") or "",
                         files=doc.get("files_written") or 0, files_present=doc.get("files_present") or 0,
                         started_at=doc.get("restored_at") or 0.0, kind=doc.get("kind") or "inductor-dir")


def judge(report: Optional[RestoreReport], cache_dir: str, counters: Optional[Dict[str, int]] = None) -> Verdict:
    """The verdict for ``report`` (the restore this process did), from ``counters`` (default: this
    process's, ``read_counters()``) and the files in the roots."""
    v = Verdict(verdict="nothing_restored", **(read_counters() if counters is None else counters))
    if report is None or not report.hit:
        if report is not None:
            v.name, v.shape = report.name, report.shape
        return v
    v.name, v.shape, v.versions, v.fallback = report.name, report.shape, list(report.versions), report.fallback
    stamp = load_stamp(cache_dir)
    placed = stamp.get("files", {}) if stamp.get("versions") == report.versions else {}
    v.restored_files = report.files + report.files_present
    for role, rels in new_artifacts(cache_dir, report.started_at, placed).items():
        v.new_files[role] = len(rels)
        for rel in rels:
            in_triton = role == "triton" or rel.startswith("triton/") or "/triton/" in rel
            if in_triton and rel.endswith(_TRITON_BINARIES):  # one binary per compiled kernel
                v.triton_compiles += 1
            elif not in_triton and rel.endswith(".so"):
                v.cpp_builds += 1
    if v.fxgraph_hits + v.fxgraph_misses == 0:
        v.verdict = "not_compiled"
    elif v.fxgraph_misses == 0:
        v.verdict = "paid_off"
    else:
        v.verdict = "partial" if v.fxgraph_hits else "no_hits"
    return v


def record_verdict(cache_dir: str, verdict: Verdict) -> bool:
    """Add ``verdict`` to what the restore into ``cache_dir`` recorded (``restored.json``), when it is about
    that restore's versions, so ``cachesvc-client status`` shows it. Returns whether it was recorded.

    Takes the restore lock for a moment (a restore running then rewrites the record; the verdict is
    left out rather than waited for). Never raises: the record is for people, not for correctness.
    """
    path = stamp_file(cache_dir)
    if not verdict.versions:
        return False
    try:
        with FileLock(os.path.join(os.path.dirname(path), "restore.lock"), timeout=2):
            doc = load_stamp(cache_dir)
            if doc.get("versions") != verdict.versions:
                return False
            doc["verdict"] = {"verdict": verdict.verdict, "at": time.time(), "reported": verdict.reported,
                              **{k: getattr(verdict, k) for k in _COUNTS}}
            tmp = f"{path}.{os.getpid()}.verdict.tmp"
            try:
                with open(tmp, "w") as f:
                    json.dump(doc, f)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    except (OSError, Timeout):
        return False
    return True
