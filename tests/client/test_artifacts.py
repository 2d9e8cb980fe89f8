"""Artifact kinds through the client, without compiling: publish a file of a kind, restore it, the loader's checks.

The real torch.compile round trips of every kind are in tests/e2e/test_artifact_kinds.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachesvc_client import CacheClient, CacheClientError, errors, load_precompiled
from cachesvc_client.process import torch_support
from cachesvc_client.publish.onefile import publish_file
from tests.helpers.client import enter_container
from tests.helpers import ENV
from tests.helpers.backends import one_backend
from tests.helpers.client import enter_container

NAME, SHAPE = "mlp", "f32[8,256]"


@one_backend
def test_a_precompiled_file_travels_with_its_metadata_and_only_resolves_by_its_kind(live_server, tmp_path,
                                                                                     monkeypatch):
    enter_container(monkeypatch, tmp_path / "a")
    made = tmp_path / "fn.aot"
    made.write_bytes(b"compiled function" * 100)
    client = CacheClient(live_server.url, timeout=10)
    published = client.publish_precompiled(NAME, SHAPE, str(made), "aot-function", example_inputs=(),
                                           device="cpu", env=ENV)
    assert published.status == "committed" and published.kind == "aot-function" and published.files == 1
    again = client.publish_precompiled(NAME, SHAPE, str(made), "aot-function", device="cpu", env=ENV)
    assert again.status == "unchanged"

    enter_container(monkeypatch, tmp_path / "b")
    fresh = CacheClient(live_server.url, timeout=10)
    assert fresh.restore(NAME, SHAPE, env=ENV).reason == "the entry has no committed version"
    got = fresh.restore(NAME, SHAPE, env=ENV, kind="aot-function")
    assert got.hit and got.kind == "aot-function" and got.version_id == published.version_id
    [path] = got.artifacts
    assert path.startswith(str(tmp_path / "b" / "cache" / ".cachesvc" / "artifacts" / "aot-function"))
    assert os.path.basename(path) == "function.aot" and Path(path).read_bytes() == made.read_bytes()
    import torch

    assert got.meta["torch"] == torch.__version__ and got.meta["device"] == "cpu"
    assert "aot-function hit" in got.summary()
    assert not fresh.restore(NAME, SHAPE, env=ENV, kind="pt2-package").hit
    enter_container(monkeypatch, tmp_path / "c")  # an init container fetches it with the CLI
    env = dict(os.environ, **{f"CACHESVC_ENV_{k.upper()}": v for k, v in ENV.items()})
    out = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "restore", "--name", NAME, "--shape", SHAPE,
                          "--kind", "aot-function", "--url", live_server.url, "--json"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    [cli_path] = json.loads(out.stdout)["artifacts"]
    assert cli_path.startswith(str(tmp_path / "c")) and Path(cli_path).read_bytes() == made.read_bytes()
    with pytest.raises(ValueError, match="load_precompiled"):
        fresh.restore(NAME, SHAPE, env=ENV, kind="aot-function", load=True)
    with pytest.raises(ValueError, match="kind must be one of"):
        fresh.restore(NAME, SHAPE, env=ENV, kind="torchscript")


def test_load_precompiled_says_why_it_cannot_load(tmp_path, monkeypatch):
    import torch

    path = tmp_path / "fn.aot"
    path.write_bytes(b"not a pickle")
    with pytest.raises(errors.Unsupported, match="made by torch 2.0.0; this process has torch"):
        load_precompiled(str(path), kind="aot-function", meta={"torch": "2.0.0"})
    with pytest.raises(errors.LoadFailed, match="could not load the aot-function artifact"):
        load_precompiled(str(path), kind="aot-function", meta={"torch": torch.__version__})
    if not torch.cuda.is_available():
        with pytest.raises(errors.Unsupported, match="no CUDA device"):
            load_precompiled(str(path), kind="pt2-package", meta={"device": "cuda"})
    with pytest.raises(ValueError, match="kind must be one of aot-function, pt2-package"):
        load_precompiled(str(path), kind="mega-cache")
    # an older torch without the API (2.11 lacks some): feature detection, not the version string
    monkeypatch.delattr(torch.compiler, "load_compiled_function")
    assert "torch.compiler.load_compiled_function" in torch_support.support("aot-function")
    with pytest.raises(errors.Unsupported, match="has no torch.compiler.load_compiled_function.*inductor-dir"):
        load_precompiled(str(path), kind="aot-function", meta={"torch": torch.__version__})
    assert torch_support.support("mega-cache") is None and torch_support.support("inductor-dir") is None


@one_backend
def test_mega_cache_load_failure_is_a_miss_unless_strict(live_server, tmp_path, monkeypatch):
    enter_container(monkeypatch, tmp_path / "a")
    blob = tmp_path / "mega.bin"
    blob.write_bytes(b"not a mega-cache")
    client = CacheClient(live_server.url, timeout=10)
    publish_file(client.api, client.key(NAME, SHAPE, env=ENV), "mega-cache", path=str(blob),
                 meta={"torch": "x"})
    fetched = client.restore(NAME, SHAPE, env=ENV, kind="mega-cache")
    assert fetched.hit and fetched.loaded is None
    miss = client.restore(NAME, SHAPE, env=ENV, kind="mega-cache", load=True)
    assert not miss.hit and "load_cache_artifacts refused" in miss.reason
    with pytest.raises(errors.LoadFailed):
        client.restore(NAME, SHAPE, env=ENV, kind="mega-cache", load=True, strict=True)
