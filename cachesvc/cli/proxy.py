"""The buffering proxy in front of gunicorn (``cachesvc serve`` with ``CACHESVC_SERVE_PROXY``): nginx.

gunicorn's gthread worker reads a request's headers and body in its thread pool: 64 clients that
each send a header byte a second held every thread, and /healthz went unanswered. nginx (event
driven, one worker holds thousands of connections) takes the slow part: it reads each request's
headers within ``client_header_timeout`` and its whole body within ``client_body_timeout`` (a
timeout between two reads), buffering bodies (to a temp file past 64 KiB) before gunicorn sees a
byte, and refuses bodies past each route's limit (413, the app's own table: ``_route_blocks``). gunicorn then listens on a Unix socket in
the run folder only, so nothing reaches it around nginx. Why nginx and not an async worker:
docs/security.md ("Slow clients").
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

from .failures import Failure
from ..config import Settings

SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, 104 on macOS

#: seconds nginx waits for a client's headers, and between two reads of its body
HEADER_TIMEOUT, BODY_TIMEOUT = 10, 30

_CONF = """\
worker_processes 1;
{user}pid {run}/nginx.pid;
error_log stderr warn;
daemon off;
events {{ worker_connections 4096; }}
http {{
  access_log off;  # gunicorn logs every request
  client_body_temp_path {run}/nginx-body; proxy_temp_path {run}/nginx-proxy;
  fastcgi_temp_path {run}/nginx-fcgi; uwsgi_temp_path {run}/nginx-uwsgi; scgi_temp_path {run}/nginx-scgi;
  client_header_timeout {header}s; client_body_timeout {body}s; send_timeout 60s; keepalive_timeout 30s;
  client_header_buffer_size 1k; large_client_header_buffers 4 16k;
  client_max_body_size {default};  # the pages and their forms: BODY_LIMIT_BYTES, as the app's own check
  proxy_request_buffering on; proxy_buffering on; proxy_read_timeout 300s;
  proxy_http_version 1.1;
  upstream cachesvc {{ server unix:{socket}; }}
  server {{
    listen {host}:{port};
    proxy_set_header Host $http_host;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    # past its route's limit a body is refused here, from its headers, with the app's JSON error: forwarded,
    # the app's refusal (answered unread) crossed nginx still sending it, and came back as a 502
    error_page 413 @payload_too_large;
    location @payload_too_large {{
      default_type application/json;
{headers}
      return 413 '{too_large}';
    }}
    location / {{ proxy_pass http://cachesvc; }}
{locations}
  }}
  map $uri $cachesvc_limit {{
    default {default};
{limits}
  }}
}}
"""


def _route_blocks(app) -> dict:
    """The parts of the config made from ``app``'s own body limits (``cachesvc.api.route_limits``): a
    location per URL rule with its ``client_max_body_size``, the map from a path to its limit (for the
    413's message), and the 413's JSON body and security headers, as the app answers them."""
    from ..api import SECURITY_HEADERS, route_limits

    limits = route_limits(app)
    too_large = json.dumps({"error": {"code": "payload_too_large", "message":
                                      "the body is too large: this route takes a body of at most "
                                      "$cachesvc_limit bytes"}})
    return {"locations": "\n".join(f'    location ~ "{regex}" {{ client_max_body_size {limit}; '
                                    f'proxy_pass http://cachesvc; }}' for regex, limit in limits.items()),
            "limits": "\n".join(f'    "~{regex}" {limit};' for regex, limit in limits.items()),
            "headers": "\n".join(f'      add_header {name} "{value}" always;' for name, value in SECURITY_HEADERS.items()),
            "too_large": too_large}


@contextlib.contextmanager
def nginx_front(run: Path, host: str, port: int, app) -> Iterator[str]:
    """nginx in front of ``app`` (its settings and its routes' body limits), listening on ``host:port``
    for as long as the block runs; yields gunicorn's bind (a Unix socket in ``run``). Raises Failure when
    nginx is not installed or does not start."""
    binary = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
    if binary is None:
        raise Failure("CACHESVC_SERVE_PROXY is on but nginx is not installed (apt-get install nginx-light), "
                      "or turn it off to serve with gunicorn alone")
    socket = run / "gunicorn.sock"
    short = None
    if len(str(socket)) > SOCKET_PATH_MAX:  # a deep TMPDIR: the socket goes in a short folder of its own
        short = Path(tempfile.mkdtemp(prefix="cachesvc-", dir="/tmp"))
        socket = short / "gunicorn.sock"
    conf = run / "nginx.conf"
    conf.write_text(_CONF.format(
        user="user root;\n" if os.geteuid() == 0 else "", run=run, socket=socket, host=host, port=port,
        header=HEADER_TIMEOUT, body=BODY_TIMEOUT, default=app.extensions["cachesvc"].settings.BODY_LIMIT_BYTES,
        **_route_blocks(app)))
    proc = subprocess.Popen([binary, "-e", "stderr", "-c", str(conf), "-p", str(run)])
    try:
        yield f"unix:{socket}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if short is not None:
            shutil.rmtree(short, ignore_errors=True)


#: how much of an unread body is read and dropped at a time
DRAIN_CHUNK = 1 << 20


class _Drained:
    """A response iterable whose close() first reads and drops what is left of the request's body."""

    def __init__(self, body, stream):
        self.body, self.stream = body, stream

    def __iter__(self):
        return iter(self.body)

    def close(self) -> None:
        try:
            while self.stream.read(DRAIN_CHUNK):
                pass
        except (OSError, ValueError):  # nginx gave up on it: nothing left to keep from a reset
            pass
        finally:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()


def drain_unread_bodies(app):
    """``app`` as gunicorn runs it behind nginx. The app may answer before it reads a body (a 401 from the
    headers, its own 413); gunicorn then closed the socket with the body unread, the kernel reset it, and
    nginx, still sending, answered 502 instead (2-4 tries in 15 with 8-32 MiB). nginx has read the whole
    body and bounded it by the route's limit, and sends it over a local socket, so reading the rest after
    the answer is cheap and bounded; a request without a body keeps its response as it is (sendfile)."""

    def wsgi(environ, start_response):
        body = app(environ, start_response)
        if environ.get("CONTENT_LENGTH", "0") in ("", "0") and "chunked" not in environ.get("HTTP_TRANSFER_ENCODING", ""):
            return body
        return _Drained(body, environ["wsgi.input"])

    return wsgi

