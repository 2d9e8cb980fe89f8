"""The transfers of one restore: every wanted blob fetched, verified and placed, on a thread pool.

``Fetcher.fetch_all`` takes the plan ``restore`` made (digest -> the targets
that want it) and returns digest -> problem (None: placed). Loose blobs are
one GET each (``download.download``), largest first; packed blobs are read in
runs (``packing.runs``), each member decoded, verified and placed on its own,
so a bad member fails only its files. Each transfer is tried twice; a second
failure to reach storage marks it down, so the other workers give up
instead of waiting out their own. Every request is cut off at the restore's
``Deadline``.

No temp file outlives a failure: ``download`` and ``write_member`` remove
theirs, and ``place`` removes its own whether the rename succeeds or not.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Tuple

from . import download, packing
from .deadlines import Deadline
from .errors import CacheClientError, IntegrityError, ServiceUnavailable
from .http import ServiceAPI
from .progress import Progress

log = logging.getLogger("cachesvc_client")

Targets = List[Tuple[str, int]]  # (absolute target path, mode)


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


def _message(exc: BaseException) -> str:
    return getattr(exc, "message", None) or str(exc)


class Fetcher:
    """The transfers of one restore (see the module docstring). ``wanted``: digest -> targets;
    ``blobs``: the resolve answer's blob entries (checked by ``answers``)."""

    def __init__(self, api: ServiceAPI, blobs: Dict[str, dict], wanted: Dict[str, Targets], *,
                 stall_timeout: float, deadline: Deadline):
        self.api, self.blobs, self.wanted = api, blobs, wanted
        self.stall_timeout, self.deadline = stall_timeout, deadline
        self.storage_down = threading.Event()
        self.progress: Optional[Progress] = None

    def fetch_all(self, name: str, workers: int) -> Dict[str, Optional[str]]:
        """Fetch every wanted blob; digest -> problem (None: placed at all its targets)."""
        by_pack: Dict[str, list] = {}
        for d in self.wanted:
            if self.blobs[d].get("pack"):
                by_pack.setdefault(self.blobs[d]["pack_sha256"], []).append((d, self.blobs[d]))
        runs = [(members[0][1]["pack"], members[0][1].get("pack_size"), rng, run) for members in by_pack.values()
                for rng, run in packing.runs(members, members[0][1].get("pack_size"))]
        # Largest first: a restore's critical path is its biggest blob (a 150 MB precompiled header on
        # CPU); started at once, the small ones (and the pack runs) fill the other workers around it.
        loose = sorted((d for d in self.wanted if not self.blobs[d].get("pack")),
                       key=lambda d: self.blobs[d]["size"], reverse=True)
        total = sum(self.blobs[d]["stored_size"] for d in self.wanted)
        nfiles = sum(len(t) for t in self.wanted.values())
        problems: Dict[str, Optional[str]] = {}
        with Progress(f"restore {name}", nfiles, total, log) as self.progress:
            with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                loose_done = pool.map(self.fetch_loose, loose)
                runs_done = pool.map(lambda job: self.fetch_run(*job), runs)
                problems.update(zip(loose, loose_done))
                for got in runs_done:
                    problems.update(got)
        return problems

    def _twice(self, what: str, op: Callable[[], object]) -> Tuple[bool, object]:
        """``op()`` tried up to twice: (True, its result) or (False, why it failed)."""
        problem = ""
        for attempt in (1, 2):
            if self.storage_down.is_set():
                return False, "storage unreachable; gave up"
            if self.deadline.expired():
                return False, f"{self.deadline.what} ran out"
            try:
                return True, op()
            except ServiceUnavailable as exc:
                problem = exc.message
                if attempt == 2:
                    self.storage_down.set()
            except (CacheClientError, OSError) as exc:
                problem = _message(exc)
            log.debug("%s: attempt %d failed: %s", what, attempt, problem)
        return False, problem

    def _advance(self, n: int) -> None:
        self.progress.advance(0, n)

    def fetch_loose(self, digest: str) -> Optional[str]:
        """One blob, downloaded, verified and placed at each of its targets. Returns the problem (None: placed)."""
        blob, targets = self.blobs[digest], self.wanted[digest]
        url = self.api.absolute(blob["url"])

        def once() -> None:
            os.makedirs(os.path.dirname(targets[0][0]), exist_ok=True)
            tmp = download.download(url, self.api.auth_headers(url), blob["encoding"], digest, blob["size"],
                                    os.path.dirname(targets[0][0]), self.stall_timeout, self._advance,
                                    self.deadline, blob.get("stored_sha256"))
            place(tmp, targets)
            self.progress.advance(len(targets), 0)

        ok, problem = self._twice(f"blob {digest[:12]}", once)
        return None if ok else str(problem)

    def fetch_run(self, pack_url: str, pack_size: Optional[int], byte_range, members: list) -> Dict[str, Optional[str]]:
        """One GET of a pack (a run of its members, or all of it); each member is verified and placed on
        its own, so a bad member fails only its files. Returns digest -> problem (None: placed)."""
        url = self.api.absolute(pack_url)
        what = f"pack {members[0][1]['pack_sha256'][:12]}"
        ok, got = self._twice(f"{what} run {byte_range}", lambda: download.fetch_bytes(
            url, self.api.auth_headers(url), byte_range, self.stall_timeout, self._advance, self.deadline,
            what=what, pack_size=pack_size))
        if not ok:
            return {digest: str(got) for digest, _b in members}
        data, base = got
        view = memoryview(data)
        return {digest: self._place_member(view, base, digest, b) for digest, b in members}

    def _place_member(self, view: memoryview, base: int, digest: str, b: dict) -> Optional[str]:
        targets = self.wanted[digest]
        lo = b["offset"] - base
        try:
            if lo < 0 or lo + b["stored_size"] > len(view):
                raise IntegrityError(f"blob {digest[:12]}: its pack slice lies outside the bytes received")
            os.makedirs(os.path.dirname(targets[0][0]), exist_ok=True)
            tmp = download.write_member(view[lo:lo + b["stored_size"]], b["encoding"], digest, b["size"],
                                        os.path.dirname(targets[0][0]))
            place(tmp, targets)
        except (CacheClientError, OSError) as exc:
            return _message(exc)
        self.progress.advance(len(targets), 0)
        return None
