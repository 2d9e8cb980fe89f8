"""Slow clients cannot starve the served process (issue 26, row 3): 64 clients that each hold a request
whose headers never finish (what one header byte a second looks like to a worker) made /healthz
unanswerable under gunicorn alone. ``cachesvc serve`` as the image runs it (``CACHESVC_SERVE_PROXY``:
nginx in front) on loopback, real sockets, bounded in count and time."""
from __future__ import annotations

import os
import shutil
import socket
from urllib.parse import urlsplit

import pytest
import requests

from harness.service import ServiceProcess

SLOW_CLIENTS = 64


@pytest.fixture
def nginx():
    if not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")):
        if os.environ.get("CI"):
            pytest.fail("CI must have nginx: .ci/run installs it with apt-get", pytrace=False)
        pytest.skip("nginx is not installed here (apt-get install nginx-light; .ci/run installs it)")


def _slow_clients(url: str, n: int) -> list:
    host, port = urlsplit(url).hostname, urlsplit(url).port
    held = []
    for i in range(n):
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nX-Slow-{i}: ".encode())  # headers never finish
        held.append(s)
    return held


def test_healthz_answers_while_64_slow_clients_hold_connections(tmp_path, nginx):
    env = {"CACHESVC_SERVE_PROXY": "1"}
    with ServiceProcess(tmp_path / "svc", env=env, workers=1, write_token=False) as svc:
        held = _slow_clients(svc.url, SLOW_CLIENTS)
        try:
            for _ in range(3):  # the probes of issue 26: each must answer within its 5 s
                assert requests.get(svc.url + "/healthz", timeout=5).status_code == 200
            big = requests.post(svc.url + "/login", data=b"x" * (2 << 20), timeout=10,
                                headers={"Content-Type": "application/x-www-form-urlencoded"})
            assert big.status_code == 413  # nginx refuses past the route's bound, the app past its own
        finally:
            for s in held:
                s.close()
