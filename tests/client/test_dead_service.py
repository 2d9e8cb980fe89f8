"""Issue 16, items 3 and 4 (client), issue 15 item 9 (client): a dead or wrong service is a clear, cheap miss.

Speed is measured in bench/dead_service.py (docs/benchmarks.md), not asserted here: these tests check
the miss, its reason and that the reported seconds are the real ones.

    refused, with defaults           -> test_a_refused_connection_is_a_miss_naming_host_and_path
    the CLI, refused                 -> test_the_cli_reports_the_true_seconds_of_a_refused_restore
    unroutable (a blackhole netns)   -> test_an_unroutable_service_is_a_miss_after_the_connect_timeout
    an HTML 404 (not cachesvc)       -> test_a_non_cachesvc_404_is_summarised_once
    a 200 that is not JSON           -> test_a_non_cachesvc_200_is_a_malformed_answer
    --url http://[::1 and friends    -> test_a_malformed_url_is_a_clean_error_naming_it
    compile() with no or a dead URL  -> test_the_one_call_asks_a_dead_service_once
"""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from bench.dead_service import UNROUTABLE, in_blackhole
from cachesvc_client import CacheClient, CacheClientError
from cachesvc_client.transport import ServiceAPI
from tests.helpers.client import closed_port, enter_container
from tests.helpers import ENV, foreign_web_server
from tests.helpers.restores import ENV_VARS
from tests.reliability.faults import client_env

NAME, SHAPE = "dead", "f32[1]"
PAGE = ("<!DOCTYPE html><html><head><title>Error 404 (Not Found)</title><style>body{margin:0}</style></head>"
        "<body><p><b>404.</b> That is an error.</p><p>The requested URL was not found on this server.</p>"
        + "<p>padding</p>" * 300 + "</body></html>")


def assert_no_query(text: str) -> None:
    assert "tags=" not in text and "%7B" not in text and "?" not in text, text


def test_a_refused_connection_is_a_miss_naming_host_and_path(tmp_path, monkeypatch, caplog):
    enter_container(monkeypatch, tmp_path / "b")
    port = closed_port()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
        report = CacheClient(f"http://127.0.0.1:{port}").restore(NAME, SHAPE, env=ENV)  # default timeouts
    elapsed = time.monotonic() - started
    assert not report.hit and report.reason.startswith("error: cannot reach"), report.reason
    assert f"127.0.0.1:{port}" in report.reason and "connection refused" in report.reason
    assert "/api/v1/resolve" in report.reason and "check the URL" in report.reason
    assert_no_query(report.reason)
    assert 0 < report.seconds <= elapsed and report.seconds == pytest.approx(elapsed, abs=0.5), report.seconds
    assert f"in {report.seconds:.2f} s" in report.summary() and report.summary().count("cannot reach") == 1
    assert sum("cannot reach" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(CacheClientError, match="connection refused"):
        CacheClient(f"http://127.0.0.1:{port}").restore(NAME, SHAPE, env=ENV, strict=True)


def test_the_cli_reports_the_true_seconds_of_a_refused_restore(tmp_path):
    env = client_env(ENV_VARS, tmp_path / "ctr")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "restore", "--name", NAME, "--shape", SHAPE,
                          "--url", f"http://127.0.0.1:{closed_port()}", "--json"], env=env, capture_output=True,
                         text=True, timeout=120)
    wall = time.monotonic() - started
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    report = json.loads(out.stdout)
    assert not report["hit"] and "connection refused" in report["reason"], report
    assert 0.05 < report["seconds"] < wall, (report["seconds"], wall)  # the retries took time: it says so
    assert_no_query(report["reason"] + out.stderr.replace("?", ""))


