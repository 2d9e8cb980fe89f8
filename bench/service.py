"""Service latency: resolve and list under 50 concurrent clients, PostgreSQL with 100,000 entries.

    python bench/service.py [--entries 100000] [--files 20] [--clients 50] [--seconds 10]
                            [--open-rates 50,100,200,400] [--out FILE]

Creates a fresh PostgreSQL database (dropped at the end), starts `cachesvc
serve` (gunicorn, its default workers and threads) with
CACHESVC_AUTO_MIGRATE=1, bulk-loads the entries with COPY (each: one
committed version of ``--files`` files, a few blobs shared by all as a
precompiled header is), then drives it from loopback with ``wrk`` (or, when
wrk is missing, a bounded pool of Python threads):

  resolve (local)  GET /api/v1/resolve for random existing keys, blobs on the local backend
  resolve (S3)     the same with S3 storage: every blob URL presigned (rclone on loopback, never called)
  list             GET /api/v1/entries (first page)
  list by name     GET /api/v1/entries?name=<one of 1,000 model names>

Each resolve scenario runs closed loop (``--clients`` connections back to
back: capacity) and then open loop at each of ``--open-rates`` requests/s
(latency at a given load; the first rate is the target's).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import List, Optional
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import workdir, log, percentile, service, service_source, table, write_json  # noqa: E402
from cachesvc_client.shared import keys  # noqa: E402
from harness.s3server import S3Server  # noqa: E402

PG = os.environ.get("BENCH_PG", "host=127.0.0.1 port=5432 user=postgres dbname=test")
ENV = {"torch": "2.13.0+cu128", "triton": "3.5.0", "cuda": "12.8", "python": "3.11", "device": "NVIDIA H100",
       "arch": "sm_90"}
SHARED = 5  # blobs every version holds (headers, runtime libraries)

WRK_LUA = r"""
local paths = {}
for line in io.lines(os.getenv("BENCH_PATHS")) do paths[#paths + 1] = line end
local token = os.getenv("BENCH_TOKEN")
local headers = {}
if token and token ~= "" then headers["Authorization"] = "Bearer " .. token end
math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
request = function()
  return wrk.format("GET", paths[math.random(#paths)], headers)
end
done = function(summary, latency, requests)
  io.write(string.format('BENCH {"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, ' ..
    '"max_us": %d, "errors_status": %d, "errors_connect": %d, "errors_read": %d, "errors_timeout": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, summary.errors.status, summary.errors.connect, summary.errors.read, summary.errors.timeout))
end
"""


def _pg(dbname: Optional[str] = None, autocommit: bool = False):
    import psycopg

    conninfo = PG if dbname is None else PG.replace("dbname=test", f"dbname={dbname}")
    return psycopg.connect(conninfo, autocommit=autocommit)


def load(dbname: str, n: int, files: int, seed: int = 0) -> List[dict]:
    """COPY ``n`` entries with one committed version each; return the keys (name, shape, tags)."""
    rng = random.Random(seed)
    shared = [(f"{i:02x}" + uuid.UUID(int=rng.getrandbits(128)).hex * 2)[:64] for i in range(SHARED)]
    out = []
    with _pg(dbname) as conn, conn.cursor() as cur:
        now = "2026-11-01 00:00:00"
        with cur.copy("COPY blobs (digest, size, stored_size, encoding, created_at) FROM STDIN") as cp:
            for d in shared:
                cp.write_row((d, 150_000_000, 21_000_000, "zstd", now))
        with cur.copy("COPY entries (id, key_digest, name, shape, tags, torch, triton, cuda, python, device, arch, "
                      "created_at, restore_count) FROM STDIN") as cp:
            for i in range(1, n + 1):
                name, shape, tags = f"model-{i % 1000}", f"f32[{i // 1000 + 1},3,224,224]", {"mode": "default"}
                digest = keys.key_digest(name, shape, tags, ENV)
                cp.write_row((i, digest, name, shape, keys.canonical_tags(tags), *[ENV[f] for f in keys.ENV_FIELDS],
                              now, 0))
                out.append({"name": name, "shape": shape, "tags": tags})
        with cur.copy("COPY versions (id, entry_id, kind, state, manifest_digest, file_count, total_bytes, roots, "
                      "meta, created_at, committed_at, restore_count) FROM STDIN") as cp:
            for i in range(1, n + 1):
                cp.write_row((i, i, "inductor-dir", "committed", f"{i:064x}", files, 160_000_000,
                              '{"inductor": "/cache", "pch": "/tmp/torchinductor_root/precompiled_headers"}',
                              '{"host": "bench"}', now, now, 0))
        rows = []
        with cur.copy("COPY version_files (version_id, root, path, digest, size, mode) FROM STDIN") as cp:
            for i in range(1, n + 1):
                for j in range(files):
                    if j < SHARED:
                        d, root, path = shared[j], "pch", f"c{j:051d}.h.gch"
                    else:
                        d = f"{i:040x}{j:024x}"
                        root, path = "inductor", f"{d[-2:]}/c{d[:51]}.so"
                        rows.append(d)
                    cp.write_row((i, root, path, d, 20_000, 0o644))
        with cur.copy("COPY blobs (digest, size, stored_size, encoding, created_at) FROM STDIN") as cp:
            for d in rows:
                cp.write_row((d, 20_000, 7_000, "zstd", now))
        for table_name in ("entries", "versions"):
            cur.execute(f"SELECT setval(pg_get_serial_sequence('{table_name}', 'id'), {n})")
        conn.commit()
    with _pg(dbname, autocommit=True) as conn:
        conn.execute("ANALYZE")
    return out


def resolve_path(k: dict) -> str:
    return "/api/v1/resolve?" + urlencode({"name": k["name"], "shape": k["shape"],
                                           "tags": json.dumps(k["tags"], sort_keys=True), **ENV})


def drive(url: str, paths: List[str], token: Optional[str], clients: int, seconds: float, work: Path) -> dict:
    """Run the load; return requests/s and latency percentiles in ms."""
    pfile = work / f"paths-{uuid.uuid4().hex[:8]}.txt"
    pfile.write_text("\n".join(paths) + "\n")
    wrk = shutil.which("wrk")
    if wrk:
        lua = work / "bench.lua"
        lua.write_text(WRK_LUA)
        env = dict(os.environ, BENCH_PATHS=str(pfile), BENCH_TOKEN=token or "")
        cmd = [wrk, "-t", str(min(2, clients)), "-c", str(clients), "-d", f"{max(1, round(seconds))}s",
               "--timeout", "10s", "-s", str(lua), url]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 60)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH ")), None)
        if line is None:
            raise RuntimeError(f"wrk gave no result:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        r = json.loads(line[6:])
        errors = r["errors_status"] + r["errors_connect"] + r["errors_read"] + r["errors_timeout"]
        return {"tool": "wrk", "requests": r["requests"], "rps": r["requests"] / (r["duration_us"] / 1e6),
                "p50_ms": r["p50_us"] / 1e3, "p90_ms": r["p90_us"] / 1e3, "p99_ms": r["p99_us"] / 1e3,
                "max_ms": r["max_us"] / 1e3, "errors": errors}
    return _drive_python(url, paths, token, clients, seconds)


def _drive_python(url: str, paths: List[str], token: Optional[str], clients: int, seconds: float) -> dict:
    """Fallback: ``clients`` threads, one keep-alive connection each, closed loop."""
    import http.client

    host, port = url.split("//", 1)[1].split(":")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    lat: List[float] = []
    errors = [0]
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        mine = []
        while time.monotonic() < stop:
            t = time.perf_counter()
            conn = _get(conn, random.choice(paths), headers, errors)
            mine.append(time.perf_counter() - t)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dur = time.monotonic() - t0
    return _summary("python-threads", lat, dur, errors[0])


def _get(conn, path: str, headers: dict, errors: List[int]):
    """One GET on a kept-alive connection; counts 4xx/5xx and broken connections in ``errors[0]``.
    Returns the connection to use next (a new one after a failure)."""
    import http.client

    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status >= 400:
            errors[0] += 1
        return conn
    except OSError:
        errors[0] += 1
        return http.client.HTTPConnection(conn.host, conn.port, timeout=10)


def _summary(tool: str, lat: List[float], seconds: float, errors: int) -> dict:
    return {"tool": tool, "requests": len(lat), "rps": len(lat) / seconds,
            "p50_ms": percentile(lat, 50) * 1e3, "p90_ms": percentile(lat, 90) * 1e3,
            "p99_ms": percentile(lat, 99) * 1e3, "max_ms": max(lat) * 1e3, "errors": errors}


def drive_open(url: str, paths: List[str], token: Optional[str], clients: int, rate: float, seconds: float) -> dict:
    """Open loop: ``clients`` threads send ``rate`` requests/s in all, on a fixed schedule.

    Latency counts from the scheduled send time, so a service that falls
    behind is charged for the wait (no coordinated omission).
    """
    import http.client

    host, port = url.split("//", 1)[1].split(":")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    lat: List[float] = []
    errors = [0]
    lock = threading.Lock()
    start = time.perf_counter() + 0.2
    period = clients / rate

    def client(i: int) -> None:
        rng = random.Random(i)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        mine, k = [], 0
        while True:
            due = start + i / rate + k * period
            if due - start > seconds:
                break
            k += 1
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            conn = _get(conn, rng.choice(paths), headers, errors)
            mine.append(time.perf_counter() - due)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _summary("python-open-loop", lat, seconds, errors[0])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--files", type=int, default=20, help="files per version")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--open-rates", default="50,100,200,400",
                   help="requests/s of the open-loop resolve runs, comma-separated (50 clients on a fixed "
                        "schedule); the first is the target's (50 clients, one resolve a second each); '' for none")
    p.add_argument("--out", default=None)
    p.add_argument("--workdir", default=None)
    p.add_argument("--service-ref", default="snapshot", help="snapshot | worktree | a git ref")
    args = p.parse_args(argv)
    rates = [float(x) for x in args.open_rates.split(",") if x.strip()]
    work = workdir(args.workdir, "bench-service-")
    src_env = service_source(args.service_ref, work / "service-src")
    dbname = f"cachesvc_bench_{uuid.uuid4().hex[:10]}"
    db_url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{dbname}"
    results: List[dict] = []
    t0 = time.monotonic()
    with _pg(autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        base = {"CACHESVC_DATABASE_URL": db_url, "CACHESVC_AUTO_MIGRATE": "1"}
        with S3Server(work / "s3") as s3:
            bucket = s3.new_bucket("service")
            configs = [("local", {**base, "CACHESVC_STORAGE_URL": (work / "blobs").as_uri()}),
                       ("S3", {**base, **s3.service_env(bucket, "cachesvc")})]
            key_list: List[dict] = []
            for storage, env in configs:
                with service(work / f"svc-{storage}", src_env, env) as svc:
                    if not key_list:
                        log(f"service: COPY {args.entries:,} entries x {args.files} files into {dbname}")
                        t = time.monotonic()
                        key_list = load(dbname, args.entries, args.files)
                        log(f"service: loaded in {time.monotonic() - t:.0f} s")
                    rng = random.Random(1)
                    resolve_paths = [resolve_path(k) for k in rng.sample(key_list, min(20_000, len(key_list)))]
                    scenarios = [(f"resolve ({storage})", resolve_paths)]
                    if storage == "local":
                        scenarios += [("list", ["/api/v1/entries"]),
                                      ("list by name", [f"/api/v1/entries?name=model-{i}" for i in range(1000)])]
                    for label, paths in scenarios:
                        check = drive(svc.url, paths[:1], svc.token, 1, 1, work)  # warm-up and auth check
                        if check["errors"]:
                            raise RuntimeError(f"{label}: the service answered errors; see {svc.log_path}")
                        r = drive(svc.url, paths, svc.token, args.clients, args.seconds, work)
                        r.update(scenario=label, clients=args.clients, seconds=args.seconds)
                        results.append(r)
                        log(f"service: {label:18} {r['rps']:7.0f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                            f"p99 {r['p99_ms']:7.1f} ms  errors {r['errors']}")
                        for rate in (rates if label.startswith("resolve") else []):
                            r = drive_open(svc.url, paths, svc.token, args.clients, rate, args.seconds)
                            r.update(scenario=f"{label}, open loop {rate:.0f}/s", clients=args.clients,
                                     seconds=args.seconds, offered_rps=rate)
                            results.append(r)
                            log(f"service: {r['scenario']:18} {r['rps']:7.0f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                                f"p99 {r['p99_ms']:7.1f} ms  errors {r['errors']}")
    finally:
        with _pg(autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(table(["scenario", "clients", "req/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"],
                [[r["scenario"], r["clients"], r["rps"], r["p50_ms"], r["p90_ms"], r["p99_ms"], r["max_ms"],
                  r["errors"]] for r in results]), flush=True)
    doc = {"section": "service", "entries": args.entries, "files_per_version": args.files, "rows": results,
           "target_rate": rates[0] if rates else None,
           "seconds": time.monotonic() - t0}
    if args.out:
        write_json(Path(args.out), doc)
    return doc


if __name__ == "__main__":
    main()
