"""Run every benchmark of the suite: bench/results/benchmarks.json, then docs/benchmarks.md and its charts.

    python bench/run_all.py            # full run (~16 min on 2 cores)
    python bench/run_all.py --quick    # one round, mlp only, smaller service data (~5 min)

Sections: ttfi (time to first inference), transfer (restore throughput),
publish (publish cost and storage dedup), service (resolve/list latency),
load (200 concurrent restores of one entry), dead_service (time to a miss
when the service is down).
Each section is also a script of its own (bench/<section>.py). The results
are rendered after every section, so an interrupted run still leaves a
report of what finished. Every server it starts (cachesvc, rclone) is
stopped, and the PostgreSQL database and Redis keys it made are removed.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dead_service, load, publish, report, service, transfer, ttfi  # noqa: E402
from bench.common import describe_source, log, machine, write_json  # noqa: E402

SECTIONS = ["ttfi", "transfer", "publish", "service", "load", "dead_service"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one round, mlp only, 20k service entries")
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--out-dir", default=str(report.RESULTS), help="where benchmarks.json goes (bench/results/)")
    p.add_argument("--merge", action="store_true",
                   help="keep the other sections of an existing benchmarks.json (re-run only --sections)")
    p.add_argument("--service-ref", default="snapshot",
                   help="service code: snapshot (the working tree, copied at start), worktree, or a git ref")
    args = p.parse_args()
    out = Path(args.out_dir)
    ref = ["--service-ref", args.service_ref]
    q = args.quick
    plan = {
        "ttfi": lambda: ttfi.main(["--models", "mlp" if q else "mlp,encoder", "--repeats", "1" if q else "3", *ref]),
        "transfer": lambda: transfer.main(["--repeats", "1" if q else "3", *ref]),
        "publish": lambda: publish.main(["--shapes", "8,16,4" if q else "8,16,1,2,4,32", *ref]),
        "service": lambda: service.main(["--entries", "20000" if q else "100000", "--seconds", "5" if q else "10",
                                         *ref]),
        "load": lambda: load.main(["--restores", "50" if q else "200", *ref]),
        "dead_service": lambda: dead_service.main(["--rounds", "1" if q else "3"]),
    }
    doc = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": "python " + " ".join(shlex.quote(a) for a in ["bench/run_all.py", *sys.argv[1:]]),
           "mode": "quick" if q else "full", "machine": machine(),
           "service_source": describe_source(args.service_ref, ["cachesvc", "migrations"]),
           "client_source": describe_source("worktree", ["client"])}
    if args.merge and (out / "benchmarks.json").exists():
        old = json.loads((out / "benchmarks.json").read_text())
        doc.update({k: old[k] for k in SECTIONS if k in old and k not in args.sections.split(",")})
        doc["merged"] = f"sections {args.sections} re-run on {doc['date']}; the others from {old.get('date')}"
    t0 = time.monotonic()
    for name in args.sections.split(","):
        log(f"=== {name}")
        doc[name] = plan[name]()
        doc["seconds"] = time.monotonic() - t0
        write_json(out / "benchmarks.json", doc)
        report.PAGE.write_text(report.render(doc, out, charts=True))
    log(f"done in {(time.monotonic() - t0) / 60:.1f} min: {report.PAGE}")
    for t in report.targets(doc):
        print(f"{'MET ' if t['met'] else 'MISS'}  {t['target']}: {t.get('value') or round(t['ratio'], 3)}")


if __name__ == "__main__":
    main()
