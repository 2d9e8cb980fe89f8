"""The read model: what the cache holds, costs and saves, as the JSON API, the HTML pages and ``/metrics``
read it. Reads only; it writes nothing.

::

    entries.py  list_entries (filter, sort, page), entry_detail (versions, files, shared blobs),
                restore_command; FILTER_FIELDS       GET /api/v1/entries, GET / and /entries/<id>
    stats.py    totals, daily, verdicts_by, served   GET /api/v1/stats, GET /stats, /metrics
    demand.py   demand (a model's key families and   GET /api/v1/demand, GET /entries/<id>
                their most called shapes)

This module is the door: ``cachesvc.api`` (entries, stats, metrics), ``cachesvc.browse`` (the pages) and
``cachesvc.metrics`` call what it exports. It has a room of its own so that the views and the pages, which
show the same rows, share them without importing each other (``tests/test_layers.py``).
"""
from .demand import demand
from .entries import FILTER_FIELDS, entry_detail, list_entries, restore_command
from .stats import daily, served, totals, verdicts_by

__all__ = ["FILTER_FIELDS", "daily", "demand", "entry_detail", "list_entries", "restore_command", "served", "totals",
           "verdicts_by"]
