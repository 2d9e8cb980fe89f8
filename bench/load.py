"""Load: 200 concurrent restores of one popular entry, gunicorn + PostgreSQL + S3 on loopback.

    python bench/load.py [--restores 200] [--procs 8] [--files 40] [--mb 4] [--out FILE]

Starts `cachesvc serve` (gunicorn, default workers and threads) on a fresh
PostgreSQL database (dropped at the end) with blobs in an rclone S3 bucket
(presigned URLs: bytes go from S3 to the client) and, second scenario, in a
local folder (bytes through the service). Publishes one entry of ``--files``
files (``--mb`` MB in all, one file a third of it, as a precompiled header
is), then releases ``--restores`` restores at once: ``--procs`` processes,
each running its share on threads, every restore a fresh CacheClient into an
empty cache dir of its own. Each restore is timed from its start to its last
file verified and renamed; an error is a miss, a failed file, a wrong byte or
an exception. Prints a table; ``--out`` writes the JSON (run_all's "load").
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import log, percentile, service, service_source, table, workdir, write_json  # noqa: E402
from harness.s3server import S3Server  # noqa: E402

PG = os.environ.get("BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
ENV = {"torch": "2.13.0+cpu", "triton": "none", "cuda": "none", "python": "3.11", "device": "x86_64",
       "arch": "avx512"}
NAME, SHAPE = "popular", "f32[8,3,224,224]"


def make_entry(src: Path, files: int, mb: float) -> Dict[str, str]:
    """``files`` random files, one of them a third of the bytes; returns relpath -> sha256."""
    import hashlib

    total = int(mb * 1e6)
    sizes = [total // 3] + [max(1, (total - total // 3) // (files - 1))] * (files - 1)
    out = {}
    for i, size in enumerate(sizes):
        rel = "precompiled.h.gch" if i == 0 else f"fxgraph/k{i % 16:02d}/entry{i}"
        data = os.urandom(size)
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def worker(args) -> None:
    """One process's share of restores, on threads, released when ``--go`` appears; JSON lines out."""
    import hashlib
    import threading

    from cachesvc_client import CacheClient

    expected = json.loads(Path(args.expected).read_text())
    results: List[dict] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        cache = Path(args.base) / f"r{args.worker}-{i}"
        t = time.monotonic()
        row = {"error": None}
        try:
            rep = CacheClient(args.url, os.environ.get("CACHESVC_TOKEN"), cache_dir=str(cache), timeout=120,
                              stall_timeout=120, workers=4, budget=None).restore(NAME, SHAPE, env=ENV, strict=True)
            row["seconds"] = time.monotonic() - t
            if rep.failed:
                row["error"] = f"failed files: {rep.failed[:2]}"
            bad = [p for p, h in expected.items() if hashlib.sha256((cache / p).read_bytes()).hexdigest() != h]
            if bad:
                row["error"] = f"wrong bytes: {bad[:2]}"
        except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the run
            row["seconds"] = time.monotonic() - t
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        with lock:
            results.append(row)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(args.count)]
    while not os.path.exists(args.go):
        time.sleep(0.002)
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    print(json.dumps(results))


