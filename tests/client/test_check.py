"""Will it hit here? (issue 28, item 3): `cachesvc-client check` and CacheClient.check() resolve without
downloading, and give the verdict the restore that follows them gives: on a hit and on each kind of miss."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cachesvc_client import CacheClient
from cachesvc_client.shared import signing
from tests.helpers import ENV

NAME, SHAPE = "gate", "f32[8,8]"
pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]


def cli(*args, env_extra=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESVC_")}
    return subprocess.run([sys.executable, "-m", "cachesvc_client.cli", *args], capture_output=True, text=True,
                          env={**env, **(env_extra or {})})


@pytest.fixture
def gate(live_server, tmp_path, monkeypatch):
    """Publish one version (signed by key 'ci'); returns (run check+restore by CLI, the tmp folder)."""
    for name in ("ci", "other"):
        signing.keygen(str(tmp_path / name), f"{name}@build")
    src = tmp_path / "src"
    (src / "fxgraph").mkdir(parents=True)
    (src / "fxgraph/entry").write_bytes(b"graph" * 300)
    (src / "kernel.so").write_bytes(b"\x7fELF" + os.urandom(3000))
    monkeypatch.setenv(signing.SIGNING_KEY_VAR, str(tmp_path / "ci"))
    CacheClient(live_server.url).publish(NAME, SHAPE, env=ENV, roots={"inductor": str(src)})
    monkeypatch.delenv(signing.SIGNING_KEY_VAR)
    counter = iter(range(1000))

    def pair(env: dict, *, shape: str = SHAPE, **variables) -> tuple:
        """`check --json` then `restore --json` with this env file and these variables: their outcomes."""
        n = next(counter)
        env_file = tmp_path / f"env{n}.json"
        env_file.write_text(json.dumps(env))
        common = ["--url", live_server.url, "--name", NAME, "--shape", shape, "--env-file", str(env_file),
                  "--cache-dir", str(tmp_path / f"cache{n}"), "--json"]
        checked = cli("check", *common, env_extra=variables)
        assert not (tmp_path / f"cache{n}").exists(), "check writes nothing"
        restored = cli("restore", *common, env_extra=variables)
        assert checked.returncode in (0, 1), checked.stderr
        return checked, json.loads(checked.stdout), restored, json.loads(restored.stdout)

    return pair, tmp_path


def test_check_gives_the_verdict_the_restore_then_gives(gate):
    pair, tmp = gate
    # a hit: the entry, version and bytes it would move
    checked, c, restored, r = pair(ENV)
    assert checked.returncode == 0 and c["hit"] and r["hit"] and c["version_id"] == r["version_id"]
    assert c["files"] == r["files"] and c["bytes"] == r["bytes"] and c["bytes_written"] == r["bytes_written"]
    assert "signed by SHA256:" in c["signature"] and c["signed_by"] == r["signed_by"]
    # no entry
    checked, c, restored, r = pair(ENV, shape="f32[1,1]")
    assert checked.returncode == 1 and not c["hit"] and not r["hit"] and c["reason"] == r["reason"]
    assert c["nearest"]["differs"] == [{"field": "shape", "wanted": "f32[1,1]", "have": SHAPE}]
    # the environment differs: torch and the GPU, field by field
    other = {**ENV, "torch": "2.14.0", "device": "NVIDIA H200"}
    checked, c, restored, r = pair(other)
    assert checked.returncode == 1 and not c["hit"] and not r["hit"] and c["reason"] == r["reason"]
    assert {d["field"] for d in c["nearest"]["differs"]} == {"torch", "device"}
    # a signature this client does not trust
    trusted = tmp / "trusted"
    trusted.write_text(Path(f"{tmp / 'other'}.pub").read_text())
    checked, c, restored, r = pair(ENV, CACHESVC_TRUSTED_KEYS=str(trusted))
    assert checked.returncode == 1 and c["refused"] and r["refused"] and not r["hit"] and c["reason"] == r["reason"]
    assert "not among the trusted keys" in c["reason"] and r["files"] == 0
    # ... and one it does: a hit both ways
    trusted.write_text(Path(f"{tmp / 'ci'}.pub").read_text())
    checked, c, restored, r = pair(ENV, CACHESVC_TRUSTED_KEYS=str(trusted))
    assert checked.returncode == 0 and c["hit"] and r["hit"] and "trusted here" in c["signature"]
    # a required hit: the miss fails both
    checked, c, restored, r = pair(other, CACHESVC_REQUIRE_HIT="1")
    assert checked.returncode == 1 and c["required"] and restored.returncode == 1 and not r["hit"]
    assert c["reason"] in restored.stderr


def test_check_prints_the_nearest_entry_field_by_field_and_its_exit_codes(gate, live_server):
    _pair, tmp = gate
    env_file = tmp / "gpu.json"
    env_file.write_text(json.dumps({**ENV, "cuda": "12.8", "arch": "sm_90"}))
    args = ["--name", NAME, "--shape", SHAPE, "--tag", "mode=max", "--env-file", str(env_file)]
    out = cli("check", "--url", live_server.url, *args)
    assert out.returncode == 1, out.stderr
    assert "miss (no entry has this key)" in out.stdout and f"nearest: entry 1 {NAME} [{SHAPE}] version 1" in out.stdout
    for field in ("cuda", "arch", "tags"):
        assert f"    {field}" in out.stdout, out.stdout
    assert "signature: nearest entry's version: signed by SHA256:" in out.stdout
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    down = cli("check", "--url", dead, "--timeout", "2", *args)
    assert down.returncode == 3 and "cannot reach" in down.stderr and "Traceback" not in down.stderr
    env_file.write_text("{not json")
    assert cli("check", "--url", live_server.url, *args).returncode == 2
    assert cli("check", *args).returncode == 2  # no URL


def test_check_with_an_env_file_imports_no_torch_and_counts_no_restore(gate, live_server, app):
    _pair, tmp = gate
    env_file = tmp / "env.json"
    env_file.write_text(json.dumps(ENV))
    probe = ("import sys\nfrom cachesvc_client import cli\ntry:\n    cli.main(sys.argv[1:])\nexcept SystemExit as e:\n"
             "    code = e.code\nprint('TORCH' if 'torch' in sys.modules else 'NO-TORCH', code)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESVC_")}
    out = subprocess.run([sys.executable, "-c", probe, "check", "--url", live_server.url, "--name", NAME, "--shape",
                          SHAPE, "--env-file", str(env_file)], capture_output=True, text=True, env=env)
    assert out.stdout.strip().endswith("NO-TORCH 0"), out.stdout + out.stderr
    entry = CacheClient(live_server.url).api.entries(name=NAME)["entries"][0]
    assert entry["restore_count"] == 0  # a look is not a restore
