"""Scheduled LRU eviction + GC inside the service: to the byte budget, by last restore, one process at a time."""
from __future__ import annotations

import datetime as dt
import time

import pytest
from sqlalchemy import func, select, update

import cachesvc
from cachesvc.models import AuditRecord, Blob, Version, utcnow
from tests.helpers.apps import make_tokens
from tests.helpers import get_blob, key, publish, resolve_params

pytestmark = [pytest.mark.backends("database"),  # one round at a time: each database's lock
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]


def make_app(tmp_path, database_url, storage_settings, **settings):
    app = cachesvc.create_app({"TESTING": True, "DATA_DIR": str(tmp_path / "data"), "DATABASE_URL": database_url,
                               **storage_settings, **settings})
    return app


@pytest.fixture
def instances(tmp_path, database_url, storage_settings, monkeypatch):
    """``instances(n, interval)``: n service instances on one database and blob store, budget 700 bytes, no grace."""
    for name in ("CACHESVC_LRU_BUDGET_BYTES", "CACHESVC_GC_INTERVAL_SECONDS", "CACHESVC_GC_GRACE_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    made = []

    def build(n, interval=0.0):
        apps = [make_app(tmp_path, database_url, storage_settings, LRU_BUDGET_BYTES=700, GC_INTERVAL_SECONDS=interval,
                         GC_GRACE_SECONDS=0) for _ in range(n)]
        tokens = made[0].config["TOKENS"] if made else make_tokens(apps[0])  # one database: token names are unique
        for a in apps:
            a.config["TOKENS"] = tokens
        made.extend(apps)
        return apps

    yield build
    for a in made:
        a.extensions["cachesvc_scheduler"].stop()
        a.extensions["cachesvc"].db.engine.dispose()


def writer(app):
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {app.config['TOKENS']['write']}"
    return c


def restored_days_ago(app, version_id, days):
    with app.extensions["cachesvc"].db.session() as s:
        s.execute(update(Version).where(Version.id == version_id)
                  .values(last_restored_at=utcnow() - dt.timedelta(days=days)))


def three_versions(app):
    """Three keys of 300 bytes each (900 > the 700 budget); the shape 'b' one restored longest ago."""
    c = writer(app)
    ids = {shape: publish(c, {"f": shape.encode() * 300}, key(shape=shape))["version"]["id"] for shape in "abc"}
    for shape, days in (("a", 1), ("b", 9), ("c", 3)):
        restored_days_ago(app, ids[shape], days)
    return ids


def test_a_round_evicts_the_least_recently_restored_to_the_budget_and_collects(instances):
    app, = instances(1)
    ids = three_versions(app)
    result = app.extensions["cachesvc_scheduler"].run_once()
    assert result["purge"]["versions"] == [ids["b"]]
    assert result["gc"]["blobs_deleted"] == 1 and result["gc"]["bytes_freed"] == 300
    c = writer(app)
    assert not c.get("/api/v1/resolve", query_string=resolve_params(key(shape="b"))).json["hit"]
    assert c.get("/api/v1/resolve", query_string=resolve_params(key(shape="a"))).json["hit"]
    with app.extensions["cachesvc"].db.session() as s:
        actions = s.execute(select(AuditRecord.action, AuditRecord.actor).order_by(AuditRecord.id)).all()
    assert [a for a in actions if a[1] == "scheduler"] == [("purge", "scheduler"), ("gc", "scheduler")]
    # within budget now: the next round purges nothing
    assert app.extensions["cachesvc_scheduler"].run_once()["purge"]["version_count"] == 0


def test_the_gc_grace_keeps_evicted_blobs_for_restores_in_flight(tmp_path, database_url, storage_settings):
    app = make_app(tmp_path, database_url, storage_settings, LRU_BUDGET_BYTES=700)  # default grace: 2 h
    try:
        app.config["TOKENS"] = make_tokens(app)
        ids = three_versions(app)
        answer = writer(app).get("/api/v1/resolve", query_string=resolve_params(key(shape="b"))).json  # in flight
        restored_days_ago(app, ids["b"], 9)
        result = app.extensions["cachesvc_scheduler"].run_once()
        assert result["purge"]["versions"] == [ids["b"]] and result["gc"]["blobs_deleted"] == 0
        blob = next(iter(answer["blobs"].values()))
        assert get_blob(writer(app), blob["url"]) == b"b" * 300  # the restore that resolved it still finishes
    finally:
        app.extensions["cachesvc"].db.engine.dispose()


def test_only_one_instance_runs_a_round_at_a_time(instances):
    a, b = (x.extensions["cachesvc_scheduler"] for x in instances(2))
    with a._runner_lock() as mine:
        assert mine
        assert b.run_once() is None
    assert b.run_once() is not None  # free again


def test_the_schedule_runs_inside_both_instances_and_evicts_once(instances):
    seed, = instances(1)  # no schedule: a round between two publishes would evict by creation time
    ids = three_versions(seed)
    two_apps = instances(2, interval=0.2)
    for app in two_apps:
        assert app.test_client().get("/healthz").status_code == 200  # the first request starts the thread
        assert app.extensions["cachesvc_scheduler"]._thread.is_alive()
    deadline = time.monotonic() + 30
    db = two_apps[0].extensions["cachesvc"].db
    while time.monotonic() < deadline:
        with db.session() as s:
            gc_runs = s.scalar(select(func.count()).select_from(AuditRecord).where(AuditRecord.action == "gc"))
        if gc_runs >= 4:
            break
        time.sleep(0.2)
    assert gc_runs >= 4, "the scheduled rounds did not run"
    with db.session() as s:
        purges = s.scalars(select(AuditRecord).where(AuditRecord.action == "purge")).all()
        states = dict(s.execute(select(Version.id, Version.state)).all())
        stored = s.scalar(select(func.coalesce(func.sum(Blob.stored_size), 0)))
    assert len(purges) == 1 and purges[0].details["versions"] == [ids["b"]]
    assert ids["b"] not in states  # purged, then its row collected (no grace here)
    assert int(stored) <= 700


def test_schedule_off_by_default_starts_no_thread(app, client):
    client.get("/healthz")
    assert app.extensions["cachesvc_scheduler"]._thread is None
