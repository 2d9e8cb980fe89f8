"""The restart demo: a cold container compiles and publishes; a restarted one restores and hits.

    python demo/restart.py [--model mlp] [--workdir demo-runs]

Starts `cachesvc serve` on the embedded default (SQLite + a blob folder),
then runs two fresh containers (own empty HOME, TMPDIR and cache dir, at the
same paths, as a restart of one image has) and prints both first-call times,
the speedup and the inductor cache counters.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.containers import Container  # noqa: E402
from harness.service import ServiceProcess  # noqa: E402


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp", help="mlp | encoder")
    p.add_argument("--workdir", default="demo-runs", help="scratch folder (wiped first)")
    args = p.parse_args()
    work = Path(args.workdir).resolve()
    shutil.rmtree(work, ignore_errors=True)

    with ServiceProcess(work / "service-data") as svc:
        print(f"service: {svc.url} (data in {svc.data_dir})", flush=True)
        ctr = Container(work / "containers")
        print(f"[1/3] cold container: compile {args.model} from nothing, then publish ...", flush=True)
        cold = ctr.run_worker("--model", args.model, "--url", svc.url, "--publish")
        pub = cold["publish"]
        print(f"      first call {cold['first_call_s']:.2f} s; published {pub['files']} files ({mb(pub['bytes'])}), "
              f"uploaded {mb(pub['uploaded_bytes'])} in {pub['seconds']:.2f} s", flush=True)

        print("[2/3] floor: the same container run again (inherits everything the cold run left) ...", flush=True)
        floor = ctr.run_worker("--model", args.model)
        print(f"      first call {floor['first_call_s']:.2f} s", flush=True)

        ctr.restart()
        print("[3/3] restarted container (empty HOME, TMPDIR, cache dir): restore, then compile ...", flush=True)
        warm = ctr.run_worker("--model", args.model, "--url", svc.url, "--restore")
        rep = warm["restore"]
        print(f"      restore: {rep['files']} files, {mb(rep['bytes_written'])} written "
              f"({mb(rep['bytes'])} transferred) in {rep['seconds']:.2f} s, started before `import torch`; "
              f"the first call waited {warm['restore_s']:.2f} s for it", flush=True)

    total = warm["restore_s"] + warm["first_call_s"]
    rows = [
        ("cold container", f"{cold['first_call_s']:.2f}", "-", f"{cold['first_call_s']:.2f}"),
        ("floor (inherits all)", f"{floor['first_call_s']:.2f}", "-", f"{floor['first_call_s']:.2f}"),
        ("restarted + restore", f"{warm['first_call_s']:.2f}", f"{warm['restore_s']:.2f}", f"{total:.2f}"),
    ]
    print()
    print(f"{'':22} {'first call s':>12} {'restore s':>10} {'total s':>8}")
    for r in rows:
        print(f"{r[0]:22} {r[1]:>12} {r[2]:>10} {r[3]:>8}")
    print(f"\nspeedup of the first call: {cold['first_call_s'] / warm['first_call_s']:.1f}x "
          f"(including the restore: {cold['first_call_s'] / total:.1f}x); "
          f"restore + first call = {total / floor['first_call_s']:.2f}x the floor")
    print(f"cold counters:     {cold['counters']}")
    print(f"restored counters: {warm['counters']}")
    ok = warm["counters"].get("fxgraph_cache_hit", 0) > 0 and not warm["counters"].get("fxgraph_cache_miss", 0)
    print("result: " + ("restore HIT: the restarted container compiled nothing" if ok
                        else "restore did NOT pay off: see the counters above"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    t = time.time()
    main()