def run_scenario(label: str, url: str, token: Optional[str], base: Path, expected_path: Path, restores: int,
                 procs: int) -> dict:
    base.mkdir(parents=True)
    go = base / "go"
    shares = [restores // procs + (1 if i < restores % procs else 0) for i in range(procs)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESVC_")}
    if token:
        env["CACHESVC_TOKEN"] = token
    ps = [subprocess.Popen([sys.executable, __file__, "--worker", str(i), "--count", str(n), "--go", str(go),
                            "--url", url, "--base", str(base), "--expected", str(expected_path)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i, n in enumerate(shares)]
    time.sleep(3.0)  # imports done in every process
    t0 = time.monotonic()
    go.touch()
    rows: List[dict] = []
    for p in ps:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"load worker failed ({p.returncode}):\n{err[-3000:]}")
        rows += json.loads(out.strip().splitlines()[-1])
    wall = time.monotonic() - t0
    secs = [r["seconds"] for r in rows]
    errors = [r["error"] for r in rows if r["error"]]
    return {"scenario": label, "restores": len(rows), "errors": len(errors), "first_errors": errors[:5],
            "wall_s": wall, "restores_per_s": len(rows) / wall, "p50_s": percentile(secs, 50),
            "p90_s": percentile(secs, 90), "p99_s": percentile(secs, 99), "max_s": max(secs)}


def main(argv: Optional[List[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--restores", type=int, default=200)
    p.add_argument("--procs", type=int, default=8, help="client processes sharing the restores")
    p.add_argument("--files", type=int, default=40)
    p.add_argument("--mb", type=float, default=4.0, help="MB in the entry")
    p.add_argument("--scenarios", default="s3,local", help="s3 (presigned, bytes from S3) and/or local")
    p.add_argument("--out", default=None)
    p.add_argument("--work", default=None, help="scratch folder (default: a new temp folder)")
    p.add_argument("--service-ref", default="snapshot", help="see bench/common.py service_source")
    # worker mode (internal)
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, help=argparse.SUPPRESS)
    p.add_argument("--go", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--base", help=argparse.SUPPRESS)
    p.add_argument("--expected", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        worker(args)
        return {}

    import psycopg
    from sqlalchemy.engine import make_url

    work = workdir(args.work, "cachesvc-load-")
    src_env = service_source(args.service_ref, work / "service-src")
    expected = make_entry(work / "entry", args.files, args.mb)
    (work / "expected.json").write_text(json.dumps(expected))
    admin = make_url(PG)
    conninfo = f"host={admin.host} port={admin.port or 5432} user={admin.username} dbname={admin.database}"
    doc = {"restores": args.restores, "procs": args.procs, "files": args.files, "mb": args.mb, "rows": []}
    for scenario in args.scenarios.split(","):
        dbname = f"cachesvc_load_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')
        s3 = S3Server(work / f"s3-{scenario}").start() if scenario == "s3" else None
        try:
            env = {"CACHESVC_DATABASE_URL": admin.set(database=dbname).render_as_string(hide_password=False),
                   "CACHESVC_AUTO_MIGRATE": "1"}
            if s3 is not None:
                env.update(s3.service_env(s3.new_bucket()))
            svc = service(work / f"svc-{scenario}", src_env, env).start()
            try:
                from cachesvc_client import CacheClient

                rep = CacheClient(svc.url, svc.token, cache_dir=str(work / "entry")).publish(
                    NAME, SHAPE, env=ENV, roots={"inductor": str(work / "entry")})
                log(f"{scenario}: published {rep.files} files, {rep.bytes / 1e6:.1f} MB; "
                    f"{args.restores} restores at once from {args.procs} processes")
                row = run_scenario("S3, presigned" if scenario == "s3" else "local, through the service",
                                   svc.url, svc.token, work / f"restores-{scenario}", work / "expected.json",
                                   args.restores, args.procs)
                doc["rows"].append(row)
                log(f"{scenario}: {row['errors']} errors, p50 {row['p50_s']:.2f} s, p99 {row['p99_s']:.2f} s")
            finally:
                svc.stop()
        finally:
            if s3 is not None:
                s3.stop()
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    return print_and_save(doc, args.out)


def print_and_save(doc: dict, out: Optional[str], *, quantiles: Sequence[str] = ("p50", "p90", "p99", "max"),
                   note: Optional[Callable[[dict], str]] = None) -> dict:
    """Print ``doc``'s restore rows as a table (the ``quantiles`` of each row's ``<q>_s``), then per row
    ``note(row)`` when given and its first errors; write ``doc`` to ``out`` when given. Returns ``doc``.
    Shared by this script and bench/fleet.py, whose rows have the same shape."""
    print(table(["scenario", "restores", "errors", "wall s", "restores/s", *(f"{q} s" for q in quantiles)],
                [[r["scenario"], r["restores"], r["errors"], r["wall_s"], r["restores_per_s"],
                  *(r[f"{q}_s"] for q in quantiles)] for r in doc["rows"]]))
    for r in doc["rows"]:
        if note is not None:
            print(f"  {r['scenario']}: {note(r)}")
        for e in r["first_errors"]:
            print(f"  {r['scenario']}: {e}")
    if out:
        write_json(Path(out), doc)
    return doc


if __name__ == "__main__":
    main()
