"""Restore of one synthetic set (small by default), an older client against this one, interleaved in one process.

    python bench/probes/transfer_ab.py --old-ref 4603fdf [--rounds 30] [--size small|large] [--seed-old 0 --seed-new 1]
                                [--out FILE]

On a small shared machine, runs of bench/transfer.py minutes apart differ more
than the change being measured. Here every round restores four ways back to
back, in rotating order, against one S3 server and one service (the working
tree's): the client at ``--old-ref`` (``git archive``d, imported as
``cachesvc_client_old``), restoring set A that it published itself; this
client restoring set B (same shape, other seed) that it published itself; and
boto3 threads and one .tar.zst (bench/transfer.py's ways) restoring set A.
Reports medians, ratios and the client process's CPU per restore.
"""
from __future__ import annotations

import argparse
import io
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import REPO, log, make_tarball, service, service_source, workdir, write_json  # noqa: E402
from bench import synth  # noqa: E402
from bench.transfer import ENV, PREFIX, listing_of, restore_boto3, restore_tarball  # noqa: E402
from harness.s3server import S3Server  # noqa: E402

WAYS = ["cachesvc-old", "cachesvc-new", "boto3-threads", "tarball"]


def old_client(ref: str, dest: Path):
    """The client package at ``ref``, importable as ``cachesvc_client_old`` (its imports are relative)."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref, "client"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest)
    (dest / "client").rename(dest / "cachesvc_client_old")
    sys.path.insert(0, str(dest))
    import cachesvc_client_old

    return cachesvc_client_old


def restore_with(mod, url: str, token: str, name: str, dest: Path) -> dict:
    client = mod.CacheClient(url, token=token, cache_dir=str(dest / "inductor"))
    saved, tempfile.tempdir = tempfile.tempdir, str(dest)  # the pch root lies under the temp dir (TMPDIR)
    try:
        report = client.restore(name, "synthetic", {}, env=ENV, strict=True)
    finally:
        tempfile.tempdir = saved
    assert not report.failed, report.failed
    return {"files": report.files, "bytes": report.bytes_written}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old-ref", required=True, help="git ref of the client to compare with")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--size", default="small", choices=["small", "large"], help="bench/synth.py's set")
    p.add_argument("--seed-old", type=int, default=0)
    p.add_argument("--seed-new", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import cachesvc_client

    work = workdir(None, "bench-transfer-ab-")
    samples: dict = {w: [] for w in WAYS}
    cpu: dict = {w: [] for w in WAYS}
    try:
        old = old_client(args.old_ref, work / "old-client")
        with S3Server(work / "s3") as s3:
            bucket = s3.new_bucket("transfer")
            with service(work / "svc", service_source("snapshot", work / "svc-src"), s3.service_env(bucket, PREFIX)) as svc:
                sets = {}
                for label, mod, seed in (("A", old, args.seed_old), ("B", cachesvc_client, args.seed_new)):
                    info = synth.make(work / "src" / label, args.size, seed)
                    mod.CacheClient(svc.url, token=svc.token, cache_dir=info["roots"]["inductor"]).publish(
                        f"{args.size}-{label}", "synthetic", {}, env=ENV, roots=info["roots"])
                    sets[label] = info
                make_tarball(work / "A.tar.zst", sets["A"]["roots"])
                s3.client().upload_file(str(work / "A.tar.zst"), bucket, "tar/A.tar.zst")
                listing = listing_of(svc.url, svc.token, f"{args.size}-A", work / "scratch")
                log(f"transfer_ab: {args.rounds} rounds of {', '.join(WAYS)}")
                for rnd in range(args.rounds):
                    k = rnd % len(WAYS)
                    for way in WAYS[k:] + WAYS[:k]:
                        dest = work / "dest" / f"{way}-{rnd}"
                        dest.mkdir(parents=True)
                        ru = resource.getrusage(resource.RUSAGE_SELF)
                        t = time.perf_counter()
                        if way == "boto3-threads":
                            got = restore_boto3(s3, bucket, listing, dest)
                        elif way == "tarball":
                            got = restore_tarball(s3, bucket, "tar/A.tar.zst", dest)
                        else:
                            new = way == "cachesvc-new"
                            got = restore_with(cachesvc_client if new else old, svc.url, svc.token,
                                               f"{args.size}-{'B' if new else 'A'}", dest)
                        samples[way].append(time.perf_counter() - t)
                        ru2 = resource.getrusage(resource.RUSAGE_SELF)
                        cpu[way].append(ru2.ru_utime - ru.ru_utime + ru2.ru_stime - ru.ru_stime)
                        assert got["files"] == sets["B" if way == "cachesvc-new" else "A"]["files"], (way, got)
                        shutil.rmtree(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {w: statistics.median(samples[w]) for w in WAYS}
    rows = [{"way": w, "median_s": med[w], "min_s": min(samples[w]), "max_s": max(samples[w]),
             "cpu_s": statistics.median(cpu[w]), "x_boto3": med[w] / med["boto3-threads"],
             "x_tarball": med[w] / med["tarball"]} for w in WAYS]
    for r in rows:
        print(f"{r['way']:14} median {r['median_s']:.3f} s  min {r['min_s']:.3f}  max {r['max_s']:.3f}  "
              f"client cpu {r['cpu_s']:.3f} s  x boto3 {r['x_boto3']:.2f}  x tarball {r['x_tarball']:.2f}", flush=True)
    doc = {"old_ref": args.old_ref, "size": args.size, "rounds": args.rounds, "rows": rows, "samples": samples}
    if args.out:
        write_json(Path(args.out), doc)
    return doc


if __name__ == "__main__":
    main()
