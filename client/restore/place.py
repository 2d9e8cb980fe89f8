"""Place: verified temp files renamed onto their targets, and the record of what a restore placed.

    place(tmp, targets)            rename onto the first target, copy to the others; ``tmp`` gone either way
    locked(path, deadline)         one restore at a time per destination (a file lock), waiting until the deadline
    Stamp(state_dir)               ``restored.json``: size, mtime and sha256 of every file placed, per version
    stamp_file / load_stamp        where a cache dir's record lies, and what it says (``client.verify()``)
    sweep_temps(folders)           temp files left by restores that were killed

No reader ever sees half a file: every file arrives as a verified temp file
beside its target (``download``) and is renamed into place here.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
from typing import Dict, Iterator, Optional, Tuple

from filelock import FileLock, Timeout

from ..process import roots as roots_mod
from ..errors import ServiceUnavailable
from ..transport.deadlines import Deadline
from .plan import Targets

log = logging.getLogger("cachesvc_client")

#: the client's state folder in the inductor root (never published: ``roots.is_junk``)
STATE_DIR = ".cachesvc"


def place(tmp: str, targets: Targets) -> None:
    """Rename the verified temp file onto its first target; copy it to the others (making their folders).
    Raises OSError (a full disk, a folder where the file belongs); ``tmp`` and the copies' temp files are
    gone either way."""
    try:
        first, mode = targets[0]
        for other, other_mode in targets[1:]:
            os.makedirs(os.path.dirname(other), exist_ok=True)
            other_tmp = f"{other}.cachesvc-{os.getpid()}-{threading.get_ident()}.tmp"
            try:
                shutil.copyfile(tmp, other_tmp)
                os.chmod(other_tmp, other_mode)
                os.replace(other_tmp, other)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(other_tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, first)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # still there only when something above failed



class Stamp:
    """Size, mtime and sha256 of files a restore placed, per version.

    The digest is part of what a later restore trusts without hashing: version ids are one service's
    numbering, and a cache dir can outlive a service (another one, or the same one with a new database,
    numbers its first versions 1, 2, ... again). With size and mtime alone, a file of the same size that
    another service's same-numbered version placed was kept (a one-call restart then ran a package
    published for other weights)."""

    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, "restored.json")

    def doc(self) -> dict:
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def load(self, version_id) -> Dict[str, Tuple[int, int, str]]:
        try:
            with open(self.path) as f:
                doc = json.load(f)
            return {k: tuple(v) for k, v in doc["files"].items()} if doc.get("version_id") == version_id else {}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def save(self, version_id, placed: Dict[str, str], digests: Dict[str, str],
             extra: Optional[dict] = None) -> None:
        """Record ``placed`` ("role/path" -> target), each with the sha256 the version gave it (``digests``)."""
        files = {}
        for k, target in placed.items():
            try:
                st = os.stat(target)
                files[k] = (st.st_size, st.st_mtime_ns, digests[k])
            except (OSError, KeyError):
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
    return Stamp(os.path.dirname(stamp_file(cache_dir))).doc()


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
