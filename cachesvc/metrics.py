"""Prometheus metrics at /metrics, right across gunicorn workers.

Two sources:

* Per-request numbers (requests by endpoint and status, latencies, bytes in
  and out) are ``prometheus_client`` counters and histograms. ``cachesvc
  serve`` sets ``PROMETHEUS_MULTIPROC_DIR`` (a fresh folder under the data
  dir) before gunicorn forks, so every worker writes its own files and
  ``/metrics`` sums them (prometheus_client's multiprocess mode). Under
  another server, set ``PROMETHEUS_MULTIPROC_DIR`` to an empty folder
  yourself; without it each process reports only its own requests.
* Cache totals (entries, versions, blobs, stored and logical bytes,
  publishes, restores, misses, fallbacks, verdicts and hits, compile seconds
  saved, GC runs) are read from the database at scrape time, so they are
  exact whatever the number of workers and survive restarts; what each counts
  is in ``cachesvc.readmodel.stats``.
"""
from __future__ import annotations

import os
import time

from flask import Flask, Response, g, request
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import readmodel


class _DatabaseCollector:
    def __init__(self, app: Flask):
        self.app = app

    def collect(self):
        svc = self.app.extensions["cachesvc"]
        with svc.db.session() as s:
            t = readmodel.totals(s)
        for name, key, doc in (("entries", "entries", "Entries with a committed version"),
                               ("versions", "versions", "Committed versions"),
                               ("blobs", "blobs", "Blobs in storage"),
                               ("stored_bytes", "stored_bytes", "Bytes in blob storage"),
                               ("logical_bytes", "logical_bytes", "Bytes of all committed versions, before dedup")):
            yield GaugeMetricFamily(f"cachesvc_{name}", doc, value=t[key])
        for name, key, doc in (("publishes", "publishes", "Versions committed"),
                               ("restores", "restores", "Resolves that delivered a version (exact key or fallback)"),
                               ("misses", "misses", "Resolves that delivered nothing"),
                               ("fallbacks", "fallbacks", "Resolves a fallback answered (counted in restores too)"),
                               ("hits", "hits", "Restores whose process reported cache hits (verdicts paid_off, "
                                                "partial)"),
                               ("gc_runs", "gc_runs", "Garbage-collection runs (every process, the CLI, the "
                                                      "scheduler)"),
                               ("compile_seconds_saved", "compile_seconds_saved",
                                "Cold compile seconds minus the restored first call, over exact-key hit verdicts "
                                "that reported their first call")):
            yield CounterMetricFamily(f"cachesvc_{name}", doc, value=t[key])
        verdicts = CounterMetricFamily("cachesvc_verdicts", "Verdicts restoring processes reported, by verdict",
                                       labels=["verdict"])
        for verdict, n in t["verdicts"].items():
            verdicts.add_metric([verdict], n)
        yield verdicts


class Metrics:
    """The process-level metrics of one app; ``install`` hooks them into the request cycle."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("cachesvc_http_requests", "HTTP requests", ["endpoint", "method", "status"],
                                registry=r)
        self.latency = Histogram("cachesvc_http_request_seconds", "HTTP request latency", ["endpoint"], registry=r,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.bytes_in = Counter("cachesvc_blob_bytes_in", "Blob bytes received: through the service, or "
                                "uploaded straight to storage (presigned) and committed", ["via"], registry=r)
        self.bytes_out = Counter("cachesvc_blob_bytes_out", "Blob bytes sent through the service, or handed "
                                 "out as presigned URLs in resolve answers", ["via"], registry=r)
        self.remote_cache = Counter("cachesvc_remote_cache_requests", "Inductor live remote-cache requests by "
                                    "cache and result (hit, miss, corrupt: the stored bytes are not the value PUT, "
                                    "put, too_large)", ["cache", "result"], registry=r)

    def install(self, app: Flask) -> None:
        app.before_request(self._start)
        app.after_request(self._finish)
        app.extensions["cachesvc_db_collector"] = _DatabaseCollector(app)

    @staticmethod
    def _start() -> None:
        g.metrics_t0 = time.perf_counter()

    def _finish(self, resp):
        endpoint = request.endpoint or "unmatched"
        self.requests.labels(endpoint, request.method, str(resp.status_code)).inc()
        t0 = g.get("metrics_t0")
        if t0 is not None:
            self.latency.labels(endpoint).observe(time.perf_counter() - t0)
        return resp

    def exposition(self, app: Flask) -> Response:
        """The text exposition: this process's (or all workers') metrics plus the database totals."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            body = generate_latest(registry)
        else:
            body = generate_latest(self.registry)
        db_registry = CollectorRegistry(auto_describe=False)
        db_registry.register(app.extensions["cachesvc_db_collector"])
        # content_type, not mimetype: CONTENT_TYPE_LATEST has its charset, which mimetype= would add again
        return Response(body + generate_latest(db_registry), content_type=CONTENT_TYPE_LATEST)


def current() -> Metrics:
    """The running app's Metrics."""
    from flask import current_app

    return current_app.extensions["cachesvc_metrics"]
