"""Resolve: a key to what a restore fetches.

::

    GET /api/v1/resolve   resolve   the key's newest committed version (last committed, of the kind asked)
                                    -> else the fallback steps asked for (fallback: other shapes, other
                                       environments, in order) -> else a miss with the nearest keys (explain)
                                    the answer (answer.py, one builder): files + where to fetch each blob,
                                    presigned or through the service, loose or packed
                                    counted off the request path (HitLog: written every few seconds)
    POST /api/v1/verdicts record_verdicts  what the restoring process saw afterwards (client.verify()):
                                    paid off, partial, or no hits (a problem)
"""
from .fallback import STEPS as FALLBACK_STEPS
from .hits import HitLog
from .resolver import resolve
from .verdicts import record as record_verdicts

__all__ = ["FALLBACK_STEPS", "HitLog", "record_verdicts", "resolve"]
