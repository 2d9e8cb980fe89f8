"""Fetch a one-file kind (mega-cache, aot-function, pt2-package) into the cache dir.

The restore's own steps (``pipeline.run``: plan -> fetch -> place) with this kind's plan: the version's
``artifact`` file, verified by sha256, into

    <inductor cache dir>/.cachesvc/artifacts/<kind>/<version id>/<file>

(``.cachesvc`` is never published). Loading it is ``cachesvc_client.onefile`` (torch); with trusted keys
the signature is checked in ``pipeline.run`` before any byte is placed, as for the snapshot.
"""
from __future__ import annotations

import functools
import os
from typing import Optional

from ..onefile import ROLE
from ..process import roots as roots_mod
from ..report import RestoreReport
from ..shared import signing
from ..transport.api import ServiceAPI
from . import pipeline
from .place import STATE_DIR
from .plan import Plan, check_manifest


def artifact_dir(cache_dir: str, kind: str, version_id: int) -> str:
    inductor = os.path.realpath(roots_mod.resolve_root("inductor", cache_dir))
    return os.path.join(inductor, STATE_DIR, "artifacts", kind, str(version_id))


def fetch(api: ServiceAPI, key: dict, kind: str, *, cache_dir: str, workers: int = 16, timeout: float = 30.0,
          stall_timeout: float = 30.0, budget: Optional[float] = None,
          trust: Optional[signing.Trust] = None) -> RestoreReport:
    """Fetch the newest version of ``kind`` for ``key`` into ``artifact_dir``; the report lists the files.

    The restore's own steps (``restore.pipeline.run``: plan -> fetch -> place), with this kind's plan
    (``_accept``). ``budget``: seconds the whole fetch may take, resolve included, as for the snapshot.
    ``trust``: the signatures required, checked in ``pipeline.run`` as for the snapshot (a precompiled
    package is machine code: the same refusal before any byte is placed).

    Raises CacheClientError subclasses on service or storage trouble (CacheClient.restore turns them
    into a miss unless strict).
    """
    report, plan = pipeline.run(api, key, kind=kind, accept=functools.partial(_accept, kind=kind, cache_dir=cache_dir),
                                workers=workers, timeout=timeout, stall_timeout=stall_timeout, budget=budget,
                                trust=trust)
    if plan is None:
        return report
    dest = plan.local[ROLE]
    mine = [os.path.join(dest, f["path"]) for f in plan.files if f["root"] == ROLE]
    report.hit = bool(mine) and not report.failed
    report.artifacts = mine if report.hit else []
    if not report.hit:
        report.reason = f"the {kind} artifact could not be fetched: {report.failed[0] if report.failed else 'empty'}"
    return report


def _accept(report: RestoreReport, answer: dict, *, kind: str, cache_dir: str) -> Plan:
    """The plan of a one-file kind: its ``artifact`` root's file into ``artifact_dir`` (other roles are left out)."""
    files, version = answer["files"], answer["version"]
    check_manifest(files)
    report.version_id, report.entry_id = version["id"], answer["entry"]["id"]
    report.meta = dict(version["meta"])
    dest = artifact_dir(cache_dir, kind, version["id"])
    os.makedirs(dest, exist_ok=True)
    report.roots = {ROLE: dest}
    local = {f["root"]: (dest if f["root"] == ROLE else None) for f in files}
    local[ROLE] = dest
    return Plan(files, local, dest, f"{dest}.lock")
