"""A fleet's start: 1,000 restores of one entry at once through 2 service replicas.

    python bench/fleet.py [--restores 1000] [--procs 8] [--replicas 2] [--files 20] [--mb 2] [--slow 64]
                          [--out FILE]

Starts ``--replicas`` `cachesvc serve` processes as the image runs them (nginx in front of gunicorn:
``CACHESVC_SERVE_PROXY``) on one fresh PostgreSQL database and one rclone S3 bucket (presigned URLs:
blob bytes go from S3 to the clients), publishes one entry, then releases ``--restores`` restores at
once from ``--procs`` processes (``bench/load.py``'s worker: every restore a fresh CacheClient into an
empty cache dir, every file hashed after), each process on one replica in turn, as a Service spreads
pods. Second scenario: the same with ``--slow`` connections per replica holding unfinished headers
(as tests/service/test_slow_clients.py does) from the start to the end. Reports errors, the restores' p50/p99 (client side, start
to last file placed) and each endpoint's p99 inside the service (its /metrics histogram, summed over
the replicas: the upper bound of the bucket the 99th percentile falls in).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import log, percentile, workdir  # noqa: E402
from bench.load import ENV, NAME, PG, SHAPE, make_entry, print_and_save  # noqa: E402
from harness.s3server import S3Server  # noqa: E402
from harness.service import ServiceProcess  # noqa: E402

_BUCKET = re.compile(r'^cachesvc_http_request_seconds_bucket\{endpoint="([^"]+)",le="([^"]+)"\} (\S+)$', re.M)


def histograms(urls: List[str]) -> Dict[str, Dict[float, float]]:
    """endpoint -> {bucket upper bound: cumulative count}, summed over the replicas' /metrics."""
    import requests

    out: Dict[str, Dict[float, float]] = {}
    for url in urls:
        for endpoint, le, n in _BUCKET.findall(requests.get(url + "/metrics", timeout=30).text):
            bucket = out.setdefault(endpoint, {})
            bucket[float(le)] = bucket.get(float(le), 0.0) + float(n)
    return out


def p99(before: Dict[float, float], after: Dict[float, float]) -> Optional[float]:
    """The upper bound of the bucket holding the 99th percentile of what was observed in between."""
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1] if delta else 0
    if not total:
        return None
    return next(le for le, n in delta if n >= 0.99 * total)


def slow_clients(urls: List[str], n: int) -> List[socket.socket]:
    held = []
    for url in urls:
        host, port = urlsplit(url).hostname, urlsplit(url).port
        for i in range(n):
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nX-Slow-{i}: ".encode())
            held.append(s)
    return held


def run(label: str, urls: List[str], token: str, base: Path, expected: Path, restores: int, procs: int,
        slow: int) -> dict:
    base.mkdir(parents=True)
    go = base / "go"
    shares = [restores // procs + (1 if i < restores % procs else 0) for i in range(procs)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESVC_")}
    env["CACHESVC_TOKEN"] = token
    loader = Path(__file__).with_name("load.py")
    ps = [subprocess.Popen([sys.executable, str(loader), "--worker", str(i), "--count", str(n), "--go", str(go),
                            "--url", urls[i % len(urls)], "--base", str(base), "--expected", str(expected)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i, n in enumerate(shares)]
    held = slow_clients(urls, slow) if slow else []
    before = histograms(urls)
    time.sleep(3.0)  # the workers' imports, before the clock starts
    t0 = time.monotonic()
    go.touch()
    rows: List[dict] = []
    try:
        for p in ps:
            out, err = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise RuntimeError(f"fleet worker failed ({p.returncode}):\n{err[-3000:]}")
            rows += json.loads(out.strip().splitlines()[-1])
        wall = time.monotonic() - t0
        after = histograms(urls)
    finally:
        for s in held:
            s.close()
    secs = [r["seconds"] for r in rows]
    errors = [r["error"] for r in rows if r["error"]]
    inside = {e: p99(before.get(e, {}), h) for e, h in after.items() if e.startswith(("resolve", "blobs", "packs"))}
    return {"scenario": label, "restores": len(rows), "errors": len(errors), "first_errors": errors[:5],
            "wall_s": wall, "restores_per_s": len(rows) / wall, "p50_s": percentile(secs, 50),
            "p99_s": percentile(secs, 99), "service_p99_s": {e: v for e, v in inside.items() if v is not None}}


def main(argv: Optional[List[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--restores", type=int, default=1000)
    p.add_argument("--procs", type=int, default=8, help="client processes sharing the restores")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="gunicorn workers per replica")
    p.add_argument("--files", type=int, default=20)
    p.add_argument("--mb", type=float, default=2.0, help="MB in the entry")
    p.add_argument("--slow", type=int, default=64, help="slow connections per replica in the second scenario")
    p.add_argument("--out", default=None)
    p.add_argument("--work", default=None, help="scratch folder (default: a new temp folder)")
    args = p.parse_args(argv)

    import psycopg
    from sqlalchemy.engine import make_url

    work = workdir(args.work, "cachesvc-fleet-")
    expected = make_entry(work / "entry", args.files, args.mb)
    (work / "expected.json").write_text(json.dumps(expected))
    admin = make_url(PG)
    conninfo = f"host={admin.host} port={admin.port or 5432} user={admin.username} dbname={admin.database}"
    dbname = f"cachesvc_fleet_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    s3 = S3Server(work / "s3").start()
    doc = {k: getattr(args, k) for k in ("restores", "procs", "replicas", "workers", "files", "mb", "slow")}
    doc["rows"] = []
    replicas: List[ServiceProcess] = []
    try:
        env = {"CACHESVC_DATABASE_URL": admin.set(database=dbname).render_as_string(hide_password=False),
               "CACHESVC_AUTO_MIGRATE": "1", "CACHESVC_SERVE_PROXY": "1", "CACHESVC_SECRET_KEY": "bench",
               **s3.service_env(s3.new_bucket())}
        for i in range(args.replicas):
            replicas.append(ServiceProcess(work / f"svc-{i}", env=env, workers=args.workers,
                                           write_token=(i == 0)).start())
        token = replicas[0].token
        from cachesvc_client import CacheClient

        rep = CacheClient(replicas[0].url, token, cache_dir=str(work / "entry")).publish(
            NAME, SHAPE, env=ENV, roots={"inductor": str(work / "entry")})
        log(f"published {rep.files} files, {rep.bytes / 1e6:.1f} MB; {args.restores} restores at once from "
            f"{args.procs} processes over {args.replicas} replicas")
        urls = [r.url for r in replicas]
        for label, slow in (("alone", 0), (f"with {args.slow} slow clients per replica", args.slow)):
            row = run(label, urls, token, work / f"restores-{slow}", work / "expected.json", args.restores,
                      args.procs, slow)
            doc["rows"].append(row)
            log(f"{label}: {row['errors']} errors, p99 {row['p99_s']:.2f} s, inside {row['service_p99_s']}")
    finally:
        for r in replicas:
            r.stop()
        s3.stop()
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    return print_and_save(doc, args.out, quantiles=("p50", "p99"),
                          note=lambda r: f"service p99 by endpoint {r['service_p99_s']}")


if __name__ == "__main__":
    main()
