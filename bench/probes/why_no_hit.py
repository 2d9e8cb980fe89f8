"""Resolve latency of a miss with its explanation and of each fallback step, against an exact hit.

    python bench/probes/why_no_hit.py [--entries 20000 100000] [--rounds 200]

In-process (``cachesvc.resolve.resolver.resolve`` on one session, no HTTP), on a
fresh PostgreSQL database (``BENCH_PG``; created and dropped) loaded with
``--entries`` entries: 1,000 model names, one environment (the worst case
for the explanation query: every entry shares it), each entry one committed
version of 20 files. Each row is ``--rounds`` resolves of random keys
(rolled back, so the counters do not grow); times in milliseconds.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import log, percentile, table  # noqa: E402
from bench.service import ENV, _pg  # noqa: E402
from cachesvc_client.shared import keys  # noqa: E402

NAMES = 1000
FILES = 20


def load(dbname: str, n: int) -> None:
    rng = random.Random(0)
    with _pg(dbname) as conn, conn.cursor() as cur:
        now = "2026-11-01 00:00:00"
        digests = [uuid.UUID(int=rng.getrandbits(128)).hex * 2 for _ in range(n * 2)]
        with cur.copy("COPY blobs (digest, size, stored_size, encoding, created_at) FROM STDIN") as cp:
            for d in digests:
                cp.write_row((d, 1000, 1000, "identity", now))
        with cur.copy("COPY entries (id, key_digest, name, shape, tags, torch, triton, cuda, python, device, arch, "
                      "created_at, restore_count) FROM STDIN") as cp:
            for i in range(n):
                name, shape = f"model-{i % NAMES}", f"f32[{i // NAMES + 1},256]"
                cp.write_row((i + 1, keys.key_digest(name, shape, {}, ENV), name, shape, "{}", *ENV.values(), now,
                              rng.randrange(100)))
        with cur.copy("COPY versions (id, entry_id, kind, state, manifest_digest, file_count, total_bytes, roots, "
                      "meta, created_at, committed_at, restore_count, verify_count, no_hit_count) FROM STDIN") as cp:
            for i in range(n):
                cp.write_row((i + 1, i + 1, "inductor-dir", "committed", f"{i:064x}", FILES, FILES * 1000,
                              '{"inductor": "/c"}', "{}", now, now, 0, 0, 0))
        with cur.copy("COPY version_files (version_id, root, path, digest, size, mode) FROM STDIN") as cp:
            for i in range(n):
                for j in range(FILES):
                    cp.write_row((i + 1, "inductor", f"f/{j}", digests[(i * 7 + j) % len(digests)], 1000, 420))
        for seq, table_name in (("entries_id_seq", "entries"), ("versions_id_seq", "versions")):
            cur.execute(f"SELECT setval('{seq}', (SELECT max(id) FROM {table_name}))")
        cur.execute("ANALYZE")


def measure(url: str, n: int, rounds: int) -> list:
    from cachesvc import config
    from cachesvc.db import Database
    from cachesvc.resolve.resolver import resolve
    from cachesvc.storage import from_url

    settings = config.load({"DATABASE_URL": url, "DATA_DIR": "/tmp/cachesvc-bench-why"})
    db, storage = Database(url), from_url(settings.STORAGE_URL, config.s3_options(settings))
    rng = random.Random(1)
    shapes = n // NAMES

    def key(shape: str) -> dict:
        return {"name": f"model-{rng.randrange(NAMES)}", "shape": shape, "tags": {}, "env": ENV}

    cases = [
        ("exact hit", lambda: key(f"f32[{rng.randrange(shapes) + 1},256]"), ()),
        ("miss + nearest", lambda: key("f32[999,256]"), ()),
        ("miss + nearest (other torch)", lambda: dict(key("f32[1,256]"), env={**ENV, "torch": "2.14.0"}), ()),
        ("fallback shape", lambda: key("f32[999,256]"), ("shape",)),
        ("fallback shapes (1 MB)", lambda: key("f32[999,256]"), ("shapes",)),
        ("fallback name", lambda: dict(key("f32[999,256]"), name="unknown"), ("name",)),
    ]
    rows = []
    for label, make, steps in cases:
        times = []
        for _ in range(rounds):
            k = make()
            s = db._factory()
            try:
                t = time.perf_counter()
                answer = resolve(s, storage, settings, k, steps, 1_000_000)
                times.append((time.perf_counter() - t) * 1000)
            finally:
                s.rollback()
                s.close()
        rows.append([n, label, answer.get("fallback", {}).get("step", "hit" if answer["hit"] else "miss"),
                     percentile(times, 50), percentile(times, 90), percentile(times, 99)])
    db.engine.dispose()
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--entries", type=int, nargs="+", default=[20000, 100000])
    p.add_argument("--rounds", type=int, default=200)
    args = p.parse_args()
    from cachesvc import db as db_mod

    rows = []
    for n in args.entries:
        dbname = f"cachesvc_bench_{uuid.uuid4().hex[:8]}"
        with _pg(autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')
        try:
            url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{dbname}"
            db_mod.upgrade(url)
            log(f"loading {n} entries")
            load(dbname, n)
            rows += measure(url, n, args.rounds)
        finally:
            with _pg(autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    print(table(["entries", "resolve", "answer", "p50 ms", "p90 ms", "p99 ms"], rows))


if __name__ == "__main__":
    main()
