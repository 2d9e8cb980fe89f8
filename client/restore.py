"""Restore: resolve the key, then fetch, verify and place every file.

Guarantees:
- The resolve answer is checked whole before anything is written
  (``answers.resolve``): a malformed one is a miss (MalformedAnswer).
- Nothing is written outside the roots: manifest paths must pass
  ``keys.check_relpath`` and name no path twice or as both file and folder
  (else the whole manifest is refused), and no folder between a root and a
  file may be a symlink.
- Every file is decoded within its declared size (``decoding``) and verified
  (sha256 of the decoded bytes, or for a large zstd blob the sha256 of the
  stored bytes the service itself checked, see ``download.download``) in a
  temp file beside its target and renamed into place: no reader sees half a
  file. No temp file remains when ``restore()`` returns, by any path; a
  restore that is killed leaves only whole files plus
  ``.cachesvc-<pid>-*.tmp`` leftovers, which publish ignores and the next
  restore removes once their process is gone.
- The budget holds whatever the servers do (``deadlines``): transfers still
  running at its end are cut off and their files left out.
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

import contextlib
import json
import logging
import os
import re
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from filelock import FileLock, Timeout

from . import roots as roots_mod, transfer
from .deadlines import Deadline
from .errors import IntegrityError, ServiceUnavailable
from .fetching import Fetcher
from .http import ServiceAPI
from .publish import torch_dir
from .report import RestoreReport

log = logging.getLogger("cachesvc_client")

STATE_DIR = ".cachesvc"


def check_manifest(files: List[dict]) -> None:
    """Refuse a manifest whole when it lists one path twice or a path both as a file and as a folder of
    others (no file system holds both; one of them could only fail at its rename). Its rows were checked
    one by one (``answers.resolve``: types and the path rules)."""
    seen, folders = set(), set()
    for f in files:
        where = (f["root"], f["path"])
        if where in seen:
            _refuse(f"it lists {f['root']}:{f['path']} twice")
        seen.add(where)
        parts = f["path"].split("/")
        folders.update((f["root"], "/".join(parts[:i])) for i in range(1, len(parts)))
    clash = next((w for w in seen if w in folders), None)
    if clash is not None:
        _refuse(f"{clash[0]}:{clash[1]} is listed as a file and as a folder of other files")


def _refuse(why: str) -> None:
    raise IntegrityError(f"the service sent a manifest that breaks the path rules ({why}); nothing was restored")


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


def stamp_file(cache_dir: str) -> str:
    """``<inductor root>/.cachesvc/restored.json``, where restores into ``cache_dir`` record what they placed."""
    return os.path.join(os.path.realpath(roots_mod.resolve_root("inductor", cache_dir)), STATE_DIR, "restored.json")


def load_stamp(cache_dir: str) -> dict:
    """What the last restore into ``cache_dir`` placed: ``{"version_id", "files": {"role/path": [size, mtime_ns]}}``
    and ``RestoreReport.stamp_record()``; ``client.verify()`` adds ``"verdict"`` ({} when none)."""
    return _Stamp(os.path.dirname(stamp_file(cache_dir))).doc()


def dedup_files(files: List[dict]) -> Tuple[List[dict], List[str]]:
    """Keep the first row of each (root, path); return (rows, "root:path" of those listed with other content).

    A row whose path is a folder of a kept file, or lies under one, conflicts with it as well: the
    first listed wins there too."""
    seen: Dict[Tuple[str, str], str] = {}
    folders: set = set()
    out, conflicts = [], []
    for f in files:
        where = (f["root"], f["path"])
        parts = f["path"].split("/")
        above = [(f["root"], "/".join(parts[:i])) for i in range(1, len(parts))]
        if where not in seen and where not in folders and not any(p in seen for p in above):
            seen[where] = f["sha256"]
            folders.update(above)
            out.append(f)
        elif seen.get(where) != f["sha256"] and f"{f['root']}:{f['path']}" not in conflicts:
            conflicts.append(f"{f['root']}:{f['path']}")
    return out, conflicts


def restore(api: ServiceAPI, key: dict, cache_dir: str, *, workers: int = 16, timeout: float = 30.0,
            stall_timeout: float = 30.0, budget: Optional[float] = None, fallbacks: Sequence[str] = (),
            fallback_max_bytes: Optional[int] = None) -> RestoreReport:
    """Restore the newest version of ``key`` into this process's roots. See the module docstring.

    ``budget``: seconds the whole restore may take (resolving and waiting for
    another rank's lock included), whatever the servers do: transfers still
    running then are cut off and their files left out (reported in
    ``failed``). None: no limit beyond the timeouts. ``timeout`` bounds the
    resolve. Raises CacheClientError subclasses on service or storage trouble
    (MalformedAnswer for an answer that breaks its shape); the caller
    (CacheClient.restore) turns them into a miss unless strict. No temp file
    of this restore remains when it returns, by any path.
    """
    start = time.monotonic()
    report = RestoreReport.for_key(key, started_at=time.time())
    with Deadline(None if budget is None else start + budget) as deadline:
        answer = api.resolve(key, deadline=deadline.bound(timeout),
                             fallbacks=fallbacks, fallback_max_bytes=fallback_max_bytes)
        if not answer["hit"]:
            report.reason, report.nearest = answer["reason"], answer["nearest"]
        else:
            files = _accept(report, answer)
            local = local_roots(files, cache_dir)
            report.roots = {r: p for r, p in local.items() if p}
            inductor = os.path.realpath(roots_mod.resolve_root("inductor", cache_dir))
            state_dir = os.path.join(inductor, STATE_DIR)
            os.makedirs(state_dir, exist_ok=True)
            with locked(os.path.join(state_dir, "restore.lock"), deadline):
                fetch_files(api, report, files, answer["blobs"], local, state_dir, workers=workers,
                            stall_timeout=stall_timeout, deadline=deadline)
            report.hit = report.files + report.files_present > 0 and len(report.failed) < len(files)
            if not report.hit:
                report.reason = f"no file could be restored: {report.failed[0] if report.failed else 'empty version'}"
    report.seconds = time.monotonic() - start
    return report


def _accept(report: RestoreReport, answer: dict) -> List[dict]:
    """Fill the report from a hit's answer; return the files to restore (a fallback's union deduplicated)."""
    files, version = answer["files"], answer["version"]
    report.version_id, report.entry_id = version["id"], answer["entry"]["id"]
    report.versions = [version["id"]]
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
    return files


def local_roots(files: List[dict], cache_dir: str) -> Dict[str, Optional[str]]:
    """role -> the real local folder of each root the files name (None: a role this client does not know)."""
    local: Dict[str, Optional[str]] = {}
    for role in {f["root"] for f in files}:
        try:
            local[role] = os.path.realpath(roots_mod.resolve_root(role, cache_dir))
        except ValueError:
            local[role] = None  # published by a newer client; this one does not know where it goes
    return local


@contextlib.contextmanager
def locked(path: str, deadline: Deadline) -> Iterator[None]:
    """Hold the restore lock at ``path``, waiting for it until ``deadline`` (600 s without one). Raises
    ServiceUnavailable when another process holds it that long."""
    wait = 600.0 if deadline.at is None else max(0.0, deadline.left())
    lock = FileLock(path, timeout=wait)
    try:
        lock.acquire()
    except Timeout:
        raise ServiceUnavailable(f"another process held {path} past the restore's {wait:.0f} s") from None
    try:
        yield
    finally:
        lock.release()


def fetch_files(api: ServiceAPI, report: RestoreReport, files: List[dict], blobs: Dict[str, dict],
                local: Dict[str, Optional[str]], state_dir: str, *, workers: int, stall_timeout: float,
                deadline: Deadline) -> None:
    """Bring ``files`` into their ``local`` roots (files present with the right content stay), counting into
    ``report``; record what was placed in ``state_dir``'s stamp. Call it holding the restore lock."""
    stamp = _Stamp(state_dir)
    stamp_id = report.version_id if len(report.versions) == 1 else "+".join(map(str, report.versions))
    wanted, placed = _plan(report, files, blobs, local, stamp.load(stamp_id))
    swept = sweep_temps({os.path.dirname(t) for t in placed.values()})
    if swept:
        log.info("removed %d temp file(s) left by an interrupted restore", swept)
    fetcher = Fetcher(api, blobs, wanted, stall_timeout=stall_timeout, deadline=deadline)
    missing = set()
    for digest, problem in fetcher.fetch_all(report.name, workers).items():
        targets = wanted[digest]
        if problem is None:
            report.files += len(targets)
            report.bytes += blobs[digest]["stored_size"]
            report.bytes_written += blobs[digest]["size"] * len(targets)
        else:
            for t, _ in targets:
                report.failed.append(f"{t}: {problem}")
                missing.add(t)
    stamp.save(stamp_id, {k: t for k, t in placed.items() if t not in missing}, report.stamp_record())


def _plan(report: RestoreReport, files: List[dict], blobs: Dict[str, dict], local: Dict[str, Optional[str]],
          known: Dict[str, Tuple[int, int]]) -> Tuple[Dict[str, list], Dict[str, str]]:
    """(digest -> [(target, mode)] still to fetch, "role/path" -> target of every file to be in place);
    files already in place are counted, files that cannot be placed are reported failed."""
    wanted: Dict[str, list] = {}
    placed: Dict[str, str] = {}
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
    return wanted, placed
