"""Talking to the service's JSON API: auth, retries until the deadline, bounded answers, error mapping.

Every call has a deadline, held whatever the server does (``deadlines``: a
server that trickles its headers or its body is cut off at it). A service
that cannot be reached costs seconds, not the deadline: connection failures
(refused, unreachable, no answer to connect) are retried for
``connect_timeout`` seconds in all, then raised as ServiceUnavailable. Once
connected, 502/503/504 answers and broken answers are retried with backoff
until the deadline. Answers are read up to ``MAX_ANSWER`` bytes and parsed
and checked by ``answers``; a malformed one is MalformedAnswer, never a
KeyError in the caller.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, Optional, Sequence
from urllib.parse import urljoin, urlsplit

import requests

from .. import answers
from ..errors import (Answer, CacheClientError, MalformedAnswer, ServiceUnavailable, describe_failure, excerpt,
                      raise_for_response, where)
from .deadlines import Deadline
from .session import CONNECT_TIMEOUT, Transport, connect_failed, read_bounded

#: the largest answer read (a resolve of the service's largest manifest is far smaller)
MAX_ANSWER = 256 << 20


def check_url(url: str) -> str:
    """The service URL with one trailing slash. Raises CacheClientError naming the URL when it is not
    ``http(s)://host[:port][/prefix]``."""
    if not url:
        raise CacheClientError("no service URL: pass url= or set CACHESVC_URL (e.g. http://cachesvc:8787)",
                               code="bad_url")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise CacheClientError(f"the service URL {url!r} is not a valid URL ({exc}); expected "
                               "http(s)://host[:port], e.g. http://cachesvc:8787", code="bad_url") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise CacheClientError(f"the service URL {url!r} must be http(s)://host[:port][/prefix], e.g. "
                               "http://cachesvc:8787", code="bad_url")
    return url.rstrip("/") + "/"


def _problem(answer: Answer) -> str:
    """A 5xx answer in one line: method, URL, status and the service's message (or what else answered)."""
    try:
        raise_for_response(answer)
    except CacheClientError as exc:
        return exc.message
    return f"{answer.method} {where(answer.url)} -> {answer.status_code}"


