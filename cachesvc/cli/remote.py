"""The admin commands over a running service's admin API (``--url`` / ``CACHESVC_URL``).

For a service in Kubernetes without ``kubectl exec``, and from the light install (requests
only: nothing of the server's stack is imported here). Needs a token with scope ``admin``
(``--token`` / ``CACHESVC_TOKEN``). The answers are the dicts the direct mode gets from
``cachesvc.lifecycle.actions``, so both print the same; the service's refusals keep their exit codes
(2 for a refused value, told in flags; 1 otherwise).

A refused connection fails at once (no retries: the operator is there to run it again);
an answer may take long (a GC of a large store), so only connecting has a short deadline.
"""
from __future__ import annotations

import re
from typing import Any, Optional
from urllib.parse import quote, urlsplit

import requests

from .failures import BadUsage, Failure, refusal

CONNECT_SECONDS = 10.0
ANSWER_SECONDS = 3600.0  # purge and GC run in the request


class HttpAdmin:
    def __init__(self, url: str, token: Optional[str]):
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
        except ValueError as exc:  # also "Invalid IPv6 URL" for http://[::1
            raise BadUsage(f"--url: {exc} in {url!r}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadUsage(f"--url: expected http(s)://host[:port], got {url!r}")
        self.base = url.rstrip("/")
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self.has_token = bool(token)

    def _call(self, method: str, path: str, body: Optional[dict] = None) -> Any:
        url = self.base + path
        try:
            resp = self.session.request(method, url, json=body, timeout=(CONNECT_SECONDS, ANSWER_SECONDS))
        except requests.exceptions.InvalidURL as exc:
            raise BadUsage(f"--url: {exc}") from None
        except requests.RequestException as exc:
            errno = re.search(r"\[Errno [^\]]+\] [^'\")]+", str(exc))  # "[Errno 111] Connection refused"
            raise Failure(f"cannot reach the service at {self.base} ({errno.group(0) if errno else type(exc).__name__}); "
                          f"check --url / CACHESVC_URL and that the service runs") from None
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        if resp.status_code < 400 and isinstance(answer, dict):
            return answer
        error = answer.get("error") if isinstance(answer, dict) else None
        if not isinstance(error, dict):
            kind = resp.headers.get("Content-Type")
            raise Failure(f"{url} answered {resp.status_code}{f' ({kind})' if kind else ''}, not cachesvc's JSON: "
                          f"check --url / CACHESVC_URL")
        code, message = str(error.get("code", "error")), str(error.get("message", ""))
        if resp.status_code == 401:
            message += ("; give an admin token with --token or CACHESVC_TOKEN" if not self.has_token
                        else "; the token given (--token / CACHESVC_TOKEN) is unknown or revoked")
        elif resp.status_code == 403:
            message += "; admin commands need a token with scope admin"
        raise refusal(code, message, error.get("details"))

    def purge(self, criteria: dict, dry_run: bool) -> dict:
        body = {k: v for k, v in criteria.items() if v is not None}
        return self._call("POST", "/api/v1/admin/purge", dict(body, dry_run=dry_run))

    def gc(self) -> dict:
        return self._call("POST", "/api/v1/admin/gc")

    def create_token(self, name: str, scope: str) -> dict:
        return self._call("POST", "/api/v1/admin/tokens", {"name": name, "scope": scope})

    def list_tokens(self) -> list:
        return self._call("GET", "/api/v1/admin/tokens")["tokens"]

    def revoke_token(self, ident: str) -> list:
        # surrogateescape: a name read from argv in another encoding travels as the bytes it was
        path = quote(ident.encode("utf-8", "surrogateescape"), safe="")
        return self._call("DELETE", f"/api/v1/admin/tokens/{path}")["revoked"]

    def close(self) -> None:
        self.session.close()
