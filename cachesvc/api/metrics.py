"""Prometheus exposition (see cachesvc.metrics for what is counted and how workers add up)."""
from __future__ import annotations

from flask import current_app

from .. import metrics
from ..auth import requires
from . import Blueprint

blp = Blueprint("metrics", __name__, url_prefix="/metrics", description="Prometheus metrics")


@blp.route("", methods=["GET"])
@requires("read", open_if="METRICS_PUBLIC")
@blp.response(200, description="Prometheus text format", content_type="text/plain")
def prometheus():
    """Requests by endpoint and status, latencies, bytes in and out, GC runs, and store totals (entries,
    bytes, publishes, restores, hits, misses). Open unless `CACHESVC_METRICS_PUBLIC` is off; then it
    needs a token with `read` (anonymous read does not open it)."""
    return metrics.current().exposition(current_app)
