"""What the fleet served: each model's calls per input shape, by how each was served, reported to the service.

The one call counts every call (``Tally.count``, on the call path: a lookup and an increment) and the
process's ``REPORTER`` sends the counts in the background (reporter.py). The service keeps them as the
model's demand (``GET /api/v1/demand``), which a build job reads to build the shapes the fleet serves.

    tally = usage.track(client, name, tags)     # None: CACHESVC_USAGE=0, or no service
    tally.count(token, usage.served_index("package"), describe)
"""
from __future__ import annotations

from .demand import demand_rows, package_shapes
from .reporter import REPORTER, Reporter
from .tally import MAX_SHAPES, SERVED, Tally, served_index


def track(client, name, tags):
    """``REPORTER.track``: a tally for one model, or None when usage is off or there is no service."""
    return REPORTER.track(client, name, tags)


__all__ = ["MAX_SHAPES", "REPORTER", "demand_rows", "package_shapes", "Reporter", "SERVED", "Tally", "served_index", "track"]
