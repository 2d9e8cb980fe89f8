"""The alternatives to cachesvc, as hooks that harness/worker.py calls inside a fresh container.

    python harness/worker.py --model mlp --restore-hook bench.contenders:tarball_s3

Each ``--restore-hook`` runs before torch.compile and is timed as the
restore step; each reads what it needs from ``BENCH_*`` environment
variables that bench/ttfi.py sets. They return a small dict for the
RESULT line.
"""
from __future__ import annotations

import os
import shutil

from bench.common import extract_tarball_stream, s3_client


def copy_cache_dir() -> dict:
    """What most teams do: copy TORCHINDUCTOR_CACHE_DIR alone (from BENCH_COPY_FROM) into place."""
    src, dest = os.environ["BENCH_COPY_FROM"], os.environ["TORCHINDUCTOR_CACHE_DIR"]
    shutil.copytree(src, dest, dirs_exist_ok=True)
    files = sum(len(fs) for _, _, fs in os.walk(dest))
    return {"files": files}


def tarball_s3() -> dict:
    """One .tar.zst of every root per key, pulled from S3 with boto3 and stream-extracted."""
    from cachesvc_client.process import roots as roots_mod

    body = s3_client().get_object(Bucket=os.environ["BENCH_BUCKET"], Key=os.environ["BENCH_TAR_KEY"])["Body"]
    cache_dir = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    try:
        return extract_tarball_stream(body, lambda role: roots_mod.resolve_root(role, cache_dir))
    finally:
        body.close()


def megacache_s3_load() -> dict:
    """PyTorch's Mega-Cache: fetch the artifacts blob from S3, then torch.compiler.load_cache_artifacts."""
    import torch

    data = s3_client().get_object(Bucket=os.environ["BENCH_BUCKET"], Key=os.environ["BENCH_MEGA_KEY"])["Body"].read()
    info = torch.compiler.load_cache_artifacts(data)
    return {"bytes": len(data), "artifacts": _info(info)}


def megacache_save() -> dict:
    """After the first call: torch.compiler.save_cache_artifacts() into BENCH_MEGA_OUT."""
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return {"bytes": 0}
    data, info = saved
    out = os.environ["BENCH_MEGA_OUT"]
    with open(out, "wb") as f:
        f.write(data)
    return {"bytes": len(data), "artifacts": _info(info)}


def _info(info) -> dict:
    try:
        return {k: len(v) for k, v in vars(info).get("artifacts", {}).items()}
    except Exception:  # noqa: BLE001 - informational only
        return {}
