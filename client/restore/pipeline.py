"""The restore of any kind, as three steps: plan -> fetch -> place.

    run(api, key, kind=, accept=, ...)       resolve; on a hit, ``accept`` makes the kind's Plan; then
                                             fetch_into under the Plan's lock; returns (report, plan)
    fetch_into(api, report, plan, blobs=)    plan the targets, fetch and place them, record the stamp
    refusal(trust, key, kind, answer)        why a hit must not be placed under the trusted keys ("": it may)
    age(plan, written)                       old mtimes for what was written into extra roots (ninja)

Every kind goes through here: the directory snapshot (``snapshot.restore``)
and the one-file kinds (``restore.onefile.fetch``) differ only in
their ``accept`` (which files, which folders) and in what they call a hit.
The whole of it, resolve and the wait for another rank's lock included, runs
under one ``Deadline`` (the budget). The signature check sits here for the same
reason: every kind (the one call's precompiled package too) passes it before
its plan is made.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

from ..process import roots as roots_mod
from ..shared import signing
from ..report import RestoreReport
from ..transport.api import ServiceAPI
from ..transport.deadlines import Deadline
from .fetch import Fetcher
from .place import Stamp, locked, sweep_temps
from .plan import Plan, targets

log = logging.getLogger("cachesvc_client")

#: a kind's step from a hit's answer to its plan: fills the report from the answer, returns the Plan
Accept = Callable[[RestoreReport, dict], Plan]


def run(api: ServiceAPI, key: dict, *, kind: str, accept: Accept, workers: int, timeout: float,
        stall_timeout: float, budget: Optional[float], fallbacks: Sequence[str] = (),
        fallback_max_bytes: Optional[int] = None,
        trust: Optional[signing.Trust] = None) -> Tuple[RestoreReport, Optional[Plan]]:
    """Resolve ``key`` (a version of ``kind``) and restore what the answer lists; (report, its plan: None on a miss).

    ``budget``: seconds the whole restore may take (None: no limit beyond the timeouts); ``timeout``
    bounds the resolve. ``trust`` (``$CACHESVC_TRUSTED_KEYS``): a version not signed by one of its keys
    over exactly the listed files and this key is a miss before anything is planned or written
    (``refusal``), and every blob is then verified by its decoded sha256 (the signed digest), not by the
    service's word on its stored bytes. The report's ``hit`` is left to the caller (each kind has its rule). Raises
    CacheClientError subclasses on service or storage trouble (MalformedAnswer for an answer that breaks
    its shape); no temp file of this restore remains when it returns, by any path.
    """
    start = time.monotonic()
    report = RestoreReport.for_key(key, started_at=time.time(), kind=kind)
    plan = None
    with Deadline(None if budget is None else start + budget) as deadline:
        answer = api.resolve(key, deadline=deadline.bound(timeout), fallbacks=fallbacks,
                             fallback_max_bytes=fallback_max_bytes, kind=kind)
        refused = refusal(trust, key, kind, answer)
        if not answer["hit"]:
            report.reason, report.nearest = answer["reason"], answer["nearest"]
        elif refused:
            report.signed_by = signing.describe(answer["version"]["signature"]) or {}
            report.reason, report.refused = f"signature refused: {refused}", True
            log.warning("cachesvc restore of %s: not placing version %s: %s", key["name"], answer["version"]["id"],
                        refused)
        else:
            report.signed_by = signing.describe(answer["version"]["signature"]) or {}
            plan = accept(report, answer)
            blobs = answer["blobs"] if trust is None else {  # stored_sha256 is the service's word, not the signer's
                d: {k: v for k, v in b.items() if k != "stored_sha256"} for d, b in answer["blobs"].items()}
            with locked(plan.lock, deadline):
                fetch_into(api, report, plan, blobs=blobs, workers=workers, stall_timeout=stall_timeout,
                           deadline=deadline)
    report.seconds = time.monotonic() - start
    return report, plan


def refusal(trust: Optional[signing.Trust], key: dict, kind: str, answer: dict) -> str:
    """Why a hit's answer must not be placed under ``trust`` ("" when it may, or when nothing is trusted).
    A fallback's answer lists other keys' files (the union of several versions): never one signed manifest
    of this key, so it is refused."""
    if trust is None or not answer["hit"]:
        return ""
    if answer["fallback"]:
        return (f"the answer is the '{answer['fallback']['step']}' fallback (versions of other keys); with "
                f"trusted keys only this key's own signed version is placed")
    return trust.problem(key, kind, answer["files"], answer["version"]["signature"])


#: the mtime of files a restore writes into extra roots: 2000-01-01 UTC (not 0, which ninja takes for "missing")
LONG_AGO = 946684800


def age(plan: Plan, written) -> None:
    """Give the files this restore wrote into ``plan.aged`` roots (the extra roots) an old mtime.

    Build tools there decide by mtime: a torch C++ extension's (and FlashInfer's) ninja rebuilds an
    output whose inputs are newer than the build log recorded, and every restored file is newer than
    that. Dated before any build, the restored sources are older than the outputs ninja logged, and a
    load finds nothing to do (``tests/client/test_extra_roots.py``). A source the process changes gets
    a new mtime, and rebuilds, as it should."""
    folders = [plan.local[r] for r in plan.aged if plan.local.get(r)]
    for target in written if folders else ():
        if any(roots_mod.inside(target, folder) for folder in folders):
            try:
                os.utime(target, (LONG_AGO, LONG_AGO))
            except OSError:
                pass  # gone or not ours: the build tool rebuilds it, as without a restore


def fetch_into(api: ServiceAPI, report: RestoreReport, plan: Plan, *, blobs: Dict[str, dict], workers: int,
               stall_timeout: float, deadline: Deadline) -> None:
    """Bring ``plan``'s files into their folders (files present with the right content stay), counting into
    ``report``; record what was placed in the plan's stamp. Call it holding the plan's lock."""
    stamp = Stamp(plan.state_dir)
    stamp_id = report.version_id if len(report.versions) == 1 else "+".join(map(str, report.versions))
    wanted, placed = targets(report, plan, blobs, known=stamp.load(stamp_id))
    swept = sweep_temps({os.path.dirname(t) for t in placed.values()})
    if swept:
        log.info("removed %d temp file(s) left by an interrupted restore", swept)
    fetcher = Fetcher(api, blobs, wanted, stall_timeout=stall_timeout, deadline=deadline)
    missing = set()
    for digest, problem in fetcher.fetch_all(report.name, workers).items():
        where = wanted[digest]
        if problem is None:
            report.files += len(where)
            report.bytes += blobs[digest]["stored_size"]
            report.bytes_written += blobs[digest]["size"] * len(where)
        else:
            for t, _ in where:
                report.failed.append(f"{t}: {problem}")
                missing.add(t)
    age(plan, [t for where in wanted.values() for t, _ in where if t not in missing])
    digests = {f"{f['root']}/{f['path']}": f["sha256"] for f in plan.files}
    stamp.save(stamp_id, {k: t for k, t in placed.items() if t not in missing}, digests, report.stamp_record())
