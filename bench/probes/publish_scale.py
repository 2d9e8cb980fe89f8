"""Publish at scale: create and commit time of one publish of 1k, 10k and 100k files, PostgreSQL + S3.

    python bench/probes/publish_scale.py [--files 1000,10000,100000] [--size 1024] [--service-ref snapshot]
                                  [--timeout 900] [--out FILE]

For each count, a fresh PostgreSQL database and S3 bucket (rclone on
loopback), a `cachesvc serve` process (its default workers and settings),
and one folder of that many distinct files of ``--size`` random bytes (in
folders of 100, as Inductor's cache spreads them). One `CacheClient.publish`
of the folder, with the per-call timeout ``--timeout`` so that a slow service
is measured rather than cut off; the table says which calls fit the client's
default timeouts. Columns:

  create s / commit s   the two publish calls (POST /versions, POST /versions/<id>/commit), as the client saw them
  create answer MB      the JSON answer to create
  target calls          the extra calls that handed out upload targets (packs, batches of blobs)
  total s               the whole publish (hash, create, upload, commit)
  fits default          create and commit each within the client's default per-call timeout

``--service-ref`` picks the service code (``snapshot``: the working tree now;
a git ref for a before/after pair); the client is the working tree's, which
speaks to older services too.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import log, service, service_source, table, workdir, write_json  # noqa: E402
from bench.service import _pg  # noqa: E402
from cachesvc_client import CacheClient  # noqa: E402
from harness.s3server import S3Server  # noqa: E402

#: the client's default per-call timeout (CacheClient(timeout=...))
DEFAULT_TIMEOUT = CacheClient().timeout
ENV = {"torch": "2.13.0", "triton": "3.5.0", "cuda": "none", "python": "3.11", "device": "cpu", "arch": "x86_64"}


def make_folder(root: Path, count: int, size: int) -> None:
    for i in range(count):
        d = root / f"d{i // 100:04d}"
        if i % 100 == 0:
            d.mkdir(parents=True)
        (d / f"f{i:06d}").write_bytes(os.urandom(size))


def call_kind(method: str, path: str) -> str:
    if path.endswith("/commit"):
        return "commit"
    if path.endswith("/packs") or path.endswith("/uploads"):
        return "targets"
    return "create" if (method, path) == ("POST", "/api/v1/versions") else "other"


class Timed:
    """Wraps the client's ServiceAPI.call during one publish: seconds and answer bytes per kind of call."""

    def __init__(self, api):
        self.calls: Dict[str, List[float]] = {}
        self.answer_bytes: Dict[str, int] = {}
        real = api.call

        def timed(method, path, *a, **kw):
            t = time.monotonic()
            out = real(method, path, *a, **kw)
            kind = call_kind(method, path)
            self.calls.setdefault(kind, []).append(time.monotonic() - t)
            self.answer_bytes[kind] = self.answer_bytes.get(kind, 0) + len(json.dumps(out))
            return out

        api.call = timed


def one(work: Path, src_env: Dict[str, str], count: int, size: int, timeout: float) -> dict:
    dbname = f"cachesvc_bench_{uuid.uuid4().hex[:10]}"
    with _pg(autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    folder = work / f"src-{count}"
    try:
        make_folder(folder, count, size)
        env = {"CACHESVC_DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:5432/{dbname}",
               "CACHESVC_AUTO_MIGRATE": "1"}
        with S3Server(work / f"s3-{count}") as s3:
            env.update(s3.service_env(s3.new_bucket("scale"), "cachesvc"))
            with service(work / f"svc-{count}", src_env, env) as svc:
                client = CacheClient(svc.url, svc.token, cache_dir=str(folder), timeout=timeout)
                timed = Timed(client.api)
                t = time.monotonic()
                report = client.publish("scale", f"n{count}", env=ENV, roots={"inductor": str(folder)},
                                        merge=False)
                total = time.monotonic() - t
    finally:
        with _pg(autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        shutil.rmtree(folder, ignore_errors=True)
    create, commit = sum(timed.calls["create"]), sum(timed.calls.get("commit", [0.0]))
    row = {"files": count, "status": report.status, "create_s": create, "commit_s": commit,
           "create_answer_mb": timed.answer_bytes["create"] / 1e6, "target_calls": len(timed.calls.get("targets", [])),
           "total_s": total, "uploaded_packs": report.uploaded_packs,
           "fits_default": max(timed.calls["create"] + timed.calls.get("commit", [0.0])) < DEFAULT_TIMEOUT}
    log(f"publish_scale: {count:>7,} files  create {create:7.2f} s  commit {commit:7.2f} s  answer "
        f"{row['create_answer_mb']:6.2f} MB  total {total:7.2f} s  {report.status}")
    return row


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", default="1000,10000,100000")
    p.add_argument("--size", type=int, default=1024, help="bytes per file")
    p.add_argument("--timeout", type=float, default=900.0, help="the client's per-call timeout while measuring")
    p.add_argument("--service-ref", default="snapshot", help="snapshot | worktree | a git ref")
    p.add_argument("--out", default=None)
    p.add_argument("--workdir", default=None)
    args = p.parse_args(argv)
    work = workdir(args.workdir, "bench-publish-scale-")
    src_env = service_source(args.service_ref, work / "service-src")
    try:
        rows = [one(work, src_env, int(n), args.size, args.timeout) for n in args.files.split(",")]
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(table(["files", "status", "create s", "commit s", "create answer MB", "target calls", "total s",
                 "fits default"],
                [[r["files"], r["status"], r["create_s"], r["commit_s"], r["create_answer_mb"], r["target_calls"],
                  r["total_s"], r["fits_default"]] for r in rows]), flush=True)
    doc = {"section": "publish_scale", "service_ref": args.service_ref, "size": args.size, "rows": rows}
    if args.out:
        write_json(Path(args.out), doc)
    return doc


if __name__ == "__main__":
    main()
