"""cachesvc_client.process.envfiles: the fingerprint without importing torch equals the one torch gives."""
from __future__ import annotations

import os
import platform

import pytest

from cachesvc_client.process import envfiles
from cachesvc_client.process.fingerprint import FIELDS
from tests.helpers.client import run_python


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("CACHESVC_ENV_") or name in ("ATEN_CPU_CAPABILITY", "CUDA_VISIBLE_DEVICES"):
            monkeypatch.delenv(name)


def test_same_key_as_the_torch_fingerprint_and_torch_stays_unimported(clean_env):
    out = run_python("""
        import json, sys
        from cachesvc_client.process import envfiles
        early = envfiles.environment()
        imported = "torch" in sys.modules or "triton" in sys.modules
        from cachesvc_client.process import fingerprint
        print(json.dumps({"early": early, "imported": imported, "torch": fingerprint.environment()}))
    """, env=dict(os.environ))
    assert out["imported"] is False
    assert out["early"] is not None and out["early"] == out["torch"]


def test_overrides_apply_as_in_the_fingerprint(monkeypatch, clean_env):
    monkeypatch.setenv("CACHESVC_ENV_DEVICE", "NVIDIA H200")
    monkeypatch.setenv("CACHESVC_ENV_ARCH", "sm_90")
    env = envfiles.environment()
    assert env["device"] == "NVIDIA H200" and env["arch"] == "sm_90" and set(env) == set(FIELDS)


def test_unsure_cases_give_none(monkeypatch, clean_env):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # torch may pick a lower capability: ask torch
    assert envfiles.environment() is None
    monkeypatch.setenv("CACHESVC_ENV_ARCH", "avx2")  # unless the field is overridden
    assert envfiles.environment()["arch"] == "avx2"


@pytest.mark.parametrize("flags, arch", [
    ({"avx2", "fma", "avx512f", "avx512vl", "avx512bw", "avx512dq"}, "avx512"),
    ({"avx2", "fma", "avx512f", "avx512bw"}, "avx2"),   # torch's AVX512 kernels need vl, bw and dq
    ({"avx2", "avx512f", "avx512vl", "avx512bw", "avx512dq"}, "default"),  # and fma, as AVX2 does
    ({"avx2", "fma"}, "avx2"),
    ({"sse4_2"}, "default"),
])
def test_cpu_capability_follows_torchs_rule(monkeypatch, clean_env, flags, arch):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the rule is mirrored for x86-64")
    monkeypatch.setattr(envfiles, "_cpuinfo_flags", lambda: flags)
    assert envfiles._cpu_arch() == arch


def _fake_torch(tmp_path, version_py: str):
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('envfiles must not import torch')\n")
    (pkg / "version.py").write_text(version_py)
    return {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_cuda_build_fields_come_from_torch_version_py(tmp_path, clean_env):
    env = _fake_torch(tmp_path, "from typing import Optional\n__version__ = '2.13.0+cu128'\n"
                                "cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n")
    out = run_python("""
        import json
        from cachesvc_client.process import envfiles
        print(json.dumps(envfiles.environment()))
    """, env=env)
    assert out["torch"] == "2.13.0+cu128" and out["cuda"] == "cuda-12.8"
    if not os.path.isdir("/proc/driver/nvidia/gpus"):  # no GPU: torch.cuda.is_available() is False
        assert out["device"] == platform.machine()


def test_rocm_builds_are_left_to_torch(tmp_path, clean_env):
    env = _fake_torch(tmp_path, "__version__ = '2.13.0+rocm6.2'\ncuda = None\nhip = '6.2.41133-dd7f95766'\n")
    assert run_python("""
        import json
        from cachesvc_client.process import envfiles
        print(json.dumps(envfiles.environment()))
    """, env=env) is None
