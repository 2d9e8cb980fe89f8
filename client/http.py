"""Talking to the service: one requests.Session, auth, deadlines, error mapping.

Every call has a deadline. Connection failures and 5xx answers are retried
with backoff until the deadline passes, then raised as ServiceUnavailable,
so a container start never waits on the cache longer than it was told to.
"""
from __future__ import annotations

import time
from typing import Any, Dict, Optional, Sequence
from urllib.parse import urljoin

import requests
from requests.adapters import HTTPAdapter

from . import __version__
from .errors import CacheClientError, ServiceUnavailable, raise_for_response


class ServiceAPI:
    """Thread-safe (requests.Session with a pooled adapter) client of the cachesvc HTTP API."""

    def __init__(self, url: str, token: Optional[str] = None, timeout: float = 30.0, pool: int = 32):
        if not url:
            raise CacheClientError("no service URL: pass url= or set CACHESVC_URL (e.g. http://cachesvc:8787)")
        self.base = url.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout
        self.session = requests.Session()
        adapter = HTTPAdapter(pool_connections=pool, pool_maxsize=pool, max_retries=0)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers["User-Agent"] = f"cachesvc-client/{__version__}"

    # -- plumbing -----------------------------------------------------------
    def absolute(self, url: str) -> str:
        return urljoin(self.base, url.lstrip("/")) if url.startswith("/") else url

    def auth_headers(self, url: str) -> Dict[str, str]:
        """The bearer token, but only for the service itself: never leak it to S3."""
        if self.token and url.startswith(self.base.rstrip("/")):
            return {"Authorization": f"Bearer {self.token}"}
        return {}

    def call(self, method: str, path: str, deadline: Optional[float] = None, **kw) -> Any:
        """JSON request with retries until ``deadline`` (monotonic seconds; default now + timeout)."""
        url = self.absolute(path)
        deadline = deadline or time.monotonic() + self.timeout
        headers = {**kw.pop("headers", {}), **self.auth_headers(url)}
        delay = 0.2
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServiceUnavailable(f"{method} {url}: no answer within {self.timeout:.0f} s")
            try:
                resp = self.session.request(method, url, headers=headers, timeout=(min(5.0, left), left), **kw)
                if resp.status_code not in (502, 503, 504):
                    raise_for_response(resp)
                    return resp.json()
                problem = f"{resp.status_code} {resp.text[:200]}"
            except (requests.ConnectionError, requests.Timeout) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if deadline - time.monotonic() <= delay:
                raise ServiceUnavailable(f"{method} {url}: {problem}")
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    # -- endpoints ----------------------------------------------------------
    def resolve(self, key: dict, deadline: Optional[float] = None, fallbacks: Sequence[str] = (),
                fallback_max_bytes: Optional[int] = None, kind: str = "inductor-dir") -> dict:
        import json

        params = {"name": key["name"], "shape": key["shape"],
                  "tags": json.dumps(key["tags"], sort_keys=True), **key["env"]}
        if fallbacks:
            params["fallback"] = ",".join(fallbacks)
        if fallback_max_bytes is not None:
            params["fallback_max_bytes"] = str(fallback_max_bytes)
        if kind != "inductor-dir":  # services before artifact kinds know only the default
            params["kind"] = kind
        return self.call("GET", "/api/v1/resolve", deadline=deadline, params=params)

    def create_version(self, body: dict) -> dict:
        return self.call("POST", "/api/v1/versions", json=body)

    def commit(self, version_id: int, uploaded: list, packs: Optional[list] = None) -> dict:
        body = {"uploaded": uploaded, **({"packs": packs} if packs else {})}  # older services refuse "packs"
        return self.call("POST", f"/api/v1/versions/{version_id}/commit", json=body)

    def pack_targets(self, version_id: int, packs: list) -> list:
        """Upload targets ``[{"sha256", "target"}]`` for packs ``[{"sha256", "size"}]`` of a pending version."""
        return self.call("POST", f"/api/v1/versions/{version_id}/packs", json={"packs": packs})["targets"]

    def verdict(self, body: dict) -> dict:
        return self.call("POST", "/api/v1/verdicts", json=body)

    def entries(self, **filters) -> dict:
        return self.call("GET", "/api/v1/entries", params=filters)
