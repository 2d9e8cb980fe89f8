"""Inductor's byte-level remote-cache backend over cachesvc's HTTP API (``GET``/``PUT
/api/v1/remote-cache/<cache>/<key>``); ``cachesvc_client.remote_cache`` hooks it into Inductor.
Its session comes from ``session.new_session``, like every other connection of the client.

**Never fails the process.** Every request has a short timeout and no
retry; any error is logged (once per kind) and answered as a miss (GET) or
dropped (PUT). After a failure the backend stays quiet for ``cooldown``
seconds, so a service that is down costs one timeout per cooldown, not one
per compile. A 403 on PUT (a read-only token) stops puts and keeps reads.
``timeout`` bounds a whole request, however slowly the service answers
(``deadlines``).

**Checks what it hands Inductor.** A value is code Inductor will load, so a
GET's body is read up to ``max_bytes`` and hashed: the service sends the
sha256 of the value as PUT (``X-Cachesvc-Sha256``), and a body that does not
hash to it, comes without it, or is larger than ``max_bytes`` is a miss,
logged once per kind and counted in ``stats.rejected``: someone who can
write to the bucket can cost the fleet a compile, never plant a graph.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import threading
import time
from typing import Dict, Iterator, Optional

import requests

from .. import answers
from ..shared import keys
from ..errors import Answer, CacheClientError, describe_failure, excerpt
from .deadlines import Deadline
from .session import new_session, read_bounded

log = logging.getLogger("cachesvc_client.remote_cache")

#: the header carrying the sha256 of a GET's body, as the value was PUT
SHA256_HEADER = "X-Cachesvc-Sha256"
#: the largest value taken from the service (its own default limit on a PUT)
MAX_VALUE = 64 << 20
_ERROR_BODY = 64 << 10
#: connections per host of a remote-cache session (compiles in one process are few at a time)
SESSION_POOL = 16


@dataclasses.dataclass
class BackendStats:
    hits: int = 0
    misses: int = 0
    puts: int = 0
    errors: int = 0
    skipped: int = 0  # calls not made during a cooldown, or puts after a 403
    rejected: int = 0  # values refused: no sha256 header, a body that does not hash to it, or over max_bytes

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class HTTPBackend:
    """Inductor's byte-level remote-cache backend (``get(key) -> bytes | None``, ``put(key, bytes)``) over HTTP.

    Thread-safe. Never raises from ``get`` or ``put``.
    """

    def __init__(self, url: str, cache: str, env: Dict[str, str], *, token: Optional[str] = None,
                 timeout: float = 5.0, cooldown: float = 30.0, session: Optional[requests.Session] = None,
                 max_bytes: int = MAX_VALUE):
        self.base = f"{url.rstrip('/')}/api/v1/remote-cache/{keys.check_cache_name(cache)}/"
        self.cache = cache
        self.params = keys.check_env(env)
        self.total = timeout
        self.timeout = (min(2.0, timeout), timeout)  # (connect, read); self.total bounds the whole request
        self.cooldown, self.max_bytes = cooldown, max_bytes
        self.session = session or new_session(SESSION_POOL, token)
        self.stats = BackendStats()
        self._quiet_until = 0.0
        self._can_put = True
        self._warned: set = set()
        self._lock = threading.Lock()

    @staticmethod
    def wire_key(key: str) -> str:
        """Inductor's key as sent: unchanged when it fits the service's rules, else its sha256 (same on every host)."""
        try:
            return keys.check_remote_key(key)
        except keys.InvalidKey:
            return "sha256-" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()

    def get(self, key: str) -> Optional[bytes]:
        if self._quiet():
            return None
        try:
            with self._bounded() as deadline:
                resp = self.session.get(self.base + self.wire_key(key), params=self.params, timeout=self.timeout,
                                        stream=True)
                try:
                    value = resp.status_code == 200 and resp.headers.get("Content-Type", "").startswith(
                        "application/octet-stream")
                    body = read_bounded(resp, self.max_bytes) if value else None
                    problem = None if value or resp.status_code == 404 else _problem(resp)
                finally:
                    resp.close()
                deadline.check("get")  # cut off: what arrived may look whole
        except (requests.RequestException, CacheClientError) as exc:
            return self._failed("get", getattr(exc, "message", None) or describe_failure(exc))
        if problem is not None:
            return self._failed("get", problem)
        if not value:
            self.stats.misses += 1
            return None
        return self._checked(resp.headers.get(SHA256_HEADER, ""), body)

    def _checked(self, expected: str, body: Optional[bytes]) -> Optional[bytes]:
        """``body`` (None: over ``max_bytes``) if it hashes to ``expected``, the service's sha256 (else None)."""
        try:
            keys.check_digest(expected)
        except keys.InvalidKey:
            return self._rejected("no-sha256", "the service sent a value without a valid %s header (an older "
                                  "service?); remote values are used only when their hash comes with them",
                                  SHA256_HEADER)
        if body is None:
            return self._rejected("too-large", "a value is over the client's %d-byte limit", self.max_bytes)
        got = hashlib.sha256(body).hexdigest()
        if got != expected:
            return self._rejected("sha256", "a value hashes to %s, not to the %s the service sent: the stored "
                                  "object was changed behind the service (someone with write access to the "
                                  "bucket?)", got[:12], expected[:12])
        self.stats.hits += 1
        return body

    def put(self, key: str, data: bytes) -> None:
        if not self._can_put or self._quiet():
            return None
        if isinstance(data, str):
            data = data.encode("utf-8")
        try:
            with self._bounded():
                resp = self.session.put(self.base + self.wire_key(key), params=self.params, data=data,
                                        headers={"Content-Type": "application/octet-stream"}, timeout=self.timeout,
                                        stream=True)
                try:
                    self._put_answer(resp, len(data))
                finally:
                    resp.close()
        except (requests.RequestException, CacheClientError) as exc:
            self._failed("put", getattr(exc, "message", None) or describe_failure(exc))
        return None

    def _put_answer(self, resp: requests.Response, size: int) -> None:
        if resp.status_code == 201:
            self.stats.puts += 1
        elif resp.status_code == 413:  # too large for the service: it stays in the local cache
            self._warn_once("413", "cachesvc remote cache %s: a value of %d bytes is over the service's limit; "
                            "such values stay local", self.cache, size)
        elif resp.status_code == 403:
            self._can_put = False
            self._warn_once("403", "cachesvc remote cache %s: the token may read but not write (%s); this "
                            "process reads from the remote cache and stops putting", self.cache, _problem(resp))
        else:
            self._failed("put", _problem(resp))

    @contextlib.contextmanager
    def _bounded(self) -> Iterator[Deadline]:
        """The request inside takes at most ``timeout`` seconds in all, however the service answers."""
        with Deadline(time.monotonic() + self.total, f"its {self.total:g} s timeout") as deadline:
            with deadline.guard():
                try:
                    yield deadline
                except requests.RequestException:
                    deadline.check("no whole answer")  # cut off: say so
                    raise

    # -- failure handling -------------------------------------------------------------------
    def _quiet(self) -> bool:
        if time.monotonic() < self._quiet_until:
            with self._lock:
                self.stats.skipped += 1
            return True
        return False

    def _failed(self, op: str, problem: str) -> None:
        with self._lock:
            self.stats.errors += 1
            self._quiet_until = time.monotonic() + self.cooldown
        self._warn_once(op, "cachesvc remote cache %s: %s failed (%s); treated as a miss, compiling locally; "
                        "next try in %.0f s", self.cache, op, problem, self.cooldown)
        return None

    def _rejected(self, kind: str, msg: str, *args) -> None:
        with self._lock:
            self.stats.rejected += 1
        self._warn_once(f"rejected-{kind}", "cachesvc remote cache %s: " + msg + "; treated as a miss",
                        self.cache, *args)
        return None

    def _warn_once(self, kind: str, msg: str, *args) -> None:
        with self._lock:
            first = kind not in self._warned
            self._warned.add(kind)
        log.log(logging.WARNING if first else logging.DEBUG, msg, *args)


def _problem(resp: requests.Response) -> str:
    answer = Answer(resp.request.method, resp.url, resp.status_code, resp.reason, resp.headers,
                    read_bounded(resp, _ERROR_BODY) or b"")
    try:
        code, message, _ = answers.error_fields(answer.json())
        return f"{resp.status_code} {code}: {message}"
    except ValueError:  # not our JSON: a proxy, a wrong URL
        return f"{resp.status_code} {excerpt(answer)}"