class ServiceAPI:
    """Thread-safe (requests.Session with a pooled adapter) client of the cachesvc HTTP API.

    ``timeout``: the default deadline of one call, in seconds. ``connect_timeout``: how long all
    attempts to connect may take before the service counts as down (see the module docstring).
    ``transport``: the connections (default: a new ``Transport`` of ``pool`` per host); blob
    transfers to the service and its storage go through ``transport.blob_pool``.
    """

    def __init__(self, url: str, token: Optional[str] = None, timeout: float = 30.0, *, pool: int = 32,
                 connect_timeout: float = CONNECT_TIMEOUT, transport: Optional[Transport] = None):
        self.base = check_url(url)
        self.token = token
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.transport = transport or Transport(pool)
        self.session = self.transport.session

    # -- plumbing -----------------------------------------------------------
    def absolute(self, url: str) -> str:
        return urljoin(self.base, url.lstrip("/")) if url.startswith("/") else url

    def auth_headers(self, url: str) -> Dict[str, str]:
        """The bearer token, but only for the service itself: never leak it to S3."""
        if self.token and url.startswith(self.base.rstrip("/")):
            return {"Authorization": f"Bearer {self.token}"}
        return {}

    def call(self, method: str, path: str, deadline: Optional[float] = None, *,
             check: Optional[Callable[[Any], Any]] = None, **kw) -> Any:
        """A JSON request, retried until ``deadline`` (monotonic seconds; default now + timeout).

        Returns the parsed answer, passed through ``check`` (an ``answers`` checker) when given. Raises
        ServiceUnavailable (unreachable, 5xx, no whole answer by the deadline), MalformedAnswer, or the
        CacheClientError for the service's error answer.
        """
        url = self.absolute(path)
        started = time.monotonic()
        at = deadline or started + self.timeout
        headers = {**kw.pop("headers", {}), **self.auth_headers(url)}
        delay, connecting_since = 0.1, None
        late = f"{method} {where(url)}: no whole answer"
        with Deadline(at, f"the call's {max(0.0, at - started):.1f} s deadline") as limit:
            while True:
                attempt = time.monotonic()
                limit.check(late)
                connect_left = self.connect_timeout - (attempt - (connecting_since or attempt))
                try:
                    with limit.guard():
                        timeout = (max(0.05, min(connect_left, limit.left())), max(0.05, limit.left()))
                        answer = self._send(method, url, headers, timeout=timeout, kw=kw)
                    limit.check(late)  # cut off: what arrived may look whole (headers ended by the cut)
                    if answer.status_code not in (502, 503, 504):
                        return self._parsed(answer, check)
                    problem = _problem(answer)
                except requests.RequestException as exc:
                    limit.check(late)
                    problem = f"{method} {where(url)}: {describe_failure(exc)}"
                    if connect_failed(exc):
                        connecting_since = connecting_since or attempt
                        if time.monotonic() - connecting_since + delay >= self.connect_timeout:
                            raise ServiceUnavailable(
                                f"cannot reach {where(self.base).rstrip('/')} ({describe_failure(exc)}; tried for "
                                f"{time.monotonic() - connecting_since:.1f} s): {method} {urlsplit(url).path}; "
                                "check the URL and that the service is up") from None
                    else:
                        connecting_since = None
                if limit.left() <= delay:
                    raise ServiceUnavailable(problem)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _send(self, method: str, url: str, headers: dict, *, timeout: tuple, kw: dict) -> Answer:
        """One request; its body read up to MAX_ANSWER bytes (MalformedAnswer beyond)."""
        resp = self.session.request(method, url, headers=headers, timeout=timeout, stream=True, **kw)
        try:
            body = read_bounded(resp, MAX_ANSWER)
        finally:
            resp.close()
        if body is None:
            raise MalformedAnswer(f"{method} {where(url)}: the answer runs past {MAX_ANSWER} bytes",
                                  status=resp.status_code)
        return Answer(method, resp.url, resp.status_code, resp.reason, resp.headers, body)

    @staticmethod
    def _parsed(answer: Answer, check: Optional[Callable[[Any], Any]]) -> Any:
        raise_for_response(answer)
        try:
            doc = answer.json()
            return check(doc) if check is not None else doc
        except answers.Malformed as exc:
            shown = "" if answer.headers.get("Content-Type", "").startswith("application/json") else \
                f"; {answer.status_code}, {excerpt(answer)}"
            raise MalformedAnswer(f"{answer.method} {where(answer.url)}: the answer is malformed ({exc}{shown}); "
                                  "is the URL a cachesvc service?", status=answer.status_code) from None

    # -- endpoints ----------------------------------------------------------
    def resolve(self, key: dict, deadline: Optional[float] = None, *, fallbacks: Sequence[str] = (),
                fallback_max_bytes: Optional[int] = None, kind: str = "inductor-dir", count: bool = True) -> dict:
        """The checked resolve answer (``answers.resolve``). ``count`` False: a look (``check``), which the
        service records as neither a restore nor a miss."""
        params = {"name": key["name"], "shape": key["shape"],
                  "tags": json.dumps(key["tags"], sort_keys=True), **key["env"]}
        if fallbacks:
            params["fallback"] = ",".join(fallbacks)
        if fallback_max_bytes is not None:
            params["fallback_max_bytes"] = str(fallback_max_bytes)
        if kind != "inductor-dir":  # services before artifact kinds know only the default
            params["kind"] = kind
        if not count:
            params["count"] = "false"
        return self.call("GET", "/api/v1/resolve", deadline=deadline, params=params, check=answers.resolve)

    def create_version(self, body: dict) -> dict:
        return self.call("POST", "/api/v1/versions", json=body)

    def commit(self, version_id: int, uploaded: list, packs: Optional[list] = None) -> dict:
        body = {"uploaded": uploaded, **({"packs": packs} if packs else {})}  # older services refuse "packs"
        return self.call("POST", f"/api/v1/versions/{version_id}/commit", json=body)

    def pack_targets(self, version_id: int, packs: list) -> list:
        """Upload targets ``[{"sha256", "target"}]`` for packs ``[{"sha256", "size"}]`` of a pending version."""
        return self.call("POST", f"/api/v1/versions/{version_id}/packs", json={"packs": packs})["targets"]

    def report_damaged(self, digest: str, deadline: Optional[float] = None) -> dict:
        """Tell the service that blob ``digest``'s bytes failed their sha256 here; it checks its stored copy
        itself and forgets it only when that is bad (the next publish naming it then uploads it again)."""
        return self.call("POST", f"/api/v1/blobs/{digest}/damaged", deadline=deadline, check=answers.json_object)

    def verdict(self, body: dict) -> dict:
        return self.call("POST", "/api/v1/verdicts", json=body, check=answers.json_object)

    def demand(self, params: dict) -> dict:
        return self.call("GET", "/api/v1/demand", params=params, check=answers.json_object)

    def usage(self, body: dict, deadline: Optional[float] = None) -> dict:
        return self.call("POST", "/api/v1/usage", deadline, json=body, check=answers.json_object)

    def entries(self, **filters) -> dict:
        return self.call("GET", "/api/v1/entries", params=filters, check=answers.json_object)
