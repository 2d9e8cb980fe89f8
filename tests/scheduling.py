"""The order xdist hands modules to workers: the longest first.

``--dist loadscope`` keeps each module on one worker (a module's shared service or cold compile is
made once), and xdist's own order is by number of tests, largest first. The costliest modules are
the e2e ones, a few tests of real compiles each, so they went out last and one of them could still
be running long after the other workers had finished. Handing out the longest modules first
(longest-processing-time scheduling) lets the many short modules fill in around them.

The cost of a module (or test class: xdist's scope) is its seconds of setup, call and teardown in a
measured run, kept in ``tests/durations.json`` and refreshed from CI's report with
``python tests/scheduling.py test-reports/junit-suite.xml``. A module the table does not name yet goes
out with the costliest: a new module is as likely to be a one-test e2e build of 80 s as a quick one,
and the first kind handed out last ran alone for its whole length after every other worker had finished
(the build job's module, 2026-12-05: costed at a median test's second, it went out last); a quick one
handed out first costs the others its few seconds. The table only orders the work: a stale one costs
time, never a test.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List

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

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            # schedule() fills the whole work queue (in xdist's order) before its first hand-out, and
            # nothing has been sent to a worker yet: reorder it once, here.
            if not self._ordered:
                self._ordered = True
                queue = dict(self.workqueue)
                self.workqueue.clear()
                for scope in longest_first({sc: len(tests) for sc, tests in queue.items()}, load_costs()):
                    self.workqueue[scope] = queue[scope]
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


def scope_of(nodeid: str) -> str:
    """The scope of a test: its module, or its class. xdist splits the node id at its last ``::``, and a parameter
    may hold one (``test_x[http://[::1]``): such a test became a scope of its own, handed out apart from its
    module (and first, the table not naming it). The parameters are left out before the split."""
    return nodeid.split("[", 1)[0].rsplit("::", 1)[0]


def longest_first(scopes: Dict[str, int], costs: Dict[str, float]) -> List[str]:
    """``scopes`` (scope -> its number of tests) in the order to hand them out: the scopes the table
    does not name first (the most tests first), then the known ones, the costliest first."""
    unknown = sorted((sc for sc in scopes if sc not in costs), key=lambda sc: -scopes[sc])
    known = sorted((sc for sc in scopes if sc in costs), key=lambda sc: -costs[sc])
    return unknown + known


def table_from_junit(junit: Path) -> dict:
    """{"modules": scope -> seconds} from a JUnit XML report of the suite (a scope: a module, or a test
    class, as xdist names it)."""
    import xml.etree.ElementTree as ET

    seconds: Dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        cut = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))  # test classes follow
        module = "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:]])  # the scope, as xdist names it
        seconds[module] = seconds.get(module, 0.0) + float(case.get("time") or 0)
    order = sorted(seconds, key=lambda m: -seconds[m])
    return {"modules": {m: round(seconds[m], 1) for m in order}}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/scheduling.py test-reports/junit-suite.xml  (rewrites tests/durations.json)")
    TABLE.write_text(json.dumps(table_from_junit(Path(sys.argv[1])), indent=1) + "\n")
