"""The one call's usage counts (cachesvc_client.usage): what a call pays, what a report holds, and what the
reporter does with each answer a service can give.

The happy path runs against the real service (tests/client/test_usage_demand.py); here a recording server
answers what a real one rarely does on cue (503, 429, 404 of an older service, 401), which is what the
reporter's rules are about: keep the counts for later, stop asking, or drop a report the service calls bad.
"""
from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import sys
import threading
from typing import Callable, Iterator, List

import pytest

from cachesvc_client import CacheClient
from cachesvc_client.usage import Reporter, Tally
from cachesvc_client.usage import reporter as reporter_mod
from cachesvc_client.usage.tally import MAX_SHAPES
from tests.helpers import ENV

TAGS = {"mode": "default"}


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "env.json"
    path.write_text(json.dumps(ENV))
    return str(path)


@contextlib.contextmanager
def recording_server(answer: Callable[[int], int] = lambda n: 200) -> Iterator[tuple]:
    """A server that keeps every POSTed body and answers the n-th (from 0) with status ``answer(n)``, a JSON
    error body for 4xx/5xx as cachesvc has it. Yields (url, bodies)."""
    bodies: List[dict] = []
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                n = len(bodies)
                bodies.append(body)
            status = answer(n)
            out = json.dumps({"recorded": []} if status < 400 else
                             {"error": {"code": {404: "not_found", 401: "unauthorized", 400: "invalid_request",
                                                 429: "too_many_requests"}.get(status, "unavailable"),
                                        "message": f"status {status}"}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", bodies
    finally:
        server.shutdown()
        server.server_close()


def reporter_with(client: CacheClient, *models: str) -> tuple:
    """A reporter of its own (not the process's), tracking one tally per model name, no thread started."""
    reporter = Reporter()
    tallies = []
    for name in models:
        tally = Tally(client, name, TAGS)
        reporter._tallies.append(tally)
        tallies.append(tally)
    return reporter, tallies


def count(tally: Tally, shape: str, served: int = 0, n: int = 1) -> None:
    for _ in range(n):
        tally.count(shape, served, lambda: shape)


def test_a_tally_counts_each_shape_by_how_it_was_served_and_hands_out_only_what_is_new():
    tally = Tally(object(), "m", TAGS)
    count(tally, "f32[8,256]", 0, 3)
    count(tally, "f32[8,256]", 1)
    tally.count(("token", 2), 1, lambda: "f32[2,256]")  # two tokens of one text are one shape
    tally.count(("token", 3), 2, lambda: "f32[2,256]")
    assert tally.totals() == {"f32[8,256]": {"package": 3, "compile": 1, "eager": 0},
                              "f32[2,256]": {"package": 0, "compile": 1, "eager": 1}}
    assert tally.take() == {"f32[8,256]": [3, 1, 0], "f32[2,256]": [0, 1, 1]}
    assert tally.take() == {}
    count(tally, "f32[8,256]", 0)
    taken = tally.take()
    assert taken == {"f32[8,256]": [1, 0, 0]}
    tally.give_back(taken)  # the report did not arrive: the next one has it again
    count(tally, "f32[8,256]", 0)
    assert tally.take() == {"f32[8,256]": [2, 0, 0]}
    assert tally.totals()["f32[8,256]"] == {"package": 5, "compile": 1, "eager": 0}


def test_a_tally_counts_at_most_max_shapes_and_the_rest_as_overflow():
    tally = Tally(object(), "m", TAGS)
    for batch in range(1, 300):
        count(tally, f"f32[{batch},256]")
    assert len(tally.totals()) == MAX_SHAPES == 256 and tally.overflow == 299 - 256
    count(tally, "f32[1,256]")  # a shape on record still counts
    assert tally.totals()["f32[1,256]"]["package"] == 2


def test_a_report_holds_at_most_16_models_and_64_shapes_a_model(env_file):
    with recording_server() as (url, bodies):
        client = CacheClient(url, env_file=env_file)
        reporter, tallies = reporter_with(client, *[f"model-{i}" for i in range(20)])
        for i in range(100):
            count(tallies[0], f"f32[{i + 1},8]", 0, n=1 + (i == 7) * 50)  # batch 8 the busiest
        for tally in tallies[1:]:
            count(tally, "f32[1,8]", 1)
        reporter.flush()
    sizes = [len(b["reports"]) for b in bodies]
    assert sum(sizes) == 21 and max(sizes) == 16, sizes  # 20 models, the first in two parts of 64 + 36
    first = [r for b in bodies for r in b["reports"] if r["key"]["name"] == "model-0"]
    assert [len(r["shapes"]) for r in first] == [reporter_mod.SHAPES_PER_REPORT, 100 - reporter_mod.SHAPES_PER_REPORT]
    assert first[0]["shapes"][0] == {"shape": "f32[8,8]", "served": {"package": 51, "compile": 0, "eager": 0}}
    assert first[0]["key"] == {"name": "model-0", "tags": TAGS, "env": ENV}
    assert all(0 <= b["seconds"] <= 86400 for b in bodies)
    assert reporter.sent == 2


def test_a_busy_or_down_service_gets_the_counts_again_later(env_file):
    answers = {0: 503, 1: 429}
    with recording_server(lambda n: answers.get(n, 200)) as (url, bodies):
        client = CacheClient(url, env_file=env_file, connect_timeout=1, timeout=2)
        reporter, [tally] = reporter_with(client, "m")
        count(tally, "f32[8,8]", 0, 5)
        reporter.flush()  # 503 (ServiceAPI retries 5xx within its deadline: that answer and the next, a 429)
        assert reporter.sent == 0 and reporter._backoff > 0
        count(tally, "f32[8,8]", 1)
        reporter.flush()
    assert reporter.sent == 1 and reporter._backoff == 0
    assert bodies[-1]["reports"][0]["shapes"] == [{"shape": "f32[8,8]", "served": {"package": 5, "compile": 1,
                                                                                    "eager": 0}}]


@pytest.mark.parametrize("status", [404, 401])
def test_a_service_without_the_endpoint_or_refusing_the_token_is_not_asked_again(env_file, status, caplog):
    with recording_server(lambda n: status) as (url, bodies):
        client = CacheClient(url, env_file=env_file)
        reporter, [tally] = reporter_with(client, "m")
        count(tally, "f32[8,8]")
        reporter.flush()
        count(tally, "f32[8,8]")
        reporter.flush()
    assert len(bodies) == 1 and reporter.sent == 0
    assert "not reporting the shapes served" in caplog.text


def test_a_report_the_service_calls_bad_is_dropped_and_the_next_one_goes(env_file):
    with recording_server(lambda n: 400 if n == 0 else 200) as (url, bodies):
        client = CacheClient(url, env_file=env_file)
        reporter, [tally] = reporter_with(client, "m")
        count(tally, "f32[8,8]", n=2)
        reporter.flush()
        count(tally, "f32[8,8]")
        reporter.flush()
    assert [b["reports"][0]["shapes"][0]["served"]["package"] for b in bodies] == [2, 1]


def test_a_model_whose_environment_cannot_be_read_is_served_and_not_reported(tmp_path, caplog):
    bad = tmp_path / "env.json"
    bad.write_text("{not json")
    with recording_server() as (url, bodies):
        reporter, [tally] = reporter_with(CacheClient(url, env_file=str(bad)), "m")
        count(tally, "f32[8,8]")
        reporter.flush()
    assert bodies == [] and "not reporting m" in caplog.text


def test_usage_off_or_no_service_tracks_nothing(monkeypatch, env_file):
    monkeypatch.setenv("CACHESVC_USAGE", "0")
    assert Reporter().track(CacheClient("http://127.0.0.1:9", env_file=env_file), "m", TAGS) is None
    monkeypatch.delenv("CACHESVC_USAGE")
    monkeypatch.delenv("CACHESVC_URL", raising=False)
    assert Reporter().track(CacheClient(None, env_file=env_file), "m", TAGS) is None


EXITS_AT_ONCE = """
import sys
from cachesvc_client import CacheClient, usage
tally = usage.track(CacheClient(sys.argv[1], env_file=sys.argv[2]), "short-lived", {"mode": "default"})
for _ in range(7):
    tally.count((), 0, lambda: "f32[8,256]")
"""


def test_a_process_that_exits_right_away_still_reports_its_calls(env_file, tmp_path):
    """The interval is an hour: only the exit's report can carry the 7 calls, within its 2 s."""
    with recording_server() as (url, bodies):
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CACHESVC_USAGE_INTERVAL_S": "3600"}
        out = subprocess.run([sys.executable, "-c", EXITS_AT_ONCE, url, env_file], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    [body] = bodies
    assert body["reports"][0]["shapes"] == [{"shape": "f32[8,256]", "served": {"package": 7, "compile": 0,
                                                                                "eager": 0}}]


def test_the_exit_report_gives_up_within_its_bound_when_the_service_hangs(env_file, tmp_path):
    """A service that never answers costs the exiting process CACHESVC_USAGE_AT_EXIT_S, not the 30 s timeout."""
    import socket
    import time

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # accepts connections (the kernel's backlog), never answers
    try:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CACHESVC_USAGE_INTERVAL_S": "3600",
               "CACHESVC_USAGE_AT_EXIT_S": "1"}
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-c", EXITS_AT_ONCE, f"http://127.0.0.1:{hung.getsockname()[1]}",
                              env_file], env=env, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - started
    finally:
        hung.close()
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert took < 15, took  # a bound, not a speed: the import alone is most of it


def test_the_report_interval_is_read_from_the_environment_and_a_bad_value_is_named(monkeypatch, caplog):
    assert reporter_mod._seconds("2.5", 60.0, "X") == 2.5
    assert reporter_mod._seconds(None, 60.0, "X") == 60.0
    assert reporter_mod._seconds("soon", 60.0, "CACHESVC_USAGE_INTERVAL_S") == 60.0
    assert "CACHESVC_USAGE_INTERVAL_S='soon' is not a number of seconds" in caplog.text
