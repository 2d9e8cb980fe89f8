"""Time to a miss when the cache is down: what a container start pays when the service is not there.

    python bench/dead_service.py [--rounds 3] [--old-ref 8822578] [--out FILE]

Each sample is one `cachesvc-client restore --json` process with default
settings, as an init container runs it, against:

    refused     a loopback port nothing listens on (connection refused at once)
    unroutable  10.255.255.1 inside a private network namespace where that address drops every
                packet (`unshare -n`, a veth pair with nobody on the far end): connect never answers
    silent      a loopback socket that accepts (the kernel's backlog) and never answers

It records the process's wall time and the report's own ``seconds``. With
``--old-ref`` the client at that git ref runs the same cases (its package on
PYTHONPATH), for the before/after. ``unroutable`` needs root (unshare);
elsewhere it is skipped and says so.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, log, machine, median, table, workdir, write_json  # noqa: E402

UNROUTABLE = "10.255.255.1"
#: a namespace of its own in which UNROUTABLE is reachable by route and neighbour entry, and drops everything
BLACKHOLE = ("ip link set lo up && ip link add cs0 type veth peer name cs1 && ip addr add 10.255.255.2/24 dev cs0 "
             f"&& ip link set cs0 up && ip link set cs1 up && ip neigh add {UNROUTABLE} lladdr 02:00:00:00:00:01 "
             "dev cs0 nud permanent")
ENV = {"CACHESVC_ENV_TORCH": "2.13.0+cpu", "CACHESVC_ENV_TRITON": "none", "CACHESVC_ENV_CUDA": "none",
       "CACHESVC_ENV_PYTHON": "3.11", "CACHESVC_ENV_DEVICE": "x86_64", "CACHESVC_ENV_ARCH": "avx512"}


def in_blackhole(argv: List[str]) -> Optional[List[str]]:
    """``argv`` run inside a fresh network namespace holding the blackhole; None where that cannot be made."""
    probe = subprocess.run(["unshare", "-n", "sh", "-c", BLACKHOLE], capture_output=True, text=True)
    if probe.returncode != 0:
        return None
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
    return ["unshare", "-n", "sh", "-c", f"{BLACKHOLE} && exec {quoted}"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def restore_argv(url: str) -> List[str]:
    return [sys.executable, "-m", "cachesvc_client.cli", "restore", "--name", "bench", "--shape", "f32[1]",
            "--url", url, "--json", "-q"]


def sample(argv: List[str], home: Path, pythonpath: Optional[str]) -> Dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHESVC_", "TORCHINDUCTOR_"))}
    env.update(ENV, HOME=str(home), TMPDIR=str(home), TORCHINDUCTOR_CACHE_DIR=str(home / "cache"))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    started = time.monotonic()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - started
    report = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}
    return {"wall_s": round(wall, 3), "seconds": report.get("seconds"), "hit": report.get("hit"),
            "rc": out.returncode, "reason": report.get("reason", out.stderr.strip()[-300:])}


def old_client(ref: str, dest: Path) -> str:
    """A folder holding the client at ``ref`` as ``cachesvc_client`` (for PYTHONPATH)."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref, "client"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest)
    (dest / "client").rename(dest / "cachesvc_client")
    return str(dest)


def run_cases(rounds: int, home: Path, pythonpath: Optional[str]) -> Dict[str, list]:
    results: Dict[str, list] = {"refused": [], "unroutable": [], "silent": []}
    home.mkdir(parents=True, exist_ok=True)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        urls = {"refused": f"http://127.0.0.1:{closed_port()}", "unroutable": f"http://{UNROUTABLE}:8787",
                "silent": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        for _ in range(rounds):
            for case, url in urls.items():
                argv = restore_argv(url)
                if case == "unroutable":
                    argv = in_blackhole(argv)
                    if argv is None:
                        results[case].append({"skipped": "no network namespace here (needs root: unshare -n)"})
                        continue
                results[case].append(sample(argv, home, pythonpath))
                log(f"{case}: {results[case][-1]}")
    return results


def summarise(results: Dict[str, Dict[str, list]]) -> List[dict]:
    """One row per case and client: median process and report seconds, and the reason of the last sample."""
    rows = []
    for case in ("refused", "unroutable", "silent"):
        for client, cases in results.items():
            got = [s for s in cases[case] if "wall_s" in s]
            rows.append({"case": case, "client": client, "samples": len(got),
                         "process_s": median(s["wall_s"] for s in got),
                         "report_s": median(s["seconds"] for s in got),
                         "reason": got[-1]["reason"] if got else cases[case][-1].get("skipped", "")})
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--old-ref", default=None, help="git ref of a client to compare with")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    work = workdir(None, "bench-dead-service-")
    clients = {"this client": None}
    if args.old_ref:
        clients[f"client at {args.old_ref}"] = old_client(args.old_ref, work / "old")
    results = {name: run_cases(args.rounds, work / name.replace(" ", "-"), path) for name, path in clients.items()}
    rows = summarise(results)
    print(table(["service", "client", "process s", "report s"],
                [[r["case"], r["client"], r["process_s"], r["report_s"]] for r in rows]))
    doc = {"machine": machine(), "rounds": args.rounds, "rows": rows, "samples": results}
    if args.out:
        write_json(Path(args.out), doc)
    return doc


if __name__ == "__main__":
    main()
