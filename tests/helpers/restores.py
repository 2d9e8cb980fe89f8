"""Files published and restored by real clients (the reliability tests', and the client tests' that restore
through faults): one key (``NAME``, ``SHAPE``, ``ENV``), files written, a restored cache dir checked whole.

Files are published under the ``inductor`` role only, so a restore puts them
in the restoring process's cache dir and nowhere else.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from cachesvc_client import CacheClient
from tests.helpers import ENV, sha

NAME, SHAPE = "ranker", "f32[8,256]"
#: the key's environment for subprocess clients (CacheClient reads CACHESVC_ENV_<FIELD>)
ENV_VARS = {f"CACHESVC_ENV_{k.upper()}": v for k, v in ENV.items()}


def make_files(root: Path, sizes: Dict[str, int]) -> Dict[str, bytes]:
    """Random (incompressible) files of the given sizes under ``root``; returns relpath -> bytes."""
    return write_files(root, {rel: os.urandom(size) for rel, size in sizes.items()})


def write_files(root: Path, files: Dict[str, bytes]) -> Dict[str, bytes]:
    """``files`` (relpath -> bytes) written under ``root``; returns them."""
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files


def publish_files(url: str, token: str, src: Path, name: str = NAME, merge: bool = False, **kw):
    """Publish everything under ``src`` as the ``inductor`` root of key (name, SHAPE, ENV).

    Without merge by default: each version is exactly its publisher's snapshot, so a test can tell
    which publisher's files a version holds (merged publishes under concurrency are
    tests/service/test_admission_merge_verdicts.py's)."""
    client = CacheClient(url, token, cache_dir=str(src), timeout=kw.pop("timeout", 30), **kw)
    return client.publish(name, SHAPE, env=ENV, roots={"inductor": str(src)}, merge=merge)


def restore_cli(url: str, env: Dict[str, str], *args: str, name: str = NAME, timeout: float = 120):
    """Run `cachesvc-client restore --json` as the app's init step; returns (exit code, report or None, seconds, stderr)."""
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "restore", "--name", name, "--shape", SHAPE,
                          "--url", url, "--json", *args], env={**env, **ENV_VARS}, capture_output=True, text=True,
                         timeout=timeout)
    seconds = time.monotonic() - t
    try:
        report = json.loads(out.stdout)
    except ValueError:
        report = None
    return out.returncode, report, seconds, out.stderr


def final_files(cache_dir: Path) -> Dict[str, Path]:
    """Files at their final paths in a cache dir: no restore temp files, no client state."""
    found = {}
    for p in cache_dir.rglob("*"):
        rel = p.relative_to(cache_dir).as_posix()
        if p.is_file() and not rel.startswith(".cachesvc/") and ".cachesvc-" not in p.name:
            found[rel] = p
    return found


def temp_files(cache_dir: Path) -> List[Path]:
    return [p for p in cache_dir.rglob("*") if ".cachesvc-" in p.name and p.name.endswith(".tmp")]


def assert_no_half_file(cache_dir: Path, files: Dict[str, bytes]) -> None:
    """Every file at a final path is one of the published files, whole."""
    for rel, path in final_files(cache_dir).items():
        assert rel in files, f"{rel} was never published"
        assert sha(path.read_bytes()) == sha(files[rel]), f"{rel} is at its final path but not whole"
