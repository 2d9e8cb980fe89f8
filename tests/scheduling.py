"""The order xdist hands modules to workers: the longest first.

``--dist loadscope`` keeps each module on one worker (a module's shared service or cold compile is
made once), and xdist's own order is by number of tests, largest first. The costliest modules are
the e2e ones, a few tests of real compiles each, so they went out last and one of them could still
be running long after the other workers had finished. Handing out the longest modules first
(longest-processing-time scheduling) lets the many short modules fill in around them.

The cost of a module (or test class: xdist's scope) is its seconds of setup, call and teardown in a
measured run, kept in ``tests/durations.json`` and refreshed from CI's report with
``python tests/scheduling.py test-reports/junit-suite.xml``. A module the table does not name yet
is costed at the table's median seconds a test, times its number of tests. The table only orders the
work: a stale one costs time, never a test.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Dict

TABLE = Path(__file__).with_name("durations.json")


def load_costs(path: Path = TABLE) -> Dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text())["modules"].items()}
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return {}  # no table: xdist's own order


def make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        _ordered = False

        def _assign_work_unit(self, node) -> None:
            # schedule() fills the whole work queue (in xdist's order) before its first hand-out, and
            # nothing has been sent to a worker yet: reorder it once, here.
            if not self._ordered:
                self._ordered = True
                costs, per_test = self._costs()
                queue = dict(self.workqueue)
                self.workqueue.clear()
                for scope in sorted(queue, key=lambda sc: -costs.get(sc, per_test * len(queue[sc]))):
                    self.workqueue[scope] = queue[scope]
            super()._assign_work_unit(node)

        @staticmethod
        def _costs():
            costs = load_costs()
            tests = _test_counts()
            rates = [costs[m] / tests[m] for m in costs if tests.get(m)]
            return costs, statistics.median(rates) if rates else 1.0

    return LongestFirst(config, log)


def _test_counts() -> Dict[str, int]:
    try:
        return {str(k): int(v) for k, v in json.loads(TABLE.read_text())["tests"].items()}
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return {}


def table_from_junit(junit: Path) -> dict:
    """{"modules": path -> seconds, "tests": path -> count} from a JUnit XML report of the suite."""
    import xml.etree.ElementTree as ET

    seconds: Dict[str, float] = {}
    counts: Dict[str, int] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        cut = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))  # test classes follow
        module = "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:]])  # the scope, as xdist names it
        seconds[module] = seconds.get(module, 0.0) + float(case.get("time") or 0)
        counts[module] = counts.get(module, 0) + 1
    order = sorted(seconds, key=lambda m: -seconds[m])
    return {"modules": {m: round(seconds[m], 1) for m in order}, "tests": {m: counts[m] for m in order}}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/scheduling.py test-reports/junit-suite.xml  (rewrites tests/durations.json)")
    TABLE.write_text(json.dumps(table_from_junit(Path(sys.argv[1])), indent=1) + "\n")
