"""Restore: resolve the key, then fetch, verify and place every file.

Guarantees:
- Nothing is written outside the roots: manifest paths must pass
  ``keys.check_relpath`` (else the whole manifest is refused), and no folder
  between a root and a file may be a symlink.
- Every file is verified (sha256 of the decoded bytes, or for a large zstd
  blob the sha256 of the stored bytes the service itself checked, see
  ``transfer.download``) in a temp file beside its target and renamed into place: no reader sees half a file, and an
  interrupted restore leaves only whole files (plus ``.cachesvc-<pid>-*.tmp``
  leftovers, which publish ignores and the next restore removes once their
  process is gone).
- Small blobs may lie in packs (``cachesvc_client.packing``): a pack is read
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

A fallback restore (``fallbacks=``, see ``cachesvc.fallback``) may list one
path twice when it unions several versions: the same content is placed
once; different content: the first listed wins and the report says so.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from filelock import FileLock, Timeout

from . import keys, packing, roots as roots_mod, transfer
from .errors import CacheClientError, IntegrityError, ServiceUnavailable
from .http import ServiceAPI
from .progress import Progress
from .publish import torch_dir
from .report import RestoreReport

log = logging.getLogger("cachesvc_client")

STATE_DIR = ".cachesvc"


def check_manifest(files: List[dict]) -> None:
    """Refuse a manifest whole if any row breaks the key and path rules."""
    for f in files:
        try:
            keys.check_role(f["root"])
            keys.check_relpath(f["path"])
            keys.check_digest(f["sha256"])
            keys.check_size(f["size"])
        except (keys.InvalidKey, KeyError, TypeError) as exc:
            raise IntegrityError(f"the service sent a manifest that breaks the path rules ({exc}); "
                                 "nothing was restored") from None


def safe_target(root_real: str, relpath: str) -> str:
    """The absolute target of ``relpath`` under ``root_real``; IntegrityError on a symlink or non-folder on the way."""
    parts = relpath.split("/")
    cur = root_real
    for part in parts[:-1]:
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            raise IntegrityError(f"{cur} is a symlink; refusing to write through it")
        if os.path.exists(cur) and not os.path.isdir(cur):
            raise IntegrityError(f"{cur} is not a folder")
    target = os.path.join(cur, parts[-1])
    if os.path.islink(target) or (os.path.exists(target) and not os.path.isfile(target)):
        raise IntegrityError(f"{target} exists and is not a regular file; leaving it alone")
    return target


class _Stamp:
    """Size and mtime of files a restore placed, per version."""

    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, "restored.json")

    def doc(self) -> dict:
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def load(self, version_id) -> Dict[str, Tuple[int, int]]:
        try:
            with open(self.path) as f:
                doc = json.load(f)
            return {k: tuple(v) for k, v in doc["files"].items()} if doc.get("version_id") == version_id else {}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def save(self, version_id, placed: Dict[str, str], extra: Optional[dict] = None) -> None:
        files = {}
        for k, target in placed.items():
            try:
                st = os.stat(target)
                files[k] = (st.st_size, st.st_mtime_ns)
            except OSError:
                pass
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"version_id": version_id, "files": files, **(extra or {})}, f)
            os.replace(tmp, self.path)
        except OSError as exc:  # a full disk: the stamp only saves re-hashing next time
            log.warning("could not record the restored files in %s: %s", self.path, exc)
            if os.path.exists(tmp):
                os.unlink(tmp)


_TEMP = re.compile(r"\.cachesvc-(\d+)-.*\.tmp$")
#: a temp file this old is a leftover even if a process with its pid runs (pids are reused)
STALE_TEMP_SECONDS = 3600


def sweep_temps(folders) -> int:
    """Remove restore temp files left in ``folders`` by restores that were killed; return how many.

    A temp file names its writer's pid; it is left alone while that process runs (and is not
    older than STALE_TEMP_SECONDS), since a restore into another cache dir may share a root."""
    removed = 0
    for folder in folders:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            m = _TEMP.search(name)
            if not m:
                continue
            path = os.path.join(folder, name)
            try:
                alive = int(m.group(1)) == os.getpid() or _running(int(m.group(1)))
                if alive and time.time() - os.lstat(path).st_mtime < STALE_TEMP_SECONDS:
                    continue
                os.unlink(path)
                removed += 1
            except OSError:
                pass
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal: only asks whether the process exists
        return True
    except PermissionError:
        return True  # it exists, as another user
    except ProcessLookupError:
        return False


def _place(tmp: str, targets: List[Tuple[str, int]]) -> None:
    """Rename the verified temp file onto its first target; copy it to the others (making their folders)."""
    first, mode = targets[0]
    for other, other_mode in targets[1:]:
        os.makedirs(os.path.dirname(other), exist_ok=True)
        other_tmp = f"{other}.cachesvc-{os.getpid()}-{threading.get_ident()}.tmp"
        try:
            shutil.copyfile(tmp, other_tmp)
            os.chmod(other_tmp, other_mode)
            os.replace(other_tmp, other)
        finally:
            if os.path.exists(other_tmp):
                os.unlink(other_tmp)
    os.chmod(tmp, mode)
    os.replace(tmp, first)


def stamp_file(cache_dir: str) -> str:
    """``<inductor root>/.cachesvc/restored.json``, where restores into ``cache_dir`` record what they placed."""
    return os.path.join(os.path.realpath(roots_mod.resolve_root("inductor", cache_dir)), STATE_DIR, "restored.json")


def load_stamp(cache_dir: str) -> dict:
    """What the last restore into ``cache_dir`` placed: ``{"version_id", "files": {"role/path": [size, mtime_ns]}}``
    and ``RestoreReport.stamp_record()``; ``client.verify()`` adds ``"verdict"`` ({} when none)."""
    return _Stamp(os.path.dirname(stamp_file(cache_dir))).doc()


def dedup_files(files: List[dict]) -> Tuple[List[dict], List[str]]:
    """Keep the first row of each (root, path); return (rows, "root:path" of those listed with other content)."""
    seen: Dict[Tuple[str, str], str] = {}
    out, conflicts = [], []
    for f in files:
        where = (f["root"], f["path"])
        if where not in seen:
            seen[where] = f["sha256"]
            out.append(f)
        elif seen[where] != f["sha256"] and f"{f['root']}:{f['path']}" not in conflicts:
            conflicts.append(f"{f['root']}:{f['path']}")
    return out, conflicts


def restore(api: ServiceAPI, key: dict, cache_dir: str, *, workers: int = 16, timeout: float = 30.0,
            stall_timeout: float = 30.0, budget: Optional[float] = None, fallbacks: Sequence[str] = (),
            fallback_max_bytes: Optional[int] = None) -> RestoreReport:
    """Restore the newest version of ``key`` into this process's roots. See the module docstring.

    ``budget``: seconds the whole restore may take (waiting for another rank's
    lock included); transfers still running then are cut off and their files
    left out (reported in ``failed``). None: no limit beyond the timeouts.
    Raises CacheClientError subclasses on service or storage trouble; the
    caller (CacheClient.restore) turns them into a miss unless strict.
    """
    start = time.monotonic()
    deadline = None if budget is None else start + budget
    lock_timeout = 600.0 if budget is None else budget
    report = RestoreReport.for_key(key, started_at=time.time())
    answer = api.resolve(key, deadline=min(start + timeout, deadline or float("inf")), fallbacks=fallbacks,
                         fallback_max_bytes=fallback_max_bytes)
    if not answer.get("hit"):
        report.reason = answer.get("reason", "no match")
        report.nearest = answer.get("nearest", [])
        report.seconds = time.monotonic() - start
        return report
    files, blobs, version = answer["files"], answer["blobs"], answer["version"]
    check_manifest(files)
    report.version_id, report.entry_id = version["id"], answer["entry"]["id"]
    report.versions = [version["id"]]
    if answer.get("fallback"):
        report.fallback, report.reason = answer["fallback"]["step"], answer.get("reason", "")
        report.versions, report.fallback_entries = answer["fallback"]["versions"], answer["fallback"]["entries"]
        files, conflicts = dedup_files(files)
        if conflicts:
            report.warnings.append(f"{len(conflicts)} path(s) have different content in the fallback versions; "
                                   f"kept version {report.versions[0]}'s first: {conflicts[0]}")
    published_torch = (version.get("meta") or {}).get("torch_dir")
    here = torch_dir()
    if published_torch and here and published_torch != here:
        report.warnings.append(f"torch is installed at {here} here but was at {published_torch} when published: "
                               "Inductor's C++ kernels key on that path and will be rebuilt; install torch at the "
                               "same path in every container")

    local: Dict[str, Optional[str]] = {}
    for role in {f["root"] for f in files}:
        try:
            local[role] = os.path.realpath(roots_mod.resolve_root(role, cache_dir))
        except ValueError:
            local[role] = None  # published by a newer client; this one does not know where it goes
    report.roots = {r: p for r, p in local.items() if p}
    inductor = os.path.realpath(roots_mod.resolve_root("inductor", cache_dir))
    state_dir = os.path.join(inductor, STATE_DIR)
    os.makedirs(state_dir, exist_ok=True)

    try:
        with FileLock(os.path.join(state_dir, "restore.lock"), timeout=max(0.0, lock_timeout - (time.monotonic() - start))):
            _fetch_all(api, report, files, blobs, local, state_dir, workers, stall_timeout, deadline)
    except Timeout:
        raise ServiceUnavailable(f"another process held {state_dir}/restore.lock past the restore's "
                                 f"{lock_timeout:.0f} s") from None
    report.hit = report.files + report.files_present > 0 and len(report.failed) < len(files)
    if not report.hit:
        report.reason = f"no file could be restored: {report.failed[0] if report.failed else 'empty version'}"
    report.seconds = time.monotonic() - start
    return report


def _fetch_all(api: ServiceAPI, report: RestoreReport, files: List[dict], blobs: Dict[str, dict],
               local: Dict[str, Optional[str]], state_dir: str, workers: int, stall_timeout: float,
               deadline: Optional[float]) -> None:
    stamp = _Stamp(state_dir)
    stamp_id = report.version_id if len(report.versions) == 1 else "+".join(map(str, report.versions))
    known = stamp.load(stamp_id)
    wanted: Dict[str, List[Tuple[str, int]]] = {}  # digest -> [(target, mode)]
    placed: Dict[str, str] = {}                    # "role/path" -> target
    for f in files:
        label = f"{f['root']}:{f['path']}"
        root = local[f["root"]]
        if root is None:
            report.failed.append(f"{label}: unknown root role {f['root']!r} (upgrade cachesvc-client)")
            continue
        try:
            target = safe_target(root, f["path"])
        except IntegrityError as exc:
            report.failed.append(f"{label}: {exc.message}")
            continue
        k = f"{f['root']}/{f['path']}"
        try:
            st = os.stat(target)
            if known.get(k) == (st.st_size, st.st_mtime_ns) or transfer.same_file(target, f["size"], f["sha256"]):
                report.files_present += 1
                placed[k] = target
                continue
        except FileNotFoundError:
            pass
        if f["sha256"] not in blobs:
            report.failed.append(f"{label}: the service gave no location for blob {f['sha256'][:12]}")
            continue
        wanted.setdefault(f["sha256"], []).append((target, 0o755 if f["mode"] & 0o111 else 0o644))
        placed[k] = target

    swept = sweep_temps({os.path.dirname(t) for t in placed.values()})
    if swept:
        log.info("removed %d temp file(s) left by an interrupted restore", swept)
    total = sum(blobs[d]["stored_size"] for d in wanted)
    storage_down = threading.Event()

    def twice(what: str, op: Callable[[], object]) -> Tuple[bool, object]:
        """``op()`` tried up to twice: (True, its result) or (False, why it failed). A second failure to
        reach storage marks it down, so the other workers give up instead of waiting out their own."""
        problem = ""
        for attempt in (1, 2):
            if storage_down.is_set():
                return False, "storage unreachable; gave up"
            if deadline is not None and time.monotonic() >= deadline:
                return False, "the restore's time budget ran out"
            try:
                return True, op()
            except ServiceUnavailable as exc:
                problem = exc.message
                if attempt == 2:
                    storage_down.set()
            except (CacheClientError, OSError) as exc:
                problem = getattr(exc, "message", None) or str(exc)
            log.debug("%s: attempt %d failed: %s", what, attempt, problem)
        return False, problem

    def fetch(digest: str) -> Optional[str]:
        """One blob, downloaded, verified and placed at each of its targets. Returns the problem (None: placed)."""
        blob, targets = blobs[digest], wanted[digest]
        url = api.absolute(blob["url"])

        def once() -> None:
            os.makedirs(os.path.dirname(targets[0][0]), exist_ok=True)
            tmp = transfer.download(url, api.auth_headers(url), blob["encoding"], digest, blob["size"],
                                    os.path.dirname(targets[0][0]), stall_timeout,
                                    lambda n: progress.advance(0, n), cutoff, blob.get("stored_sha256"))
            _place(tmp, targets)
            progress.advance(len(targets), 0)

        ok, problem = twice(f"blob {digest[:12]}", once)
        return None if ok else str(problem)

    def fetch_run(pack_url: str, byte_range, members: list) -> Dict[str, Optional[str]]:
        """One GET of a pack (a run of its members, or all of it); each member is verified and placed on
        its own, so a bad member fails only its files. Returns digest -> problem (None: placed)."""
        url = api.absolute(pack_url)
        out: Dict[str, Optional[str]] = {}
        ok, got = twice(f"pack run {byte_range}", lambda: transfer.fetch_bytes(
            url, api.auth_headers(url), byte_range, stall_timeout, lambda n: progress.advance(0, n), cutoff,
            what=f"pack {members[0][1].get('pack_sha256', '')[:12]}"))
        if not ok:
            return {digest: str(got) for digest, _b in members}
        data, base = got
        view = memoryview(data)
        for digest, b in members:
            targets = wanted[digest]
            lo = b["offset"] - base
            try:
                if lo < 0 or lo + b["stored_size"] > len(data):
                    raise IntegrityError(f"blob {digest[:12]}: its pack slice lies outside the bytes received")
                os.makedirs(os.path.dirname(targets[0][0]), exist_ok=True)
                tmp = transfer.write_member(view[lo:lo + b["stored_size"]], b["encoding"], digest, b["size"],
                                            os.path.dirname(targets[0][0]))
                _place(tmp, targets)
                progress.advance(len(targets), 0)
                out[digest] = None
            except (CacheClientError, OSError) as exc:
                out[digest] = getattr(exc, "message", None) or str(exc)
        return out

    # Packed blobs: grouped by pack, read in runs (cachesvc_client.packing); the rest one GET each.
    by_pack: Dict[str, list] = {}
    for d in wanted:
        if blobs[d].get("pack"):
            by_pack.setdefault(blobs[d]["pack_sha256"], []).append((d, blobs[d]))
    jobs = [(members[0][1]["pack"], rng, run) for members in by_pack.values()
            for rng, run in packing.runs(members, members[0][1].get("pack_size"))]
    loose = [d for d in wanted if not blobs[d].get("pack")]

    nfiles = sum(len(t) for t in wanted.values())
    with Progress(f"restore {report.name}", nfiles, total, log) as progress, transfer.Cutoff(deadline) as cutoff:
        # Largest first: a restore's critical path is its biggest blob (a 150 MB
        # precompiled header on CPU); started at once, the small ones (and the
        # pack runs) fill the other workers around it instead of delaying it.
        order = sorted(loose, key=lambda d: blobs[d]["size"], reverse=True)
        problems: Dict[str, Optional[str]] = {}
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            loose_done = pool.map(fetch, order)
            runs_done = pool.map(lambda job: fetch_run(*job), jobs)
            problems.update(zip(order, loose_done))
            for got in runs_done:
                problems.update(got)
        missing = set()
        for digest, problem in problems.items():
            targets = wanted[digest]
            if problem is None:
                report.files += len(targets)
                report.bytes += blobs[digest]["stored_size"]
                report.bytes_written += blobs[digest]["size"] * len(targets)
            else:
                for t, _ in targets:
                    report.failed.append(f"{t}: {problem}")
                    missing.add(t)
    stamp.save(stamp_id, {k: t for k, t in placed.items() if t not in missing},
               report.stamp_record())
