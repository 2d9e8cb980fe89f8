"""Issue 15, item 2: the restore budget holds whatever the servers do.

A real slow proxy on loopback (``http_faults.FaultyHTTP``) forwards to the
real service (in a thread) and to the real S3 server (rclone), and at the
resolve or at the blob GETs trickles the body, stalls after the headers, or
never finishes the headers. ``restore()`` must return within ``budget`` + 2 s
(generous slack for a loaded machine: the bound, not the speed, is tested),
with no thread dead (``threading.excepthook``: the old cut-off timer died on
responses it had let go) and no temp file left.

    resolve trickled / stalled / never done  -> test_a_slow_resolve_costs_at_most_the_budget
    blobs trickled / stalled / never done    -> test_slow_blob_transfers_are_cut_at_the_budget (local, S3)
    one slow blob among fast ones            -> test_one_slow_blob_is_cut_and_the_rest_are_placed
    the CLI, resolve trickled                -> test_the_cli_exits_0_within_the_budget_when_the_resolve_trickles
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cachesvc_client import CacheClient
from tests.helpers import ENV, sha
from tests.helpers.restores import ENV_VARS, NAME, SHAPE, assert_no_half_file, final_files, make_files, temp_files
from tests.reliability.faults import client_env
from tests.reliability.http_faults import FaultyHTTP

BUDGET = 3.0
SLACK = 2.0
FAULTS = ["trickle-body", "stall-body", "trickle-headers"]
#: small files travel in packs, large ones loose; one of each size class
SIZES = {f"fxgraph/k{i}/entry": 20_000 + 1000 * i for i in range(6)} | {"sj/kernel.so": 400_000,
                                                                         "sj/big.gch": 9 << 20}


class Faults:
    """Which requests the proxies slow down, and how; changed by the test between publish and restore."""

    def __init__(self):
        self.where, self.how = None, None

    def __call__(self, path: str):
        if self.where is None:
            return None
        return self.how if self.where(path) else None


@pytest.fixture
def faults():
    return Faults()


@pytest.fixture
def front(faults):
    """``front(port)``: a faulty proxy in front of 127.0.0.1:<port> that obeys ``faults``; closed at the end."""
    made = []

    def make(port: int) -> FaultyHTTP:
        made.append(FaultyHTTP(port, fault=faults))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


@pytest.fixture
def database_url(sqlite_url):
    return sqlite_url


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage_settings(request, front):
    """Local storage (blobs come through the service), or S3 whose presigned URLs point at a faulty proxy."""
    if request.param == "local":
        return request.getfixturevalue("local_storage_settings")
    s3 = request.getfixturevalue("s3_server")
    return {**s3.settings(s3.new_bucket()), "S3_PUBLIC_ENDPOINT_URL": front(s3.port).url}


@pytest.fixture
def service_front(live_server, front):
    """A faulty proxy in front of the service: the client's --url."""
    return front(live_server.port)


@pytest.fixture
def thread_deaths(monkeypatch):
    """Exceptions that ended a thread during the test (must stay empty)."""
    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append((args.thread, args.exc_value)))
    return died


@pytest.fixture
def published(service_front, live_server, tokens, tmp_path):
    files = make_files(tmp_path / "src", SIZES)
    client = CacheClient(service_front.url, tokens["write"], cache_dir=str(tmp_path / "src"), timeout=30)
    assert client.publish(NAME, SHAPE, env=ENV, roots={"inductor": str(tmp_path / "src")}).status == "committed"
    return files


def timed_restore(url: str, token: str, cache: Path, **kw):
    client = CacheClient(url, token, cache_dir=str(cache), budget=BUDGET, timeout=30, stall_timeout=30, **kw)
    started = time.monotonic()
    report = client.restore(NAME, SHAPE, env=ENV)
    return report, time.monotonic() - started


def is_resolve(path: str) -> bool:
    return path.startswith("/api/v1/resolve")


def is_blob(path: str) -> bool:
    return not path.startswith("/api/") or path.startswith(("/api/v1/blobs", "/api/v1/packs"))


@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
@pytest.mark.parametrize("how", FAULTS)
def test_a_slow_resolve_costs_at_most_the_budget(published, service_front, tokens, faults, tmp_path, how,
                                                 thread_deaths):
    faults.where, faults.how = is_resolve, how
    report, elapsed = timed_restore(service_front.url, tokens["read"], tmp_path / "ctr")
    assert elapsed < BUDGET + SLACK, (elapsed, report)
    assert not report.hit and "/api/v1/resolve: no whole answer" in report.reason, report.reason
    assert report.seconds == pytest.approx(elapsed, abs=0.5)
    assert not thread_deaths
    assert not final_files(tmp_path / "ctr") and not temp_files(tmp_path / "ctr")


@pytest.mark.parametrize("how", FAULTS)
def test_slow_blob_transfers_are_cut_at_the_budget(published, service_front, tokens, faults, tmp_path, how,
                                                   thread_deaths):
    faults.where, faults.how = is_blob, how
    cache = tmp_path / "ctr"
    report, elapsed = timed_restore(service_front.url, tokens["read"], cache)
    assert elapsed < BUDGET + SLACK, (elapsed, report)
    assert not report.hit and report.failed, report
    assert all("time budget ran out" in f for f in report.failed), report.failed
    assert not thread_deaths
    assert not final_files(cache) and not temp_files(cache), "a transfer cut at the deadline leaves no temp file"

    faults.where = None  # the next container start gets everything
    again, _ = timed_restore(service_front.url, tokens["read"], cache)
    assert again.hit and not again.failed and again.files == len(published)
    assert_no_half_file(cache, published)


@pytest.mark.parametrize("how", ["trickle-body", "trickle-headers"])
def test_one_slow_blob_is_cut_and_the_rest_are_placed(published, service_front, tokens, faults, tmp_path, how,
                                                     thread_deaths):
    slow = sha(published["sj/big.gch"])
    faults.where, faults.how = (lambda path: slow in path), how
    cache = tmp_path / "ctr"
    report, elapsed = timed_restore(service_front.url, tokens["read"], cache)
    assert elapsed < BUDGET + SLACK, (elapsed, report)
    assert report.hit and len(report.failed) == 1 and "big.gch" in report.failed[0], report
    # the fast transfers finished (and let their responses go) before the cut: nothing died cutting the slow one
    assert not thread_deaths
    assert set(final_files(cache)) == set(published) - {"sj/big.gch"}
    assert not temp_files(cache)
    assert_no_half_file(cache, published)


@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
def test_the_cli_exits_0_within_the_budget_when_the_resolve_trickles(published, service_front, tokens, faults,
                                                                   tmp_path):
    faults.where, faults.how = is_resolve, "trickle-body"
    env = client_env({"CACHESVC_TOKEN": tokens["read"], **ENV_VARS}, tmp_path / "ctr")
    out = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "restore", "--name", NAME, "--shape", SHAPE,
                          "--url", service_front.url, "--budget", str(BUDGET), "--json"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    report = json.loads(out.stdout)
    assert not report["hit"] and "no whole answer" in report["reason"], report
    assert 0 < report["seconds"] < BUDGET + SLACK, report
