"""cachesvc_client.process.keyenv: the key's environment from an env file, the overrides, or this process.

An init container without torch or a GPU reads ``torch none`` or ``device x86_64`` and keys
apart from its app; the env file the app image writes (``cachesvc-client env --json``) keys
it like the app. These tests pin the file's validation, the precedence and the miss message
that says which fields this process could not read.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import threading

import pytest

from cachesvc_client import CacheClient, load_env_file
from cachesvc_client.process import keyenv
from cachesvc_client.process.fingerprint import environment
from harness.containers import inherited_env
from tests.helpers import ENV

GPU = {**ENV, "torch": "2.13.0+cu128", "cuda": "cuda-12.8", "triton": "3.5.0", "device": "NVIDIA H200",
       "arch": "sm_90"}


@pytest.fixture(autouse=True)
def no_overrides(monkeypatch):
    for name in list(os.environ):
        if name.startswith("CACHESVC_ENV_"):
            monkeypatch.delenv(name)


def write(tmp_path, doc, name="env.json") -> str:
    path = tmp_path / name
    path.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return str(path)


def test_env_json_is_an_env_file_that_loads_as_this_process_environment(tmp_path):
    out = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "env", "--json"], capture_output=True,
                         text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                      if not k.startswith("CACHESVC_ENV_")})
    assert out.returncode == 0, out.stderr
    path = write(tmp_path, out.stdout.encode())
    assert load_env_file(path) == environment()
    # A CPU build says nothing; a CUDA build on a GPU-less runner warns that the file names no GPU (and
    # only that): the warnings are what write_warnings says of the environment written
    said = "".join(f"cachesvc-client: warning: {w}\n" for w in keyenv.write_warnings(json.loads(out.stdout)))
    assert out.stderr == said


@pytest.mark.parametrize("doc,says", [
    (b"", "not JSON"), (b"{torch: 1}", "not JSON"), (b"\xff\xfe{}", "not JSON"),
    ([ENV], "must be a JSON object"), ("x", "must be a JSON object"),
    ({k: v for k, v in ENV.items() if k != "arch"}, "missing field(s): arch"),
    ({**ENV, "gpu": "x"}, "unknown env field(s): gpu"),
    ({**ENV, "device": 7}, "env.device must be a string, got int"),
    ({**ENV, "torch": ""}, "env.torch must not be empty"),
    ({**ENV, "arch": "sm_90\n"}, "env.arch contains control characters"),
    ({**ENV, "python": "3" * 201}, "env.python is 201 characters long"),
    (b" " * (keyenv.MAX_ENV_FILE_BYTES + 1), "larger than"),
])
def test_a_bad_env_file_is_refused_whole_naming_the_file_and_the_field(tmp_path, doc, says):
    path = write(tmp_path, doc)
    with pytest.raises(keyenv.EnvError) as err:
        load_env_file(path)
    assert str(err.value).startswith(f"env file {path}: ") and says in str(err.value), err.value


def test_a_missing_env_file_says_how_to_write_one(tmp_path):
    with pytest.raises(keyenv.EnvError, match="cannot be read .*cachesvc-client env --json"):
        load_env_file(str(tmp_path / "nope.json"))


def test_overrides_win_over_the_file_and_a_bad_one_is_named_by_its_variable(tmp_path, monkeypatch):
    path = write(tmp_path, ENV)
    monkeypatch.setenv("CACHESVC_ENV_DEVICE", "NVIDIA H200")
    env, source = keyenv.key_environment(path, probe=lambda: pytest.fail("the file is used, nothing probed"))
    assert env == {**ENV, "device": "NVIDIA H200"} and source == path
    monkeypatch.setenv("CACHESVC_ENV_ARCH", "sm_90\x07")
    with pytest.raises(keyenv.EnvError, match=r"^\$CACHESVC_ENV_ARCH: env.arch contains control characters"):
        keyenv.key_environment(path, probe=dict)
    with pytest.raises(keyenv.EnvError, match=r"^\$CACHESVC_ENV_ARCH: "):
        keyenv.key_environment(None, probe=environment)  # the probe applies it: still named


def test_without_a_file_the_probe_answers_and_none_stays_none():
    assert keyenv.key_environment(None, probe=lambda: dict(ENV)) == (ENV, None)
    assert keyenv.key_environment(None, probe=lambda: None) == (None, None)  # envfiles could not tell


def nearest(differs, entry_id=3):
    return [{"entry": {"id": entry_id, "name": "mlp", "shape": "f32[8,256]"}, "version_id": 5,
             "differs": [{"field": f, "wanted": w, "have": h} for f, w, h in differs]}]


NO_TORCH = {**ENV, "torch": "none", "triton": "none", "cuda": "none", "arch": "avx512"}


def test_a_miss_only_by_fields_read_without_torch_or_gpu_says_so_and_how_to_fix_it():
    here = {**NO_TORCH, "arch": "avx512"}
    diff = [(f, here[f], GPU[f]) for f in ("torch", "triton", "cuda", "device", "arch")]
    hint = keyenv.unreadable_hint(here, None, nearest(diff))
    assert hint.startswith("this container could not read torch, triton, cuda (torch is not installed here) "
                           "and device, arch (no GPU is visible here)"), hint
    assert "entry 3" in hint and "torch 'none' != '2.13.0+cu128'" in hint
    assert "`cachesvc-client env --json > env.json`" in hint and "`--env-file env.json`" in hint
    assert "CACHESVC_ENV_DEVICE='NVIDIA H200' CACHESVC_ENV_ARCH=sm_90" in hint
    cpu_only = keyenv.unreadable_hint(here, None, nearest([("torch", "none", "2.13.0+cpu")]))
    assert "could not read torch (torch is not installed here)" in cpu_only and "CACHESVC_ENV_DEVICE" not in cpu_only


def test_a_miss_from_an_env_file_written_without_torch_names_the_file(tmp_path):
    hint = keyenv.unreadable_hint(NO_TORCH, "/etc/cachesvc/env.json", nearest([("torch", "none", "2.13.0+cpu")]))
    assert hint.startswith("the env file /etc/cachesvc/env.json was written where it could not read torch")
    assert "`cachesvc-client env --json > /etc/cachesvc/env.json`" in hint


@pytest.mark.parametrize("here,differs", [
    (ENV, [("torch", "2.13.0+cpu", "2.13.1+cpu")]),                        # another torch, read for real
    (NO_TORCH, [("torch", "none", "2.13.0+cpu"), ("python", "3.11", "3.12")]),  # and another python
    ({**ENV, "cuda": "none"}, [("cuda", "none", "cuda-12.8")]),             # a CPU build of torch here
    (ENV, [("device", "x86_64", "aarch64"), ("arch", "avx512", "neon")]),   # another CPU
])
def test_a_miss_with_a_real_difference_gets_no_hint(here, differs):
    assert keyenv.unreadable_hint(here, None, nearest(differs)) is None
    assert keyenv.unreadable_hint(here, None, []) is None


def test_writing_an_env_file_warns_without_torch_or_without_the_gpu_of_a_gpu_build():
    assert keyenv.write_warnings(ENV) == [] and keyenv.write_warnings(GPU) == []
    [no_torch] = keyenv.write_warnings(NO_TORCH)
    assert "torch is not installed here" in no_torch
    [no_gpu] = keyenv.write_warnings({**GPU, "device": "x86_64", "arch": "avx512"})
    assert "no GPU is visible" in no_gpu and "CACHESVC_ENV_DEVICE" in no_gpu and "CACHESVC_ENV_ARCH" in no_gpu


def test_a_bad_env_file_makes_restore_a_miss_and_strict_raises(tmp_path, caplog):
    client = CacheClient("http://127.0.0.1:9", cache_dir=str(tmp_path / "cache"),
                         env_file=write(tmp_path, {**ENV, "arch": 5}))
    report = client.restore("mlp", "f32[8,256]")
    assert not report.hit and report.reason.startswith("error: env file ") and "env.arch" in report.reason
    assert any("env.arch must be a string" in r.getMessage() for r in caplog.records)
    with pytest.raises(keyenv.EnvError):
        client.restore("mlp", "f32[8,256]", strict=True)
    with pytest.raises(keyenv.EnvError):
        client.publish("mlp", "f32[8,256]", roots={"inductor": str(tmp_path)})


def test_the_env_file_variable_is_the_default(tmp_path, monkeypatch):
    path = write(tmp_path, ENV)
    monkeypatch.setenv(keyenv.ENV_FILE_VAR, path)
    client = CacheClient("http://127.0.0.1:9", cache_dir=str(tmp_path / "cache"))
    assert client.env_file == path and client.environment() == ENV
    assert CacheClient(env_file=str(tmp_path / "other.json")).env_file == str(tmp_path / "other.json")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
def test_start_restore_with_an_env_file_keys_by_it_and_never_imports_torch(live_server, client, tmp_path):
    from tests.helpers import key, publish

    publish(client, {"fxgraph/a/entry": b"g" * 1000}, key("mlp", "f32[8,256]"))
    code = r'''
import importlib.abc, json, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, NoTorch())
from cachesvc_client import CacheClient
report = CacheClient(timeout=30).start_restore("mlp", "f32[8,256]").result()
print(json.dumps([report.hit, report.env_file, "torch" in sys.modules]))
'''
    env = inherited_env(("CACHESVC_", "TORCHINDUCTOR_"))
    env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"),
               CACHESVC_URL=live_server.url, CACHESVC_ENV_FILE=write(tmp_path, ENV))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [True, env["CACHESVC_ENV_FILE"], False]


@pytest.mark.parametrize("kind", ["nested", "fifo"])
def test_a_nested_or_fifo_env_file_is_a_miss_at_once_and_publish_refuses_it(tmp_path, kind):
    """60,000 ``[`` raised RecursionError out of restore() and publish(); a FIFO blocked the read (issue 26, row 7)."""
    path = tmp_path / "env.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(b"[" * 60_000)
    client = CacheClient("http://127.0.0.1:9", cache_dir=str(tmp_path / "cache"), env_file=str(path))
    done = []
    worker = threading.Thread(target=lambda: done.append(client.restore("mlp", "f32[8,256]")), daemon=True)
    worker.start()
    worker.join(30)  # a blocked read would still be blocked: the FIFO has no writer
    assert done, "restore() blocked on the env file"
    assert not done[0].hit and done[0].reason.startswith("error: env file ")
    with pytest.raises(keyenv.EnvError, match="nested too deeply|not a regular file"):
        client.publish("mlp", "f32[8,256]", roots={"inductor": str(tmp_path)})
