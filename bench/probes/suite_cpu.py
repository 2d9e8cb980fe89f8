"""Where the suite's CPU goes: each test's CPU-seconds with everything it started, a pytest plugin (issue 37).

The suite is CPU-bound on its 2-core VM (1.8 cores busy over the run), and most of its CPU is spent in
processes a test starts: simulated containers forked from the fork servers, the client's build children,
services, compilers. Process accounting names only commands; this plugin puts each xdist worker in a cgroup
of its own (cgroup v1 ``cpuacct``: every process the worker starts, and theirs, stays in it) and writes, per
test, the cgroup's CPU-seconds and the wall seconds of its setup, call and teardown: a module fixture's cold
compile is booked to its first test. Needs root and a ``cpuacct`` hierarchy at /sys/fs/cgroup/cpuacct;
without them it records nothing. Its cgroups are left behind (empty once the run ends).

    PYTHONPATH=bench/probes scripts/test.sh -p suite_cpu        # one JSON line per test in $SUITE_CPU_DIR
    python bench/probes/suite_cpu.py [DIR]                       # the modules and tests that cost the most

``SUITE_CPU_DIR`` defaults to /tmp/suite-cpu; each worker appends to its own file there (empty it first).
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_group = None


def _folder() -> Path:
    return Path(os.environ.get("SUITE_CPU_DIR", "/tmp/suite-cpu"))


def _seconds() -> float:
    return int((_group / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config) -> None:
    global _group
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or not CPUACCT.is_dir():
        return
    try:
        group = CPUACCT / f"suite-cpu-{worker}-{os.getpid()}"
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
        _folder().mkdir(parents=True, exist_ok=True)
    except OSError:  # not root, or no cpuacct: nothing recorded
        return
    _group = group


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _group is None:
        yield
        return
    cpu, started = _seconds(), time.time()
    yield
    line = {"id": item.nodeid, "cpu": round(_seconds() - cpu, 2), "wall": round(time.time() - started, 2),
            "started": started}
    with open(_folder() / f"{os.environ['PYTEST_XDIST_WORKER']}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def report(folder: Path, top: int = 30) -> str:
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    modules = defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        module = modules[row["id"].split("::")[0]]
        module[0] += row["cpu"]
        module[1] += row["wall"]
        module[2] += 1
    out = [f"{len(rows)} tests: {sum(r['cpu'] for r in rows):.0f} CPU-s, {sum(r['wall'] for r in rows):.0f} wall-s "
           f"summed over the workers", "", "CPU-s   wall-s  tests  module"]
    for name, (cpu, wall, count) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]:
        out.append(f"{cpu:6.1f}  {wall:6.1f}  {count:5d}  {name}")
    out += ["", "CPU-s   wall-s  test"]
    out += [f"{r['cpu']:6.1f}  {r['wall']:6.1f}  {r['id']}" for r in sorted(rows, key=lambda r: -r["cpu"])[:top]]
    return "\n".join(out)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]) if len(sys.argv) > 1 else _folder()))
