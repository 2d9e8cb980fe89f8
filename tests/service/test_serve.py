"""`cachesvc serve` as a real process (gunicorn, 2 workers): metrics add up across workers; the demo's
service makes its own write token."""
from __future__ import annotations

import re
from pathlib import Path

import requests

from harness.containers import Container
from harness.service import ServiceProcess
from tests.helpers import key, publish_body


def sample(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            got = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_two_workers_report_summed_metrics_and_the_demo_token_publishes(tmp_path, monkeypatch):
    monkeypatch.setenv("CACHESVC_TOKEN", "the developer's own")
    with ServiceProcess(tmp_path / "svc", workers=2) as svc:
        assert svc.token and svc.client_env()["CACHESVC_TOKEN"] == svc.token
        # the restart demo's containers get it with no extra step
        assert Container(tmp_path / "ctr").env()["CACHESVC_TOKEN"] == svc.token
        before = sample(requests.get(svc.url + "/metrics", timeout=10).text, "cachesvc_http_requests_total",
                        endpoint="health.healthz", status="200")  # start() polled /healthz
        for _ in range(40):
            resp = requests.get(svc.url + "/healthz", timeout=10)
            assert resp.status_code == 200
        body = publish_body({"a": b"hello"}, key())
        assert requests.post(svc.url + "/api/v1/versions", json=body, timeout=10).status_code == 401
        made = requests.post(svc.url + "/api/v1/versions", json=body, timeout=10,
                             headers={"Authorization": f"Bearer {svc.token}"})
        assert made.status_code == 201, made.text
        text = requests.get(svc.url + "/metrics", timeout=10).text
        log = svc.log_path.read_text()
    assert Container(tmp_path / "ctr2").env()["CACHESVC_TOKEN"] == "the developer's own", "restored at stop"
    pids = set(re.findall(r"Booting worker with pid: (\d+)", log))
    assert len(pids) == 2, log[-2000:]
    assert sample(text, "cachesvc_http_requests_total", endpoint="health.healthz", status="200") == before + 40
    assert sample(text, "cachesvc_http_requests_total", endpoint="versions.create", status="401") == 1
    assert sample(text, "cachesvc_http_requests_total", endpoint="versions.create", status="201") == 1
    assert sample(text, "cachesvc_http_request_seconds_count", endpoint="health.healthz") == before + 40
    assert "cachesvc_entries 0.0" in text  # the version is pending: nothing committed yet
    assert sample(text, "cachesvc_misses_total") == 0


def run_folder(tmpdir: Path, svc: ServiceProcess) -> Path:
    """The serve's own folder, named after its pid (the gunicorn master's)."""
    [folder] = tmpdir.glob(f"cachesvc-serve-{svc.proc.pid}-*")
    assert f"run folder={folder}" in svc.log_path.read_text()
    return folder


def test_two_services_on_one_host_keep_their_own_metrics_and_control_socket(tmp_path):
    """Same user, HOME, TMPDIR and data dir (two instances of one service): starting or stopping one must not
    touch the other's files (it deleted the other's Prometheus folder, and /metrics answered 500 for good,
    and the control socket they shared)."""
    shared = {"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")}
    for d in shared.values():
        Path(d).mkdir()
    first = ServiceProcess(tmp_path / "data", env=shared, workers=2, write_token=False).start()
    try:
        with ServiceProcess(tmp_path / "data", env=shared, workers=2, write_token=False) as second:
            for svc in (first, second):
                assert requests.get(svc.url + "/metrics", timeout=10).status_code == 200
            folders = [run_folder(tmp_path / "tmp", svc) for svc in (first, second)]
            assert folders[0] != folders[1] and all(f.parent == tmp_path / "tmp" for f in folders)
            assert all((f / "metrics").is_dir() for f in folders)
            if (folders[0] / "gunicorn.ctl").exists():  # gunicorn >= 25.1 has a control socket: one each
                assert (folders[1] / "gunicorn.ctl").exists()
        assert not folders[1].exists(), "a stopped service removes its own run folder"
        assert folders[0].is_dir() and (folders[0] / "metrics").is_dir()
        for _ in range(3):  # the workers of the first still count, and /metrics still adds them up
            metrics = requests.get(first.url + "/metrics", timeout=10)
            assert metrics.status_code == 200 and "cachesvc_http_requests_total" in metrics.text
        assert not (tmp_path / "home" / ".gunicorn").exists(), "no control socket shared through HOME"
    finally:
        first.stop()
    assert not folders[0].exists()
