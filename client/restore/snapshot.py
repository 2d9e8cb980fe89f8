"""The directory snapshot's restore (kind inductor-dir): every root's files, into this process's roots.

The steps are ``pipeline.run``'s (plan -> fetch -> place); this module says
which files (a fallback's union deduplicated) and where (the local roots).

Guarantees:
- The resolve answer is checked whole before anything is written
  (``answers.resolve``): a malformed one is a miss (MalformedAnswer).
- Nothing is written outside the roots: manifest paths must pass
  ``keys.check_relpath`` and name no path twice or as both file and folder
  (else the whole manifest is refused), and no folder between a root and a
  file may be a symlink.
- Every file is decoded within its declared size (``decoding``) and verified
  (sha256 of the decoded bytes, or for a large zstd blob the sha256 of the
  stored bytes the service itself checked, see ``restore.download``) in a
  temp file beside its target and renamed into place: no reader sees half a
  file. No temp file remains when ``restore()`` returns, by any path; a
  restore that is killed leaves only whole files plus
  ``.cachesvc-<pid>-*.tmp`` leftovers, which publish ignores and the next
  restore removes once their process is gone.
- The budget holds whatever the servers do (``transport.deadlines``): transfers still
  running at its end are cut off and their files left out.
- Small blobs may lie in packs (``cachesvc_client.codec.packing``): a pack is read
  whole or by ``Range`` runs, and each member is decoded, verified and placed
  on its own, so a bad member fails only its files.
- Files already present with the right content are not fetched again; files
  the restore did not bring are never touched.
- One restore at a time per cache dir (a file lock), so ranks on one host
  share the work: the first restores, the rest find the files present.

State kept in ``<inductor root>/.cachesvc/``: ``restore.lock`` and
``restored.json`` (size and mtime of each file the last restore placed, so
a later restore of the same version skips re-hashing them; which versions
they came from, for ``client.verify()``).

A fallback restore (``fallbacks=``, see ``cachesvc.resolve.fallback``) may list one
path twice when it unions several versions: the same content is placed
once; different content: the first listed wins and the report says so.
"""
from __future__ import annotations

import functools
import os
from typing import Dict, Optional, Sequence

from ..process import roots as roots_mod
from ..process.fingerprint import torch_dir
from ..report import RestoreReport
from ..shared.signing import Trust
from ..transport.api import ServiceAPI
from .pipeline import run
from .place import STATE_DIR
from .plan import Plan, check_manifest, dedup_files, local_roots


def restore(api: ServiceAPI, key: dict, cache_dir: str, *, workers: int = 16, timeout: float = 30.0,
            stall_timeout: float = 30.0, budget: Optional[float] = None, fallbacks: Sequence[str] = (),
            fallback_max_bytes: Optional[int] = None, trust: Optional[Trust] = None,
            extra_roots: Optional[Dict[str, str]] = None) -> RestoreReport:
    """Restore the newest version of ``key`` into this process's roots. See the module docstring.

    ``budget``: seconds the whole restore may take (resolving and waiting for
    another rank's lock included), whatever the servers do: transfers still
    running then are cut off and their files left out (reported in
    ``failed``). None: no limit beyond the timeouts. ``timeout`` bounds the
    resolve. ``trust``: the signatures required (``pipeline.run``). ``extra_roots``: role -> folder of the
    deployment's extra roots (``roots.extra_roots``; None: the setting); their files are written with an
    old mtime (``pipeline.age``). Raises CacheClientError subclasses on service or storage trouble
    (MalformedAnswer for an answer that breaks its shape); the caller
    (CacheClient.restore) turns them into a miss unless strict. No temp file
    of this restore remains when it returns, by any path.
    """
    report, plan = run(api, key, kind="inductor-dir", accept=functools.partial(_accept, cache_dir=cache_dir,
                                                                              extra=extra_roots),
                       workers=workers, timeout=timeout, stall_timeout=stall_timeout, budget=budget,
                       fallbacks=fallbacks, fallback_max_bytes=fallback_max_bytes, trust=trust)
    if plan is not None:
        report.hit = report.files + report.files_present > 0 and len(report.failed) < len(plan.files)
        if not report.hit:
            report.reason = f"no file could be restored: {report.failed[0] if report.failed else 'empty version'}"
    return report


def _accept(report: RestoreReport, answer: dict, *, cache_dir: str, extra: Optional[Dict[str, str]]) -> Plan:
    """Fill the report from a hit's answer; return the plan: the files (a fallback's union deduplicated) into
    the local roots, the stamp and lock in ``<inductor root>/.cachesvc/``."""
    files, version = answer["files"], answer["version"]
    report.version_id, report.entry_id = version["id"], answer["entry"]["id"]
    report.versions = [version["id"]]
    report.meta = dict(version["meta"])  # what the publisher said of it (the one call: why it has no package)
    if answer["fallback"]:
        fallback = answer["fallback"]
        report.fallback, report.reason = fallback["step"], answer["reason"]
        report.versions, report.fallback_entries = fallback["versions"], fallback["entries"]
        files, conflicts = dedup_files(files)
        if conflicts:
            report.warnings.append(f"{len(conflicts)} path(s) have different content in the fallback versions; "
                                   f"kept version {report.versions[0]}'s first: {conflicts[0]}")
    check_manifest(files)
    published_torch = version["meta"].get("torch_dir")
    here = torch_dir()
    if published_torch and here and published_torch != here:
        report.warnings.append(f"torch is installed at {here} here but was at {published_torch} when published: "
                               "Inductor's C++ kernels key on that path and will be rebuilt; install torch at the "
                               "same path in every container")
    local = local_roots(files, cache_dir, extra)
    report.roots = {r: p for r, p in local.items() if p}
    state_dir = os.path.join(os.path.realpath(roots_mod.resolve_root("inductor", cache_dir)), STATE_DIR)
    os.makedirs(state_dir, exist_ok=True)
    return Plan(files, local, state_dir, os.path.join(state_dir, "restore.lock"),
                aged=tuple(sorted(r for r in local if r not in roots_mod.ROLES)))
