"""cachesvc_client.process.fingerprint: environment() and shape_signature()."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cachesvc_client.process import fingerprint
from cachesvc_client.process.fingerprint import FIELDS, environment, shape_signature
from tests.helpers.client import run_python

CLIENT_DIR = Path(fingerprint.__file__).resolve().parent


@pytest.fixture
def clean_overrides(monkeypatch):
    for name in list(os.environ):
        if name.startswith("CACHESVC_ENV_"):
            monkeypatch.delenv(name)


# ------------------------------------------------------------------ environment


def test_fields_match_the_key_rules():
    from cachesvc_client.shared import keys

    assert FIELDS == keys.ENV_FIELDS


def test_environment_of_this_process(clean_overrides):
    env = environment()
    assert list(env) == list(FIELDS)
    assert all(isinstance(v, str) and v for v in env.values())
    assert env["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    try:
        import torch
    except ImportError:
        assert env["torch"] == env["cuda"] == "none"
        assert env["device"] == platform.machine()
        return
    assert env["torch"] == torch.__version__
    if torch.version.cuda:
        assert env["cuda"] == "cuda-" + ".".join(torch.version.cuda.split(".")[:2])
    elif torch.version.hip:
        assert env["cuda"].startswith("hip-")
    else:
        assert env["cuda"] == "none"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        assert env["device"] == torch.cuda.get_device_name(0)
        if not torch.version.hip:
            assert env["arch"] == f"sm_{major}{minor}"
    else:
        assert env["device"] == platform.machine()
        assert env["arch"] == torch.backends.cpu.get_cpu_capability().lower()
    try:
        import triton
    except ImportError:
        assert env["triton"] == "none"
    else:
        assert env["triton"] == triton.__version__


def test_every_field_can_be_overridden(monkeypatch, clean_overrides):
    fake = {"torch": "9.9.9", "triton": "3.9.0", "cuda": "cuda-13.0", "python": "3.99",
            "device": "NVIDIA Imaginary", "arch": "sm_120"}
    for field, value in fake.items():
        monkeypatch.setenv(f"CACHESVC_ENV_{field.upper()}", value)
    assert environment() == fake


def test_one_override_leaves_the_rest_alone(monkeypatch, clean_overrides):
    real = environment()
    monkeypatch.setenv("CACHESVC_ENV_DEVICE", "fake-device")
    env = environment()
    assert env["device"] == "fake-device"
    assert {k: v for k, v in env.items() if k != "device"} == {k: v for k, v in real.items() if k != "device"}


def test_empty_override_is_ignored(monkeypatch, clean_overrides):
    monkeypatch.setenv("CACHESVC_ENV_PYTHON", "")
    assert environment()["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"


def test_import_does_not_import_torch():
    out = run_python("""
        import json, sys
        import cachesvc_client.process.fingerprint, cachesvc_client.process.roots
        print(json.dumps({"torch": "torch" in sys.modules, "triton": "triton" in sys.modules}))
    """)
    assert out == {"torch": False, "triton": False}


def test_triton_version_is_read_without_importing_triton(tmp_path):
    """A CUDA build of torch brings triton; the fingerprint reads its version from the distribution's
    metadata, so a process that loads a precompiled package never imports it (its own import time)."""
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text("raise RuntimeError('triton was imported')\n")
    dist = tmp_path / "triton-3.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: triton\nVersion: 3.9.9\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESVC_ENV_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + [p for p in sys.path if p])
    out = run_python("""
        import json, sys
        from cachesvc_client.process import fingerprint
        print(json.dumps({"triton": fingerprint._triton_version(), "imported": "triton" in sys.modules}))
    """, env=env)
    assert out == {"triton": "3.9.9", "imported": False}


def test_fully_overridden_environment_never_imports_torch(clean_overrides):
    env = dict(os.environ)
    for field in FIELDS:
        env[f"CACHESVC_ENV_{field.upper()}"] = f"fake-{field}"
    out = run_python("""
        import json, sys
        from cachesvc_client.process.fingerprint import environment
        e = environment()
        print(json.dumps({"env": e, "torch": "torch" in sys.modules}))
    """, env=env)
    assert out == {"env": {f: f"fake-{f}" for f in FIELDS}, "torch": False}


def _python_without_torch():
    """Another Python >= 3.9 on this machine that cannot import torch, or None."""
    candidates = [getattr(sys, "_base_executable", None), shutil.which("python3"), "/usr/bin/python3"]
    for exe in candidates:
        if not exe or not os.path.exists(exe):
            continue
        probe = subprocess.run([exe, "-c", "import sys; assert sys.version_info >= (3, 9)\n"
                                "try:\n import torch\nexcept ImportError:\n sys.exit(0)\nsys.exit(1)"],
                               capture_output=True, timeout=60)
        if probe.returncode == 0:
            return exe
    return None


def test_environment_without_torch(tmp_path):
    """A real interpreter without torch: the module is stdlib-only and says "none"."""
    python = _python_without_torch()
    if python is None:
        pytest.skip("no Python without torch on this machine")
    out = run_python(f"""
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("fp", {str(CLIENT_DIR / "fingerprint.py")!r})
        fp = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fp)
        print(json.dumps({{"env": fp.environment(), "sig": fp.shape_signature([1, 2.0], {{"k": True}})}}))
    """, env={k: v for k, v in os.environ.items() if not k.startswith(("CACHESVC_ENV_", "PYTHON"))},
        python=python)
    env = out["env"]
    assert env["torch"] == "none" and env["cuda"] == "none"
    assert env["device"] == platform.machine()
    assert env["arch"] in ("avx512", "avx2", "sve", "neon", "unknown")
    assert out["sig"] == "int,float,k=bool"


@pytest.mark.parametrize("text, isa", [
    ("processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 avx512f avx512bw\n", "avx512"),
    ("processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n", "avx2"),
    ("processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve\n", "sve"),
    ("processor\t: 0\nFeatures\t: fp asimd evtstrm aes\n", "neon"),
    ("processor\t: 0\nflags\t\t: fpu sse sse2\n", "unknown"),
    ("", "unknown"),
])
def test_cpuinfo_fallback(tmp_path, text, isa):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert fingerprint._cpuinfo_isa(str(path)) == isa


def test_cpuinfo_fallback_missing_file(tmp_path):
    assert fingerprint._cpuinfo_isa(str(tmp_path / "absent")) == "unknown"


# -------------------------------------------------------------- shape signature


class FakeTensor:
    """Anything with .shape and .dtype counts as a tensor."""

    def __init__(self, dtype, *shape):
        self.dtype = dtype
        self.shape = shape


def test_duck_typed_tensors():
    assert shape_signature(FakeTensor("torch.float32", 8, 256)) == "f32[8,256]"
    assert shape_signature(FakeTensor("torch.float32")) == "f32[]"
    assert shape_signature(FakeTensor("float16", 1), FakeTensor("torch.int64", 3, 4)) == "f16[1],i64[3,4]"
    assert shape_signature(FakeTensor("torch.float8_e4m3fn", 2)) == "float8_e4m3fn[2]"
    assert shape_signature(FakeTensor("torch.float32", "s0", 4)) == "f32[s0,4]"


def test_all_short_dtype_names():
    names = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64",
             "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "b8", "complex64": "c64"}
    for long, short in names.items():
        assert shape_signature(FakeTensor(f"torch.{long}", 2)) == f"{short}[2]"


def test_nesting_and_scalars():
    t = FakeTensor("torch.float32", 2)
    assert shape_signature() == ""
    assert shape_signature([t, (t, [t])]) == "f32[2],f32[2],f32[2]"
    assert shape_signature({"b": t, "a": [t, 3]}) == "a=f32[2],a=int,b=f32[2]"
    assert shape_signature({"outer": {"y": t, "x": 1.5}}) == "outer=x=float,outer=y=f32[2]"
    assert shape_signature(True, 1, 2.5, None, "s") == "bool,int,float,NoneType,str"
    # Values of scalars do not matter; their types do.
    assert shape_signature(1) == shape_signature(2)
    assert shape_signature(1) != shape_signature(1.0)


def test_dict_key_order_does_not_matter():
    t, u = FakeTensor("torch.float32", 1), FakeTensor("torch.int32", 2)
    assert shape_signature({"x": t, "y": u}) == shape_signature({"y": u, "x": t}) == "x=f32[1],y=i32[2]"


def test_real_torch_tensors():
    torch = pytest.importorskip("torch")
    x = torch.randn(8, 256)
    assert shape_signature(x) == "f32[8,256]"
    assert shape_signature(x.half(), x.to(torch.bfloat16), x.double()) == "f16[8,256],bf16[8,256],f64[8,256]"
    assert shape_signature(torch.zeros(3, dtype=torch.bool), torch.tensor(1)) == "b8[3],i64[]"
    assert shape_signature(torch.zeros(2, dtype=torch.uint8), torch.zeros(2, dtype=torch.complex64)) == "u8[2],c64[2]"
    assert shape_signature(torch.zeros(1, dtype=torch.float8_e4m3fn)) == "float8_e4m3fn[1]"
    assert shape_signature({"ids": torch.zeros(2, 5, dtype=torch.int64), "mask": torch.ones(2, 5, dtype=torch.int8)}) \
        == "ids=i64[2,5],mask=i8[2,5]"


def test_numpy_arrays():
    np = pytest.importorskip("numpy")
    assert shape_signature(np.zeros((2, 3), dtype=np.float32), np.zeros(4, dtype=np.int16)) == "f32[2,3],i16[4]"
