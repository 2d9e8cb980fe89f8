"""A hit you can require (issue 28, item 2): restore(require_hit=True) and CACHESVC_REQUIRE_HIT=1 make a miss
an error that names why, in the library and in `cachesvc-client restore`; default off."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cachesvc_client import CacheClient, HitRequired
from tests.helpers import ENV

NAME, SHAPE = "required", "f32[2,2]"
local_only = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]


def published(url: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "fxgraph").mkdir(parents=True)
    (src / "fxgraph/entry").write_bytes(b"graph" * 50)
    assert CacheClient(url).publish(NAME, SHAPE, env=ENV, roots={"inductor": str(src)}).status == "committed"


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@local_only[0]
@local_only[1]
def test_a_required_hit_raises_on_a_miss_naming_why(live_server, tmp_path, monkeypatch):
    client = CacheClient(live_server.url, cache_dir=str(tmp_path / "c"), timeout=10)
    with pytest.raises(HitRequired, match="a hit is required .*no entry has this key") as err:
        client.restore(NAME, SHAPE, env=ENV, require_hit=True)
    assert err.value.report is not None and not err.value.report.hit and err.value.code == "hit_required"
    assert not client.restore(NAME, SHAPE, env=ENV).hit  # default off: a miss, no exception
    monkeypatch.setenv("CACHESVC_REQUIRE_HIT", "yes")
    with pytest.raises(HitRequired, match="no entry has this key"):
        client.restore(NAME, SHAPE, env=ENV)
    assert not client.restore(NAME, SHAPE, env=ENV, require_hit=False).hit  # the argument wins
    published(live_server.url, tmp_path)
    assert client.restore(NAME, SHAPE, env=ENV).hit  # a hit passes
    monkeypatch.setenv("CACHESVC_REQUIRE_HIT", "0")
    assert not client.restore(NAME, "f32[9,9]", env=ENV).hit


def test_a_required_hit_raises_when_the_service_is_down(tmp_path, monkeypatch):
    monkeypatch.setenv("CACHESVC_REQUIRE_HIT", "1")
    client = CacheClient(dead_url(), cache_dir=str(tmp_path / "c"), timeout=2, connect_timeout=0.5)
    with pytest.raises(HitRequired, match="cannot reach") as err:
        client.restore(NAME, SHAPE, env=ENV)
    assert err.value.report.service_down


def _cli(args, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("CACHESVC_")}
    return subprocess.run([sys.executable, "-m", "cachesvc_client.cli", *args], capture_output=True, text=True,
                          env={**full, **env})


@local_only[0]
@local_only[1]
def test_the_cli_restore_exits_1_on_a_miss_when_a_hit_is_required(live_server, tmp_path):
    env_file = tmp_path / "env.json"
    env_file.write_text(__import__("json").dumps(ENV))
    args = ["restore", "--url", live_server.url, "--name", NAME, "--shape", SHAPE, "--env-file", str(env_file),
            "--cache-dir", str(tmp_path / "c")]
    assert _cli(args).returncode == 0
    out = _cli(args, CACHESVC_REQUIRE_HIT="1")
    assert out.returncode == 1 and "no entry has this key" in out.stderr and "$CACHESVC_REQUIRE_HIT" in out.stderr
    assert "Traceback" not in out.stderr
    published(live_server.url, tmp_path)
    assert _cli(args, CACHESVC_REQUIRE_HIT="1").returncode == 0
