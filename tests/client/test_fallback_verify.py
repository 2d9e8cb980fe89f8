"""The client side of issue 7: miss explanations, fallback restores, admission, merge and verify."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cachesvc_client import CacheClient
from cachesvc_client.report import describe_differences
from cachesvc_client.verdicts import judge
from harness.containers import inherited_env
from tests.helpers.client import enter_container, write
from tests.helpers import ENV

LOCAL = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)

NAME = "mlp"


def client_for(server, **kw) -> CacheClient:
    return CacheClient(server.url, timeout=10, **kw)


def publish_files(server, monkeypatch, root, shape, files, **kw):
    """Container ``root`` with ``files`` (relpath under its cache dir -> bytes), published under ``shape``."""
    enter_container(monkeypatch, root)
    for rel, data in files.items():
        write(root / "cache" / rel, data)
    return client_for(server).publish(NAME, shape, env=ENV, **kw)


def test_differences_print_wanted_then_have_and_quote_values_with_spaces():
    assert describe_differences([{"field": "torch", "wanted": "2.13.0", "have": "2.13.1"},
                                 {"field": "device", "wanted": "NVIDIA H100 80GB HBM3", "have": "NVIDIA H200"}]) == \
        "torch 2.13.0 != 2.13.1, device 'NVIDIA H100 80GB HBM3' != 'NVIDIA H200'"


@LOCAL
def test_a_miss_reports_logs_and_prints_the_nearest_entries_and_what_differs(live_server, tmp_path, monkeypatch,
                                                                              caplog):
    publish_files(live_server, monkeypatch, tmp_path / "a", "f32[8,256]", {"fxgraph/g": b"g" * 100})
    enter_container(monkeypatch, tmp_path / "b")
    with caplog.at_level("INFO", logger="cachesvc_client"):
        report = client_for(live_server).restore(NAME, "f32[8,256]", env={**ENV, "torch": "2.13.1"})
    assert not report.hit and report.nearest[0]["differs"] == [
        {"field": "torch", "wanted": "2.13.1", "have": "2.13.0+cpu"}]
    assert "nearest: entry" in report.summary() and "torch 2.13.1 != 2.13.0+cpu" in report.summary()
    assert "torch 2.13.1 != 2.13.0+cpu" in caplog.text
    # the CLI prints it too
    env = inherited_env(("CACHESVC_", "TORCHINDUCTOR_"))
    env.update(CACHESVC_URL=live_server.url, CACHESVC_TOKEN=live_server.app.config["TOKENS"]["read"],
               **{f"CACHESVC_ENV_{k.upper()}": v for k, v in {**ENV, "device": "NVIDIA H200"}.items()})
    out = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "restore", "--name", NAME, "--shape",
                          "f32[8,256]", "--cache-dir", str(tmp_path / "cli")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "device 'NVIDIA H200' != x86_64" in out.stdout, out.stdout


@LOCAL
def test_a_second_miss_of_the_same_key_does_not_name_the_nearest_entries_again(live_server, tmp_path, monkeypatch,
                                                                                caplog):
    """The one call restores its package, then its snapshot: the log names the nearest entries once."""
    publish_files(live_server, monkeypatch, tmp_path / "a", "f32[8,256]", {"fxgraph/g": b"g" * 100})
    enter_container(monkeypatch, tmp_path / "b")
    client = client_for(live_server)
    with caplog.at_level("INFO", logger="cachesvc_client"):
        package = client.restore(NAME, "f32[4,256]", env=ENV, kind="pt2-package")
        snapshot = client.restore(NAME, "f32[4,256]", env=ENV)
    assert not package.hit and not snapshot.hit and package.nearest and snapshot.nearest
    misses = [r.getMessage() for r in caplog.records if ": miss (" in r.getMessage()]
    assert len(misses) == 2 and sum("f32[4,256] != f32[8,256]" in m for m in misses) == 1, misses
    assert misses[1].endswith("nearest: as above"), misses
    with caplog.at_level("INFO", logger="cachesvc_client"):
        client.restore(NAME, "f32[2,256]", env=ENV)  # another key: its own nearest line
    assert "f32[2,256] != f32[8,256]" in caplog.records[-1].getMessage()


@LOCAL
def test_fallback_shape_restores_another_shape_labelled_in_the_report(live_server, tmp_path, monkeypatch):
    publish_files(live_server, monkeypatch, tmp_path / "a", "f32[8,256]", {"fxgraph/g": b"g" * 100, "ab/k.so": b"k"})
    b = enter_container(monkeypatch, tmp_path / "b")
    client = client_for(live_server)
    assert not client.restore(NAME, "f32[4,256]", env=ENV).hit  # no fallback asked: a miss
    report = client.restore(NAME, "f32[4,256]", env=ENV, fallbacks=["shape", "name"])
    assert report.hit and report.fallback == "shape" and report.files == 2
    assert report.fallback_entries[0]["differs"] == [{"field": "shape", "wanted": "f32[4,256]", "have": "f32[8,256]"}]
    assert "fallback 'shape'" in report.summary() and "shape f32[4,256] != f32[8,256]" in report.summary()
    assert (b / "cache/fxgraph/g").read_bytes() == b"g" * 100
    assert client.api.call("GET", "/api/v1/stats")["fallbacks"] == 1


@LOCAL
def test_fallback_shapes_union_places_shared_paths_once_and_keeps_the_first_of_two_contents(
        live_server, tmp_path, monkeypatch):
    publish_files(live_server, monkeypatch, tmp_path / "a", "s1",
                  {"common/c.h": b"same", "clash/x": b"from s1", "only/s1": b"1"})
    publish_files(live_server, monkeypatch, tmp_path / "a2", "s2",
                  {"common/c.h": b"same", "clash/x": b"from s2", "only/s2": b"2"})
    for i in range(2):  # s1 is the most restored shape
        enter_container(monkeypatch, tmp_path / f"warm{i}")
        assert client_for(live_server).restore(NAME, "s1", env=ENV).hit
    b = enter_container(monkeypatch, tmp_path / "b")
    client = client_for(live_server)
    report = client.restore(NAME, "s3", env=ENV, fallbacks=["shapes"])
    assert report.fallback == "shapes" and len(report.versions) == 2
    assert (b / "cache/clash/x").read_bytes() == b"from s1"
    assert (b / "cache/only/s1").exists() and (b / "cache/only/s2").exists()
    assert report.files == 4 and not report.failed
    assert any("different content" in w and "inductor:clash/x" in w for w in report.warnings), report.warnings
    again = client.restore(NAME, "s3", env=ENV, fallbacks=["shapes"])  # same union: nothing moves
    assert again.files == 0 and again.files_present == 4


@LOCAL
def test_admission_skips_short_compiles_and_links_content_stored_under_another_key(
        live_server, tmp_path, monkeypatch):
    files = {"fxgraph/g": b"g" * 100}
    skipped = publish_files(live_server, monkeypatch, tmp_path / "a", "s1", files, compile_seconds=0.4,
                            min_compile_seconds=1.0)
    assert skipped.status == "skipped" and not skipped.admitted and "under the 1.00 s threshold" in skipped.reason
    monkeypatch.setenv("CACHESVC_MIN_COMPILE_SECONDS", "0.3")  # the env var sets the default threshold
    client = client_for(live_server)
    assert client.api.entries()["total"] == 0
    first = client.publish(NAME, "s1", env=ENV, compile_seconds=0.4)
    assert first.status == "committed" and first.admitted
    linked = client.publish(NAME, "s2", env=ENV, compile_seconds=5)
    assert linked.status == "linked" and linked.uploaded_blobs == 0 and linked.files == 1
    assert f"version {first.version_id}" in linked.reason and "uploaded nothing" in linked.reason
    b = enter_container(monkeypatch, tmp_path / "b")
    assert client_for(live_server).restore(NAME, "s2", env=ENV).hit
    assert (b / "cache/fxgraph/g").read_bytes() == b"g" * 100


@LOCAL
def test_processes_that_restored_and_compiled_more_converge_instead_of_forking(live_server, tmp_path, monkeypatch):
    v1 = publish_files(live_server, monkeypatch, tmp_path / "a", "s", {"fxgraph/x": b"x"})
    clients = {}
    for ctr in ("b", "c"):  # two processes restore v1 ...
        enter_container(monkeypatch, tmp_path / ctr)
        clients[ctr] = client_for(live_server)
        assert clients[ctr].restore(NAME, "s", env=ENV).version_id == v1.version_id
    published = []
    for ctr, added in (("b", "fxgraph/y"), ("c", "fxgraph/z")):  # ... each compiles another shape, publishes
        root = enter_container(monkeypatch, tmp_path / ctr)
        write(root / "cache" / added, added.encode())
        published.append(clients[ctr].publish(NAME, "s", env=ENV))
    assert [p.status for p in published] == ["committed", "committed"]
    listing = clients["c"].api.call("GET", f"/api/v1/versions/{published[-1].version_id}")
    assert {f["path"] for f in listing["files"]} == {"fxgraph/x", "fxgraph/y", "fxgraph/z"}  # not {x, z}
    # one that restores the newest and compiles nothing new creates no version
    enter_container(monkeypatch, tmp_path / "e")
    client = client_for(live_server)
    assert client.restore(NAME, "s", env=ENV).version_id == published[-1].version_id
    assert client.publish(NAME, "s", env=ENV).status == "unchanged"
    # a fallback restore plus what the process compiled is published whole under its own key
    root = enter_container(monkeypatch, tmp_path / "f")
    client = client_for(live_server)
    assert client.restore(NAME, "other", env=ENV, fallbacks=["shape"]).fallback == "shape"
    write(root / "cache/fxgraph/other", b"o")
    assert client.publish(NAME, "other", env=ENV).files == 4


@LOCAL
@pytest.mark.parametrize("counters, verdict", [
    ({"fxgraph_hits": 2, "fxgraph_misses": 0, "aotautograd_hits": 2, "aotautograd_misses": 0}, "paid_off"),
    ({"fxgraph_hits": 1, "fxgraph_misses": 1, "aotautograd_hits": 1, "aotautograd_misses": 1}, "partial"),
    ({"fxgraph_hits": 0, "fxgraph_misses": 2, "aotautograd_hits": 0, "aotautograd_misses": 2}, "no_hits"),
    ({"fxgraph_hits": 0, "fxgraph_misses": 0, "aotautograd_hits": 0, "aotautograd_misses": 0}, "not_compiled"),
])
def test_verify_judges_from_the_counters_and_counts_what_was_still_compiled(live_server, tmp_path, monkeypatch,
                                                                             counters, verdict):
    publish_files(live_server, monkeypatch, tmp_path / "a", "s", {"fxgraph/g": b"g", "ab/old.so": b"so"})
    b = enter_container(monkeypatch, tmp_path / "b")
    client = client_for(live_server)
    report = client.restore(NAME, "s", env=ENV)
    write(b / "cache/cd/new.so", b"rebuilt")                      # a C++ kernel built after the restore
    write(b / "cache/triton/0/KEY/kernel.cubin", b"sass")         # a Triton kernel compiled after it
    write(b / "cache/triton/0/KEY/kernel.json", b"{}")
    v = judge(report, client.cache_dir, counters={**counters, "triton_kernels": 1})
    assert v.verdict == verdict and v.versions == [report.version_id] and v.restored_files == 2
    assert v.cpp_builds == 1 and v.triton_compiles == 1 and v.new_files == {"inductor": 3}
    assert verdict in v.summary()


@LOCAL
def test_verify_without_a_restore_or_a_compile_reports_nothing(live_server, tmp_path, monkeypatch):
    enter_container(monkeypatch, tmp_path / "a")
    client = client_for(live_server)
    assert client.verify().verdict == "nothing_restored"
    assert client.restore(NAME, "none", env=ENV).hit is False
    verdict = client.verify()
    assert verdict.verdict == "nothing_restored" and not verdict.reported


@LOCAL
def test_verify_at_exit_logs_the_verdict_when_the_process_ends(live_server, tmp_path, monkeypatch):
    publish_files(live_server, monkeypatch, tmp_path / "a", "s", {"fxgraph/g": b"g"})
    b = enter_container(monkeypatch, tmp_path / "b")
    code = ("import logging, sys\nfrom cachesvc_client import CacheClient\nfrom tests.helpers import ENV\n"
            "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
            "r = CacheClient(sys.argv[1], timeout=10).restore('mlp', 's', env=ENV, verify_at_exit=True)\n"
            "assert r.hit\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "TORCHINDUCTOR_CACHE_DIR": str(b / "cache")}
    out = subprocess.run([sys.executable, "-c", code, live_server.url], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "verify mlp [s]: not_compiled" in out.stderr, out.stderr  # restored, but nothing compiled before exit
