"""Restore transfer: cachesvc restore against raw boto3 and one tarball, same content, same S3.

    python bench/transfer.py [--sizes small,large] [--repeats 3] [--out FILE]

Each content set (bench/synth.py: ``small`` ~20 files / 156 MB, shaped like
the demo mlp cache; ``large`` ~3,100 files / ~500 MB) is published once
through a cachesvc service on S3 (rclone on loopback), and also uploaded
as one .tar.zst. Then, alternating, each way restores it into an empty folder:

  cachesvc        CacheClient.restore: resolve, presigned GETs, sha256-verified atomic placement
  boto3-threads   the very objects cachesvc stored, boto3 get_object on a 16-thread pool,
                  zstd-decoded and written (no verification; the listing is given for free);
                  a packed blob is a ranged get_object of its pack, so still one GET per file
  tarball         one get_object of the .tar.zst, stream-decoded and extracted
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (workdir, extract_tarball_stream, log, make_tarball, median, service, service_source,  # noqa: E402
                          table, write_json)
from bench import synth  # noqa: E402
from harness.s3server import S3Server  # noqa: E402

WAYS = ["cachesvc", "boto3-threads", "tarball"]
ENV = {"torch": "2.13.0+cpu", "triton": "none", "cuda": "none", "python": "3.11", "device": "cpu",
       "arch": "x86_64-bench"}  # a fixed fingerprint: no torch import needed here
PREFIX = "cachesvc"


def restore_cachesvc(url: str, token: str, name: str, dest: Path) -> dict:
    from cachesvc_client import CacheClient

    client = CacheClient(url, token=token, cache_dir=str(dest / "inductor"))
    saved, tempfile.tempdir = tempfile.tempdir, str(dest)  # the pch root lies under the temp dir (TMPDIR)
    try:
        report = client.restore(name, "synthetic", {}, env=ENV, strict=True)
    finally:
        tempfile.tempdir = saved
    return {"files": report.files, "bytes": report.bytes_written, "transferred": report.bytes}


def restore_boto3(s3: S3Server, bucket: str, listing: List[dict], dest: Path, workers: int = 16) -> dict:
    import zstandard

    client = s3.client(max_pool_connections=workers)

    def one(item: dict) -> int:
        target = dest / item["root"] / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        extra = {"Range": f"bytes={item['range'][0]}-{item['range'][1] - 1}"} if item.get("range") else {}
        body = client.get_object(Bucket=bucket, Key=item["key"], **extra)["Body"]
        with open(target, "wb") as out:
            if item["encoding"] == "zstd":
                dctx = zstandard.ZstdDecompressor()
                dec = dctx.decompressobj()
                for chunk in body.iter_chunks(1 << 20):
                    while chunk:  # large blobs are several zstd frames: a decompressobj decodes one
                        if dec.eof:
                            dec = dctx.decompressobj()
                        out.write(dec.decompress(chunk))
                        chunk = dec.unused_data if dec.eof else b""
            else:
                for chunk in body.iter_chunks(1 << 20):
                    out.write(chunk)
        return item["size"]

    with ThreadPoolExecutor(max_workers=workers) as pool:
        sizes = list(pool.map(one, listing))
    return {"files": len(sizes), "bytes": sum(sizes)}


def restore_tarball(s3: S3Server, bucket: str, key: str, dest: Path) -> dict:
    body = s3.client().get_object(Bucket=bucket, Key=key)["Body"]
    try:
        info = extract_tarball_stream(body, lambda role: str(dest / role))
    finally:
        body.close()
    return {"files": info["files"], "bytes": info["bytes_written"]}


def listing_of(url: str, token: str, name: str, cache_dir: Path) -> List[dict]:
    """The manifest and each blob's object key and encoding, as cachesvc stored them."""
    from cachesvc_client import CacheClient

    client = CacheClient(url, token=token, cache_dir=str(cache_dir))
    answer = client.api.resolve(client.key(name, "synthetic", {}, ENV))
    rows, seen = [], set()
    for f in answer["files"]:
        blob = answer["blobs"][f["sha256"]]
        suffix = ".zst" if blob["encoding"] == "zstd" else ""
        row = {"root": f["root"], "path": f["path"], "size": f["size"], "encoding": blob["encoding"],
               "key": f"{PREFIX}/v1/blobs/{f['sha256'][:2]}/{f['sha256']}{suffix}"}
        if blob.get("pack"):  # a packed blob: a ranged GET of its pack, still one GET per file
            pack = blob["pack_sha256"]
            row.update(key=f"{PREFIX}/v1/packs/{pack[:2]}/{pack}",
                       range=(blob["offset"], blob["offset"] + blob["stored_size"]))
        rows.append(row)
        seen.add(f["sha256"])
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed rounds first: the first read of each stored object comes from disk, not the page cache")
    p.add_argument("--out", default=None)
    p.add_argument("--workdir", default=None)
    p.add_argument("--service-ref", default="snapshot", help="snapshot | worktree | a git ref")
    args = p.parse_args(argv)
    work = workdir(args.workdir, "bench-transfer-")
    src_env = service_source(args.service_ref, work / "service-src")
    samples: List[dict] = []
    sets: Dict[str, dict] = {}
    t0 = time.monotonic()
    try:
        with S3Server(work / "s3") as s3:
            bucket = s3.new_bucket("transfer")
            with service(work / "svc", src_env, s3.service_env(bucket, PREFIX)) as svc:
                from cachesvc_client import CacheClient

                for size in args.sizes.split(","):
                    log(f"transfer: make and publish the {size} set")
                    info = synth.make(work / "src" / size, size)
                    name = f"synthetic-{size}"
                    pub = CacheClient(svc.url, token=svc.token, cache_dir=info["roots"]["inductor"]).publish(
                        name, "synthetic", {}, env=ENV, roots=info["roots"])
                    tar = work / f"{size}.tar.zst"
                    tar_info = make_tarball(tar, info["roots"])
                    s3.client().upload_file(str(tar), bucket, f"tar/{size}.tar.zst")
                    listing = listing_of(svc.url, svc.token, name, work / "scratch")
                    sets[size] = {"files": info["files"], "bytes": info["bytes"], "stored_bytes": pub.uploaded_bytes,
                                  "tar_zst_bytes": tar_info["tar_zst_bytes"]}
                    for rnd in range(-args.warmup, args.repeats):  # rounds below 0: warm-up, not counted
                        k = rnd % len(WAYS)
                        for way in WAYS[k:] + WAYS[:k]:
                            dest = work / "dest" / f"{size}-{way}-{rnd}"
                            dest.mkdir(parents=True)
                            t = time.perf_counter()
                            if way == "cachesvc":
                                got = restore_cachesvc(svc.url, svc.token, name, dest)
                            elif way == "boto3-threads":
                                got = restore_boto3(s3, bucket, listing, dest)
                            else:
                                got = restore_tarball(s3, bucket, f"tar/{size}.tar.zst", dest)
                            dt = time.perf_counter() - t
                            assert got["files"] == info["files"], (way, got, info["files"])
                            if rnd >= 0:
                                samples.append({"size": size, "way": way, "round": rnd, "seconds": dt, **got})
                            log(f"  {size:5} {way:14} {dt:6.3f} s  {got['files'] / dt:8.0f} files/s  "
                                f"{got['bytes'] / dt / 1e6:7.0f} MB/s" + ("  (warm-up)" if rnd < 0 else ""))
                            shutil.rmtree(dest)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    rows = []
    for size in sets:
        base = {w: median(s["seconds"] for s in samples if s["size"] == size and s["way"] == w) for w in WAYS}
        for way in WAYS:
            sec = base[way]
            n, nbytes = sets[size]["files"], sets[size]["bytes"]
            rows.append({"size": size, "way": way, "files": n, "mb": nbytes / 1e6, "seconds": sec,
                         "files_per_s": n / sec, "mb_per_s": nbytes / sec / 1e6, "x_cachesvc": sec / base["cachesvc"]})
    print(table(["set / way", "files", "MB", "median s", "files/s", "MB/s", "time / cachesvc"],
                [[f"{r['size']} {r['way']}", r["files"], r["mb"], r["seconds"], r["files_per_s"], r["mb_per_s"],
                  r["x_cachesvc"]] for r in rows]), flush=True)
    doc = {"section": "transfer", "repeats": args.repeats, "warmup": args.warmup, "sets": sets, "rows": rows, "samples": samples,
           "seconds": time.monotonic() - t0}
    if args.out:
        write_json(Path(args.out), doc)
    return doc


if __name__ == "__main__":
    main()
