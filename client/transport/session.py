"""The one place the client's HTTP connections are made: sessions, blob pools, connect rules, bounded reads.

    Transport(pool)              one client's connections: ``session`` (API calls, uploads) and
                                 ``blob_pool(url)`` (blob GETs), every socket guarded by ``deadlines``
    new_session(pool, token)     a guarded requests.Session, no retries of its own (the remote cache's)
    connect_failed(exc)          whether a requests failure means no connection was made
    read_bounded(resp, limit)    a body read no further than ``limit`` bytes
    CONNECT_TIMEOUT              seconds all attempts to connect to the service may take

Retries are the caller's: an API call retries until its deadline (``api``), a blob transfer
twice (``restore.fetch``), an upload on 5xx (``publish``), a remote-cache call never
(``remote``), because each has its own budget. What they share lives here.
"""
from __future__ import annotations

import os
import threading
from typing import Dict, Optional

import requests
import urllib3

from .. import __version__
from .deadlines import GuardedAdapter, guard_pools

#: seconds all attempts to connect to the service may take before it counts as down
CONNECT_TIMEOUT = 1.5
USER_AGENT = f"cachesvc-client/{__version__}"
CHUNK = 1 << 20


def new_session(pool: int, token: Optional[str] = None) -> requests.Session:
    """A requests.Session of guarded connections (``pool`` per host), no retries of its own (the callers
    retry, each within its own budget), the bearer ``token`` on every request."""
    session = requests.Session()
    adapter = GuardedAdapter(pool_connections=pool, pool_maxsize=pool, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers["User-Agent"] = USER_AGENT
    if token:
        session.headers["Authorization"] = f"Bearer {token}"
    return session


class Transport:
    """One client's HTTP connections: a requests.Session for JSON calls and uploads, urllib3 pools for blob GETs.

    Thread-safe. Every connection is guarded (``deadlines``), so ``Deadline.guard`` cuts off whatever
    runs through it.
    """

    def __init__(self, pool: int = 32):
        self.session = new_session(pool)
        self._pools: Dict[Optional[str], urllib3.PoolManager] = {}
        self._lock = threading.Lock()

    def blob_pool(self, url: str) -> urllib3.PoolManager:
        """The urllib3 pool for blob GETs to ``url`` (one per proxy setting).

        Blob downloads bypass requests.Session: its per-request work (settings
        merge, hooks, cookies, prepare) cost ~0.8 ms of CPU per GET against
        ~0.3 ms for urllib3 alone, which is most of a restore of thousands of
        small files on a small machine. What requests would take from the
        environment is kept: proxies (HTTP(S)_PROXY, NO_PROXY) and the CA bundle
        (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, else certifi's).
        """
        proxy = requests.utils.get_environ_proxies(url).get(url.split(":", 1)[0])
        pool = self._pools.get(proxy)
        if pool is None:
            with self._lock:
                pool = self._pools.get(proxy)
                if pool is None:
                    pool = self._pools[proxy] = _blob_pool(proxy)
        return pool


def _blob_pool(proxy: Optional[str]) -> urllib3.PoolManager:
    kw = dict(num_pools=16, maxsize=32, retries=False, cert_reqs="CERT_REQUIRED",
              ca_certs=(os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
                        or requests.certs.where()),
              headers={"User-Agent": USER_AGENT})
    return guard_pools(urllib3.ProxyManager(proxy, **kw) if proxy else urllib3.PoolManager(**kw))


def connect_failed(exc: BaseException) -> bool:
    """True when ``exc`` (from requests) means no connection was made: refused, unreachable, DNS, connect timeout."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    seen, cur = set(), exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError)):
            return True
        reason = getattr(cur, "reason", None)
        cur = reason if isinstance(reason, BaseException) else (
            cur.args[0] if cur.args and isinstance(cur.args[0], BaseException) else cur.__context__)
    return False


def read_bounded(resp: requests.Response, limit: int) -> Optional[bytes]:
    """The body of a streamed ``resp``, or None when it is longer than ``limit`` (read no further than that)."""
    declared = resp.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    for chunk in resp.iter_content(CHUNK):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
