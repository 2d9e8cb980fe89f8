"""Demand: the calls each input shape of a model made across the fleet, as its processes report them.

::

    POST /api/v1/usage -> check_rate (floods.py: per sender, in memory) -> record (recording.py: per name
                          and key family, within the caps, counts added by upserts) -> demand_families,
                          demand_shapes
    GET /api/v1/demand, the entry page  -> cachesvc.readmodel.demand (reads only)

A *key family* is a key without its shape (name, tags, environment: ``keys.family_digest``). Demand is
kept only for a name that has an entry, at most ``CACHESVC_DEMAND_MAX_FAMILIES`` families a name and
``CACHESVC_DEMAND_MAX_SHAPES`` shapes a family; what would pass a cap is dropped, never anything on
record, so one sender's reports cannot push out another model's, or another family's, demand. Purge and
GC leave demand alone: it is about the model, not about a version.

This module is the door: ``cachesvc.api.usage`` calls ``check_rate`` and ``record``; the app holds one
``ReportLimiter`` (``cachesvc.app.Services``).
"""
from .floods import ReportLimiter, check_rate
from .recording import Caps, record

__all__ = ["Caps", "ReportLimiter", "check_rate", "record"]
