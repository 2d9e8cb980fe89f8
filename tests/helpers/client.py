"""The client tests' containers and files: a process made to look like a fresh container, the files a warm
process leaves, a client of a live service, a port nothing listens on, blob bytes, a Python child's answer.
"""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from cachesvc_client import CacheClient

NAME, SHAPE = "mlp", "f32[8,256]"


def enter_container(monkeypatch, root: Path) -> Path:
    """Make this process look like a fresh container rooted at ``root`` (own HOME, TMPDIR, cache dir)."""
    for sub in ("home", "tmp", "cache"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HOME", str(root / "home"))
    monkeypatch.setenv("TMPDIR", str(root / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(root / "tmp"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "cache"))
    # Triton's own dir in the container's HOME, set as a container's own (unset, ~/.triton is the host's
    # shared default, which a publish leaves out: publish.host_default)
    monkeypatch.setenv("TRITON_HOME", str(root / "home"))
    for var in ("TRITON_CACHE_DIR", "CUDA_CACHE_PATH"):
        monkeypatch.delenv(var, raising=False)
    return root


def write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def fill(root: Path) -> dict:
    """Files like a warm CPU/GPU process leaves, in every root; returns {abs path: bytes} of what must travel."""
    user = os.environ.get("USER") or __import__("getpass").getuser()
    files = {
        root / "cache/fxgraph/3a/fkey/entry": b"fx" * 500,
        root / "cache/aotautograd/akey/entry": b"aot" * 300,
        root / "cache/sj/csj.main.cpp": b"int main(){}" * 50,
        root / "cache/sj/csj.main.so": b"\x7fELF" + os.urandom(20000),
        root / "cache/triton/0/KEY/kernel.cubin": os.urandom(4000),
        root / f"tmp/torchinductor_{user}/precompiled_headers/cgd6.h": b"#include <x>\n",
        root / f"tmp/torchinductor_{user}/precompiled_headers/cgd6.h.gch": b"G" * 300000,
        root / "home/.triton/cache/LAUNCH/launcher.so": os.urandom(3000),
    }
    for p, d in files.items():
        write(p, d, 0o755 if p.suffix == ".so" else 0o644)
    # junk and things that must not travel
    write(root / "cache/locks/abc.lock", b"")
    write(root / "cache/sj/csj.main.so.12.34.tmp", b"half")
    write(root / f"tmp/torchinductor_{user}/precompiled_headers/locks/cgd6.lock", b"")
    (root / "cache/link.so").symlink_to(root / "cache/sj/csj.main.so")
    return files


def client_for(url: str, **kw) -> CacheClient:
    return CacheClient(url, timeout=kw.pop("timeout", 10), **kw)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def blob_bytes(size: int, seed: int = 1) -> bytes:
    """Compressible but not trivial content (random runs between repeated tokens)."""
    rng = random.Random(seed)
    vocab = [rng.randbytes(16) for _ in range(64)]
    out = bytearray()
    while len(out) < size:
        out += rng.randbytes(512) if rng.random() < 0.1 else b"".join(rng.choices(vocab, k=256))
    return bytes(out[:size])


def run_python(code: str, env=None, python: str = sys.executable) -> dict:
    proc = subprocess.run([python, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
