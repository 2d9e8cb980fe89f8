"""Plan: what a resolve answer asks to restore, where each file goes, and what is already in place.

    check_manifest(files)                refuse a manifest that names a path twice, or as file and folder
    dedup_files(files)                   a fallback's union: the first row of each path wins
    local_roots(files, cache_dir)        role -> the real local folder of each root the files name
    safe_target(root, relpath)           the target of one file; never through a symlink
    Plan                                 one version's files and their destination (chosen by its kind)
    targets(report, plan, blobs, known)  digest -> the targets still to fetch, and every file's target

Nothing is written here: the plan is made before the restore lock's work begins
(``fetch``), and what it finds in place is counted, not fetched again.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Optional, Tuple

from ..process import roots as roots_mod
from ..codec.encoding import same_file
from ..errors import IntegrityError
from ..report import RestoreReport


@dataclasses.dataclass
class Plan:
    """One version's files to restore, and where they go: made by the kind's ``accept`` (``pipeline.run``).

    ``local``: role -> the real local folder (None: a role this client does not know). ``state_dir``:
    where ``restored.json`` records what was placed. ``lock``: the file lock held while placing.
    """

    files: List[dict]
    local: Dict[str, Optional[str]]
    state_dir: str
    lock: str
    #: roles whose files are written with an old mtime (``pipeline.age``): the extra roots
    aged: Tuple[str, ...] = ()


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


def local_roots(files: List[dict], cache_dir: str, extra: Optional[Dict[str, str]] = None) -> Dict[str, Optional[str]]:
    """role -> the real local folder of each root the files name (None: a role this client does not know).
    ``extra``: the extra roots (``roots.extra_roots``; None: the setting)."""
    local: Dict[str, Optional[str]] = {}
    extra = roots_mod.extra_roots() if extra is None else extra
    for role in {f["root"] for f in files}:
        try:
            local[role] = os.path.realpath(roots_mod.resolve_root(role, cache_dir, extra))
        except ValueError:
            local[role] = None  # published by a newer client; this one does not know where it goes
    return local


#: (absolute target path, mode) of one file a blob is placed at
Targets = List[Tuple[str, int]]


def targets(report: RestoreReport, plan: Plan, blobs: Dict[str, dict], *,
            known: Dict[str, Tuple[int, int, str]]) -> Tuple[Dict[str, Targets], Dict[str, str]]:
    """(digest -> [(target, mode)] still to fetch, "role/path" -> target of every file to be in place);
    files already in place are counted, files that cannot be placed are reported failed."""
    wanted: Dict[str, Targets] = {}
    placed: Dict[str, str] = {}
    for f in plan.files:
        label = f"{f['root']}:{f['path']}"
        root = plan.local[f["root"]]
        if root is None:
            report.failed.append(f"{label}: unknown root role {f['root']!r} (name it in "
                                 f"{roots_mod.EXTRA_ROOTS_VAR}=role=/folder, or upgrade cachesvc-client)")
            continue
        try:
            target = safe_target(root, f["path"])
        except IntegrityError as exc:
            report.failed.append(f"{label}: {exc.message}")
            continue
        k = f"{f['root']}/{f['path']}"
        try:
            st = os.stat(target)
            if known.get(k) == (st.st_size, st.st_mtime_ns, f["sha256"]) or same_file(target, f["size"], f["sha256"]):
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