def test_an_unroutable_service_is_a_miss_after_the_connect_timeout(tmp_path):
    code = ("import json; from cachesvc_client import CacheClient\n"
            f"r = CacheClient('http://{UNROUTABLE}:8787').restore({NAME!r}, {SHAPE!r})\n"
            "print(json.dumps(r.to_dict()))")
    argv = in_blackhole([sys.executable, "-c", code])
    if argv is None:
        pytest.skip("no private network namespace here (unshare -n needs root)")
    out = subprocess.run(argv, env=client_env(ENV_VARS, tmp_path / "ctr"), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    assert not report["hit"] and f"cannot reach http://{UNROUTABLE}:8787 (timed out" in report["reason"], report
    assert report["seconds"] > 0


@pytest.fixture
def wrong_server():
    """A web server that is not cachesvc: an HTML 404 for every path, or a 200 HTML page at ``/ok/``."""
    with foreign_web_server(PAGE.encode(), status=lambda path: 200 if path.startswith("/ok/") else 404,
                            content_type="text/html; charset=utf-8") as url:
        yield url


def test_a_non_cachesvc_404_is_summarised_once(wrong_server, tmp_path, monkeypatch, caplog):
    enter_container(monkeypatch, tmp_path / "b")
    with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
        report = CacheClient(wrong_server).restore(NAME, SHAPE, env=ENV)
    assert not report.hit
    reason = report.reason
    assert "/api/v1/resolve -> 404 (not a cachesvc answer: text/html" in reason, reason
    assert f"{len(PAGE)} bytes" in reason and "Error 404 (Not Found) 404. That is an error." in reason, reason
    assert "<" not in reason and "margin" not in reason and reason.count("padding") <= 3, reason  # an excerpt
    assert len(reason) < 400 and reason.count("Not Found") == 1, reason
    assert_no_query(reason)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].count("Not Found") == 1, warned


def test_a_non_cachesvc_200_is_a_malformed_answer(wrong_server, tmp_path, monkeypatch):
    enter_container(monkeypatch, tmp_path / "b")
    report = CacheClient(wrong_server + "/ok/").restore(NAME, SHAPE, env=ENV)
    assert not report.hit and "the answer is malformed (not JSON" in report.reason, report.reason
    assert "is the URL a cachesvc service?" in report.reason and len(report.reason) < 500


@pytest.mark.parametrize("url,says", [("http://[::1", "is not a valid URL"), ("http://host:port", "not a valid URL"),
                                      ("ftp://cachesvc:21", "must be http(s)"), ("cachesvc:8787", "must be http(s)"),
                                      ("http://h/?x=1", "must be http(s)")])
def test_a_malformed_url_is_a_clean_error_naming_it(url, says, tmp_path, monkeypatch):
    enter_container(monkeypatch, tmp_path / "b")
    with pytest.raises(CacheClientError) as caught:
        ServiceAPI(url)
    assert says in caught.value.message and repr(url) in caught.value.message
    report = CacheClient(url).restore(NAME, SHAPE, env=ENV)
    assert not report.hit and repr(url) in report.reason
    with pytest.raises(CacheClientError, match="URL"):
        CacheClient(url).restore(NAME, SHAPE, env=ENV, strict=True)


@pytest.mark.parametrize("where", ["refused", "no url"])
def test_the_one_call_asks_a_dead_service_once(where, tmp_path, monkeypatch, caplog):
    """compile() restores the package, then on a miss the snapshot: against a service that is down the
    second restore would pay the same wait and log the same warning. It is asked once."""
    import torch

    import cachesvc_client

    enter_container(monkeypatch, tmp_path / "b")
    monkeypatch.delenv("CACHESVC_URL", raising=False)
    url = f"http://127.0.0.1:{closed_port()}" if where == "refused" else None
    with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
        model = cachesvc_client.compile(torch.nn.Linear(4, 2), (torch.randn(2, 4),), name=NAME,
                                        client=CacheClient(url))
    assert model.source == "compiled" and model.report.service_down, model.report
    assert model.snapshot is model.report  # not asked again
    failed = [r.getMessage() for r in caplog.records if "failed (a miss)" in r.getMessage()]
    assert len(failed) == 1, failed
    assert ("cannot reach" if where == "refused" else "no service URL") in failed[0]


def test_a_bad_key_is_a_clean_miss_not_a_dead_service(caplog):
    with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
        report = CacheClient("http://127.0.0.1:1").restore("", SHAPE, env=ENV)  # the caller's fault, not the service's
    assert not report.hit and not report.service_down, report
    assert report.reason == "error: name must not be empty", report.reason  # not "a bug", no traceback
    assert [bool(r.exc_info) for r in caplog.records] == [False]


def test_a_service_that_accepts_and_never_answers_is_bounded_by_timeout(tmp_path, monkeypatch):
    enter_container(monkeypatch, tmp_path / "b")
    with socket.socket() as silent:  # the kernel accepts connections; nobody ever reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        report = CacheClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=1.5).restore(NAME, SHAPE, env=ENV)
    assert not report.hit and "no whole answer" in report.reason and "1.5 s deadline" in report.reason, report.reason
    assert report.seconds >= 1.5
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR")
