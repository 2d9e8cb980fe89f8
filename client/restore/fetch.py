"""Fetch: the transfers of one restore, every wanted blob fetched, verified and placed, on a thread pool.

``Fetcher.fetch_all`` takes the plan (``plan.targets``: digest -> the targets
that want it) and returns digest -> problem (None: placed). Loose blobs are
one GET each (``download.download``), largest first; packed blobs are read in
runs (``packing.runs``, one GET each: ``transport.blobs.fetch_bytes``), each
member decoded, verified and placed (``place.place``) on its own,
so a bad member fails only its files. Each transfer is tried twice; a second
failure to reach storage marks it down, so the other workers give up
instead of waiting out their own. Every request is cut off at the restore's
``Deadline``.

No temp file outlives a failure: ``download`` and ``write_member`` remove
theirs, and ``place`` removes its own whether the rename succeeds or not.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, NamedTuple, Optional, Tuple

from ..codec import frames, packing
from ..codec.decoding import Decoders
from ..errors import CacheClientError, IntegrityError, ServiceUnavailable
from ..progress import Progress
from ..transport import blobs as transport_blobs
from ..transport.api import ServiceAPI
from ..transport.deadlines import Deadline
from . import download
from .place import place
from .plan import Targets

log = logging.getLogger("cachesvc_client")

#: blobs a restore reports damaged at most (each report makes the service read the blob back)
MAX_DAMAGE_REPORTS = 16


class PackRun(NamedTuple):
    """One GET of a pack: its URL and size, the byte range (None: all of it), and the members it brings."""

    url: str
    size: Optional[int]
    byte_range: Optional[Tuple[int, int]]
    members: list  # [(digest, blob entry)]


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
        self.decoders = Decoders(frames.DECODE_THREADS)  # this restore's zstd contexts and frame pool
        self.damaged: set = set()  # blobs whose bytes failed their sha256 or size (``report_damage``)

    def fetch_all(self, name: str, workers: int) -> Dict[str, Optional[str]]:
        """Fetch every wanted blob; digest -> problem (None: placed at all its targets)."""
        by_pack: Dict[str, list] = {}
        for d in self.wanted:
            if self.blobs[d].get("pack"):
                by_pack.setdefault(self.blobs[d]["pack_sha256"], []).append((d, self.blobs[d]))
        runs = [PackRun(members[0][1]["pack"], members[0][1].get("pack_size"), rng, run) for members in by_pack.values()
                for rng, run in packing.runs(members, members[0][1].get("pack_size"))]
        # Largest first: a restore's critical path is its biggest blob (a 150 MB precompiled header on
        # CPU); started at once, the small ones (and the pack runs) fill the other workers around it.
        loose = sorted((d for d in self.wanted if not self.blobs[d].get("pack")),
                       key=lambda d: self.blobs[d]["size"], reverse=True)
        total = sum(self.blobs[d]["stored_size"] for d in self.wanted)
        nfiles = sum(len(t) for t in self.wanted.values())
        problems: Dict[str, Optional[str]] = {}
        with Progress(f"restore {name}", nfiles, total, log) as self.progress, self.decoders:
            with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                loose_done = pool.map(self.fetch_loose, loose)
                runs_done = pool.map(self.fetch_run, runs)
                problems.update(zip(loose, loose_done))
                for got in runs_done:
                    problems.update(got)
        self.report_damage()
        return problems

    def report_damage(self) -> None:
        """Tell the service which blobs arrived with bytes that fail their sha256, so it checks its stored
        copies and forgets the bad ones (the next publish then uploads them again). Best effort, within the
        restore's deadline: a service that is down, or older than the report, changes nothing here."""
        for digest in sorted(self.damaged)[:MAX_DAMAGE_REPORTS]:
            if self.deadline.expired():  # within the restore's budget, or not at all
                return
            try:
                at = time.monotonic() + self.api.timeout  # one call's time, never past the restore's
                answer = self.api.report_damaged(digest, deadline=min(at, self.deadline.at or at))
                log.info("blob %s reported damaged: the service found it %s", digest[:12], answer.get("status"))
            except (CacheClientError, OSError) as exc:
                log.debug("blob %s: the damage report failed: %s", digest[:12], _message(exc))

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
            try:
                tmp = download.download(self.api.transport, url, self.api.auth_headers(url),
                                        encoding=blob["encoding"], digest=digest, size=blob["size"],
                                        dest_dir=os.path.dirname(targets[0][0]), stall_timeout=self.stall_timeout,
                                        on_bytes=self._advance, deadline=self.deadline,
                                        stored_sha256=blob.get("stored_sha256"), decoders=self.decoders)
            except IntegrityError:
                self.damaged.add(digest)
                raise
            place(tmp, targets)
            self.progress.advance(len(targets), 0)

        ok, problem = self._twice(f"blob {digest[:12]}", once)
        return None if ok else str(problem)

    def fetch_run(self, run: PackRun) -> Dict[str, Optional[str]]:
        """One GET of a pack (a run of its members, or all of it); each member is verified and placed on
        its own, so a bad member fails only its files. Returns digest -> problem (None: placed)."""
        pack_size, byte_range, members = run.size, run.byte_range, run.members
        url = self.api.absolute(run.url)
        what = f"pack {members[0][1]['pack_sha256'][:12]}"
        ok, got = self._twice(f"{what} run {byte_range}", lambda: transport_blobs.fetch_bytes(
            url, self.api.auth_headers(url), byte_range, transport=self.api.transport,
            stall_timeout=self.stall_timeout, on_bytes=self._advance, deadline=self.deadline, what=what,
            pack_size=pack_size))
        if not ok:
            return {digest: str(got) for digest, _b in members}
        data, base = got
        view = memoryview(data)
        return {digest: self._place_member(view, base, digest=digest, b=b) for digest, b in members}

    def _place_member(self, view: memoryview, base: int, *, digest: str, b: dict) -> Optional[str]:
        targets = self.wanted[digest]
        lo = b["offset"] - base
        try:
            if lo < 0 or lo + b["stored_size"] > len(view):
                raise IntegrityError(f"blob {digest[:12]}: its pack slice lies outside the bytes received")
            os.makedirs(os.path.dirname(targets[0][0]), exist_ok=True)
            tmp = download.write_member(view[lo:lo + b["stored_size"]], encoding=b["encoding"], digest=digest,
                                        size=b["size"], dest_dir=os.path.dirname(targets[0][0]),
                                        decoders=self.decoders)
            place(tmp, targets)
        except IntegrityError as exc:
            self.damaged.add(digest)
            return _message(exc)
        except (CacheClientError, OSError) as exc:
            return _message(exc)
        self.progress.advance(len(targets), 0)
        return None
