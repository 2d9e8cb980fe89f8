"""Shared by the benchmark scripts: the machine, statistics, tables, JSON, S3 and tarball helpers.

Nothing here is timed by itself; the scripts decide what a sample is.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ZSTD_LEVEL = 3  # the level cachesvc's client uses, so the tarball is compressed the same way


def machine() -> Dict[str, str]:
    """CPU model, cores, memory, Python and torch versions (torch read without importing it)."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 ** 2:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    from importlib.metadata import PackageNotFoundError, version

    def ver(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "-"

    return {"cpu": cpu, "cores": str(os.cpu_count()), "memory": mem, "os": platform.platform(),
            "python": platform.python_version(), "torch": ver("torch"), "boto3": ver("boto3"),
            "rclone": _rclone_version()}


def _rclone_version() -> str:
    try:
        from harness.s3server import rclone_binary

        out = subprocess.run([rclone_binary(), "version"], capture_output=True, text=True, timeout=10).stdout
        return out.split()[1] if out else "-"
    except Exception:  # noqa: BLE001 - informational only
        return "-"


def median(xs: Iterable[float]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def percentile(xs: Sequence[float], q: float) -> Optional[float]:
    """Nearest-rank percentile (q in 0..100)."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


def table(headers: List[str], rows: List[List[object]]) -> str:
    """A plain-text table, right-aligned numbers."""
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    out.append("  ".join("-" * w for w in widths))
    for r in cells:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(out)


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.2f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def workdir(given: Optional[str], prefix: str) -> Path:
    """An empty scratch folder: ``given`` (emptied first) or a new temp folder."""
    import shutil
    import tempfile

    work = Path(given or tempfile.mkdtemp(prefix=prefix))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False, default=str))
    os.replace(tmp, path)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------ S3 (boto3)


def s3_client(endpoint: Optional[str] = None, pool: int = 32):
    """A boto3 client for the loopback S3 server named by BENCH_S3_* (or ``endpoint``)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=endpoint or os.environ["BENCH_S3_ENDPOINT"],
        region_name=os.environ.get("BENCH_S3_REGION", "us-east-1"),
        aws_access_key_id=os.environ["BENCH_S3_KEY"], aws_secret_access_key=os.environ["BENCH_S3_SECRET"],
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, max_pool_connections=pool))


# ------------------------------------------------------------------ tarballs


def make_tarball(out_path: Path, roots: Dict[str, str]) -> Dict[str, int]:
    """Write ``out_path`` (.tar.zst): every file of each root under ``<role>/<relpath>``.

    Uses the client's walk (junk such as lock files left out), so it holds
    exactly the files a cachesvc publish would. Returns files and bytes.
    """
    import zstandard

    from cachesvc_client.process import roots as roots_mod

    files = size = 0
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=-1)
    with open(out_path, "wb") as raw, cctx.stream_writer(raw) as zw, tarfile.open(fileobj=zw, mode="w|") as tar:
        for role, path in roots.items():
            for rel, abspath, nbytes, _mode in roots_mod.walk(path):
                tar.add(abspath, arcname=f"{role}/{rel}", recursive=False)
                files += 1
                size += nbytes
    return {"files": files, "bytes": size, "tar_zst_bytes": out_path.stat().st_size}


def extract_tarball_stream(body, dest_for_role) -> Dict[str, int]:
    """Stream-extract a .tar.zst read from ``body`` (file-like); ``dest_for_role(role)`` -> folder."""
    import zstandard

    files = size = 0
    with zstandard.ZstdDecompressor().stream_reader(body) as zr, tarfile.open(fileobj=zr, mode="r|") as tar:
        for member in tar:
            role, _, rel = member.name.partition("/")
            if not member.isfile() or not rel:
                continue
            member.name = rel
            tar.extract(member, dest_for_role(role), filter="data")
            files += 1
            size += member.size
    return {"files": files, "bytes_written": size}


# ------------------------------------------------------------------ the service under test


def service_source(ref: Optional[str], dest: Path) -> Dict[str, str]:
    """Env for ServiceProcess that fixes which service code runs, whatever happens to the tree meanwhile.

    ``"snapshot"`` (the default of the scripts): the working tree's cachesvc/
    and migrations/ as they are now, copied into ``dest``. ``"worktree"``:
    the live working tree (no extra env). Any other value is a git ref,
    ``git archive``d into ``dest``. The copy is put first on the service's
    PYTHONPATH (migrations/ placed as cachesvc/migrations, as the package
    installs it), with PYTHONSAFEPATH so the cwd's cachesvc/ cannot shadow
    it. The client is always the working tree's.
    """
    if not ref or ref == "worktree":
        return {}
    dest.mkdir(parents=True, exist_ok=True)
    if ref == "snapshot":
        import shutil

        skip = shutil.ignore_patterns("__pycache__", "*.pyc")
        # "migrations" skipped in cachesvc/: on the GPU machine bench/gpu_setup.sh links it there
        shutil.copytree(REPO / "cachesvc", dest / "cachesvc", ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                                          "migrations"))
        shutil.copytree(REPO / "migrations", dest / "cachesvc" / "migrations", ignore=skip)
    else:
        import io

        data = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref, "cachesvc", "migrations"],
                              check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(dest, filter="data")
        (dest / "migrations").rename(dest / "cachesvc" / "migrations")
    # first on the path; what was on it stays after (where nothing is installed, the client and the wheels)
    path = os.pathsep.join(p for p in (str(dest), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "PYTHONSAFEPATH": "1"}  # safe path: not the cwd's cachesvc/


def describe_source(ref: str, paths: Sequence[str]) -> str:
    """Which code ran, for the report: a commit, and whether the tree differed from it."""
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True).stdout.strip()

    try:
        if ref in ("snapshot", "worktree"):
            dirty = git("status", "--porcelain", "--", *paths)
            head = git("rev-parse", "--short", "HEAD")
            return f"working tree at {head}" + (" + uncommitted changes" if dirty else "")
        return f"git {ref} ({git('rev-parse', '--short', ref)})"
    except OSError:
        return ref


def service(data_dir: Path, src_env: Dict[str, str], env: Optional[Dict[str, str]] = None, **kw):
    """A harness ServiceProcess running the code ``src_env`` names (see ``service_source``).

    A service from before bearer tokens has no `cachesvc token create`: none is made for it.
    """
    from harness.service import ServiceProcess

    src = src_env.get("PYTHONPATH", "").split(os.pathsep)[0]  # the copy; the caller's path follows it
    if src and not (Path(src) / "cachesvc" / "auth.py").exists():
        try:
            return ServiceProcess(data_dir, env={**src_env, **(env or {})}, write_token=False, **kw)
        except TypeError:  # a harness/service.py from before tokens
            pass
    return ServiceProcess(data_dir, env={**src_env, **(env or {})}, **kw)
