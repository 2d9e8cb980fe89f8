"""Deadlines that hold against servers that trickle or stall.

A read timeout bounds one silent wait, not a request: a server that sends a
byte a second (headers or body) never trips it, and a restore waiting on it
would hold a container start for ever. A ``Deadline`` bounds the whole
request. Inside ``with deadline.guard():`` every socket the calling thread
opens or reuses through a guarded pool (``guard_pools``; every session and
blob pool of ``session`` uses them) is registered; when the deadline passes, one
watchdog thread for the whole process shuts those sockets down under the
threads reading them, which then fail at once (the caller says why:
``Deadline.check``). Sockets leave the registry when the guard exits, so a
connection back in its pool is never cut.

Costs: a thread-local lookup per request and a heap push per deadline; no
thread or timer per request (a timer per blob cost as much as a small GET).

Module state, and why: the watchdog (``_WATCHDOG``) is one thread for the
process, and the deadlines guarding a thread (``_LOCAL``) are found by the
connection itself, because requests and urllib3 give no way to hand a
deadline down to the socket a request will use. Both are registries that
``Deadline`` objects enter and leave; nothing else keeps state here.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import socket
import threading
import time
from typing import Iterator, List, Optional

import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ..errors import ServiceUnavailable

log = logging.getLogger("cachesvc_client")

_LOCAL = threading.local()  # .active: the deadlines guarding this thread's requests, innermost last


class Deadline:
    """A moment (``time.monotonic()``; None: never) past which guarded requests are cut off.

    ``what`` names it in messages ("the restore's time budget"). Thread-safe; use as a context
    manager (``with Deadline(at) as d``) so the watchdog forgets it on the way out.
    """

    def __init__(self, at: Optional[float], what: str = "the restore's time budget"):
        self.at, self.what = at, what
        self._socks: dict = {}  # id -> socket, registered by guarded connections
        self._lock = threading.Lock()
        self.fired = False
        if at is not None:
            _WATCHDOG.schedule(self)

    def __enter__(self) -> "Deadline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop watching (the moment may still be read with ``left``)."""
        with self._lock:
            self._socks.clear()
        _WATCHDOG.forget(self)

    def bound(self, seconds: float) -> float:
        """The sooner of now + ``seconds`` and this deadline (monotonic)."""
        soon = time.monotonic() + seconds
        return soon if self.at is None else min(soon, self.at)

    def left(self) -> float:
        return float("inf") if self.at is None else self.at - time.monotonic()

    def expired(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def check(self, what: str) -> None:
        """Raise ServiceUnavailable ("<what>: <this deadline> ran out") once the moment has passed."""
        if self.fired or self.expired():
            raise ServiceUnavailable(f"{what}: {self.what} ran out", code="deadline")

    @contextlib.contextmanager
    def guard(self) -> Iterator["Deadline"]:
        """Cut the calling thread's requests in this block off at the deadline. Raises ServiceUnavailable
        at once when it has passed already."""
        self.check("not started")  # a request begun after the deadline would be cut at once
        active = getattr(_LOCAL, "active", None)
        if active is None:
            active = _LOCAL.active = []
        mine: List[socket.socket] = []
        active.append((self, mine))
        try:
            yield self
        finally:
            active.pop()
            with self._lock:
                for sock in mine:
                    self._socks.pop(id(sock), None)

    def _register(self, sock: socket.socket, mine: List[socket.socket]) -> None:
        with self._lock:
            fired = self.fired
            if not fired:
                self._socks[id(sock)] = sock
                mine.append(sock)
        if fired:
            _cut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            socks, self._socks = list(self._socks.values()), {}
        for sock in socks:
            _cut(sock)
        if socks:
            log.debug("%s ran out: cut %d transfer(s)", self.what, len(socks))


def _cut(sock: socket.socket) -> None:
    """Wake every thread blocked on ``sock``: shutdown, not close (the owner closes it)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed already, or never connected
        pass


def _register_current(sock: Optional[socket.socket]) -> None:
    if sock is None:
        return
    for deadline, mine in getattr(_LOCAL, "active", None) or ():
        deadline._register(sock, mine)


class _Watchdog:
    """One daemon thread for the process: fires each scheduled Deadline at its moment."""

    def __init__(self):
        self._heap: list = []
        self._live: set = set()
        self._cond = threading.Condition()
        self._order = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def schedule(self, deadline: Deadline) -> None:
        with self._cond:
            self._live.add(id(deadline))
            heapq.heappush(self._heap, (deadline.at, next(self._order), deadline))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cachesvc-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is deadline:
                self._cond.notify()

    def forget(self, deadline: Deadline) -> None:
        with self._cond:
            self._live.discard(id(deadline))

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and id(self._heap[0][2]) not in self._live:
                    heapq.heappop(self._heap)  # closed before its moment
                wait = self._heap[0][0] - time.monotonic() if self._heap else None
                if wait is None or wait > 0:
                    self._cond.wait(wait)
                    continue
                _, _, due = heapq.heappop(self._heap)
                self._live.discard(id(due))
            try:
                due._fire()
            except Exception:  # noqa: BLE001 - the watchdog must outlive any one deadline
                log.exception("cachesvc: cutting off transfers at a deadline failed")


_WATCHDOG = _Watchdog()


# -- guarded connections: register their sockets with the thread's deadlines -----------------------

class _Guarded:
    def connect(self) -> None:
        super().connect()
        _register_current(self.sock)

    def request(self, *args, **kwargs):
        _register_current(self.sock)  # a reused connection (a new one registers in connect)
        return super().request(*args, **kwargs)


class GuardedHTTPConnection(_Guarded, HTTPConnection):
    pass


class GuardedHTTPSConnection(_Guarded, HTTPSConnection):
    pass


class GuardedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = GuardedHTTPConnection


class GuardedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = GuardedHTTPSConnection


def guard_pools(manager: urllib3.PoolManager) -> urllib3.PoolManager:
    """Make ``manager`` (a PoolManager or ProxyManager) open guarded connections; returns it. A manager
    with pools of its own kind (SOCKS) is left as it is: its requests keep their timeouts only."""
    if manager.pool_classes_by_scheme == {"http": HTTPConnectionPool, "https": HTTPSConnectionPool}:
        manager.pool_classes_by_scheme = {"http": GuardedHTTPConnectionPool, "https": GuardedHTTPSConnectionPool}
    return manager


class GuardedAdapter(HTTPAdapter):
    """requests' adapter over guarded pools, so ``Deadline.guard`` holds for requests.Session calls too."""

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        guard_pools(self.poolmanager)

    def proxy_manager_for(self, proxy, **proxy_kwargs):
        return guard_pools(super().proxy_manager_for(proxy, **proxy_kwargs))

