"""Publish cost and storage dedup, on a cachesvc service with S3 blobs (rclone on loopback).

    python bench/publish.py [--shapes 8,16,1,2,4,32] [--out FILE]

One container compiles the mlp at one batch size after another (each a new
key: ``mlp`` for batch 8, ``mlp-b<N>`` otherwise) and publishes after each:

  first      the cold compile's publish (everything is new)
  second     after one new input shape was compiled: only its new files should move
  unchanged  the second key published again with nothing new

then the remaining shapes. Storage compares, over all the shape variants,
the bytes the service stored (S3 listing) with the sum of unique file bytes
(by sha256), the sum of every version's bytes (no dedup) and the sum of one
.tar.zst per key (the hand-made alternative).
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import workdir, log, make_tarball, service, service_source, table, write_json  # noqa: E402
from bench.ttfi import container_roots  # noqa: E402
from cachesvc_client.process import roots as roots_mod  # noqa: E402
from harness.containers import Container  # noqa: E402
from harness.s3server import S3Server  # noqa: E402

PREFIX = "cachesvc"


def digests(ctr: Container) -> Dict[str, int]:
    """sha256 -> size of every file a publish of this container would send."""
    out = {}
    for path in container_roots(ctr).values():
        for _rel, abspath, size, _mode in roots_mod.walk(path):
            h = hashlib.sha256()
            with open(abspath, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            out[h.hexdigest()] = size
    return out


def zstd_size(ctr: Container, only: Dict[str, int]) -> int:
    """Bytes of the files in ``only`` (by digest) after zstd, as the client would store them."""
    import zstandard

    from cachesvc_client.codec.encoding import ZSTD_LEVEL, ZSTD_MIN_SAVING

    total, seen = 0, set()
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    for path in container_roots(ctr).values():
        for _rel, abspath, size, _mode in roots_mod.walk(path):
            data = Path(abspath).read_bytes()
            d = hashlib.sha256(data).hexdigest()
            if d in only and d not in seen:
                seen.add(d)
                packed = len(cctx.compress(data))
                total += packed if packed <= size * (1 - ZSTD_MIN_SAVING) else size
    return total


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="8,16,1,2,4,32", help="batch sizes; the first two are the publish test")
    p.add_argument("--out", default=None)
    p.add_argument("--workdir", default=None)
    p.add_argument("--service-ref", default="snapshot", help="snapshot | worktree | a git ref")
    args = p.parse_args(argv)
    shapes = [int(x) for x in args.shapes.split(",")]
    work = workdir(args.workdir, "bench-publish-")
    src_env = service_source(args.service_ref, work / "service-src")
    t0 = time.monotonic()
    steps: List[dict] = []
    try:
        with S3Server(work / "s3") as s3:
            bucket = s3.new_bucket("publish")
            with service(work / "svc", src_env, s3.service_env(bucket, PREFIX)) as svc:
                ctr = Container(work / "containers", "publisher")
                known: Dict[str, int] = {}
                tar_bytes = 0
                plan = [("first", shapes[0]), ("second", shapes[1]), ("unchanged", shapes[1])]
                plan += [("variant", b) for b in shapes[2:]]
                for step, batch in plan:
                    model = "mlp" if batch == 8 else f"mlp-b{batch}"
                    r = ctr.run_worker("--model", model, "--publish", **svc.client_env())
                    now = digests(ctr)
                    new = {d: s for d, s in now.items() if d not in known}
                    pub = r["publish"]
                    row = {"step": step, "model": model, "status": pub["status"], "files": pub["files"],
                           "bytes": pub["bytes"], "uploaded_blobs": pub["uploaded_blobs"],
                           "uploaded_bytes": pub["uploaded_bytes"], "seconds": pub["seconds"],
                           "first_call_s": r["first_call_s"], "new_files": len(new),
                           "new_bytes": sum(new.values()), "new_bytes_zstd": zstd_size(ctr, new) if new else 0}
                    row["x_new_bytes"] = row["uploaded_bytes"] / row["new_bytes"] if row["new_bytes"] else None
                    row["x_new_zstd"] = row["uploaded_bytes"] / row["new_bytes_zstd"] if row["new_bytes_zstd"] else None
                    if step != "unchanged":
                        tar = work / "t.tar.zst"
                        tar_bytes += make_tarball(tar, container_roots(ctr))["tar_zst_bytes"]
                        tar.unlink()
                    known.update(now)
                    steps.append(row)
                    log(f"publish {step:9} {model:8} {row['status']:9} uploaded {row['uploaded_blobs']:3} blobs "
                        f"{row['uploaded_bytes'] / 1e6:7.2f} MB in {row['seconds']:.2f} s; new files "
                        f"{row['new_files']} ({row['new_bytes'] / 1e6:.2f} MB raw, "
                        f"{row['new_bytes_zstd'] / 1e6:.2f} MB zstd)")
                stored = sum(o["Size"] for page in s3.client().get_paginator("list_objects_v2").paginate(
                    Bucket=bucket, Prefix=f"{PREFIX}/v1/blobs/") for o in page.get("Contents", []))
                shutil.rmtree(ctr.root, ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    variants = [s for s in steps if s["step"] != "unchanged"]
    storage = {"variants": len(variants), "stored_bytes": stored, "unique_file_bytes": sum(known.values()),
               "sum_version_bytes": sum(s["bytes"] for s in variants), "tarball_per_key_bytes": tar_bytes}
    storage["x_unique"] = stored / storage["unique_file_bytes"]
    storage["x_sum_versions"] = stored / storage["sum_version_bytes"]
    print(table(["publish", "model", "status", "uploaded MB", "s", "new files", "new MB raw", "new MB zstd",
                 "up / new raw", "up / new zstd"],
                [[s["step"], s["model"], s["status"], s["uploaded_bytes"] / 1e6, s["seconds"], s["new_files"],
                  s["new_bytes"] / 1e6, s["new_bytes_zstd"] / 1e6, s["x_new_bytes"], s["x_new_zstd"]] for s in steps]))
    print(table(["storage", "MB"], [[k, v / 1e6 if k.endswith("bytes") else v] for k, v in storage.items()]),
          flush=True)
    doc = {"section": "publish", "steps": steps, "storage": storage, "seconds": time.monotonic() - t0}
    if args.out:
        write_json(Path(args.out), doc)
    return doc


if __name__ == "__main__":
    main()
