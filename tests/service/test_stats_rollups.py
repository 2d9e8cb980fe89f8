"""The stats read running totals, not the whole events table; retention deletes old events and audit
records (issue 26, row 10). At a million events /metrics took 0.5-1.2 s and /api/v1/stats 1.9-3.9 s.

``from_events`` is how the stats were computed before (a scan of events and audit_log): the totals
must be the same numbers, a scrape must run the same statements at any event count and read no
``events`` row, and the numbers must outlive the events' retention.
"""
from __future__ import annotations

import datetime as dt

import pytest
from alembic import command
from sqlalchemy import case, event, func, insert, select

from cachesvc import db as cachesvc_db, readmodel, rollups
from cachesvc.lifecycle import Scheduler, actions, retention
from cachesvc.models import AuditRecord, Event, EventRollup, utcnow
from tests.helpers import key, publish, resolve_params, set_settings

pytestmark = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
BOTH = pytest.mark.parametrize("database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
                               indirect=True)


def from_events(s) -> dict:
    """The counts the stats took from a scan of events and audit_log before running totals."""
    counted = case(((Event.kind == "miss") & Event.version_id.isnot(None), "fallback_restore"), else_=Event.kind)
    by_kind = {k: (n, round(float(sec), 3)) for k, n, sec in s.execute(
        select(counted, func.count(), func.coalesce(func.sum(Event.seconds), 0.0)).group_by(counted))}
    gc_runs = s.scalar(select(func.count()).select_from(AuditRecord).where(AuditRecord.action == "gc"))
    return {"by_kind": by_kind, "gc_runs": gc_runs}


def activity(app, client) -> int:
    """Publishes, hits, misses, a fallback, verdicts with saved seconds, a GC: every kind of event."""
    v = publish(client, {"a.bin": b"a" * 100}, key(name="mlp"), compile_seconds=30.0)["version"]["id"]
    publish(client, {"b.bin": b"b" * 50}, key(name="mlp", shape="f32[1]"))
    for _ in range(3):
        assert client.get("/api/v1/resolve", query_string=resolve_params(key(name="mlp"))).json["hit"]
    client.get("/api/v1/resolve", query_string=resolve_params(key(name="none")))
    client.get("/api/v1/resolve", query_string={**resolve_params(key(name="mlp", shape="f32[9]")), "fallback": "shape"})
    for verdict, first in (("paid_off", 2.0), ("partial", None), ("no_hits", 5.0)):
        client.post("/api/v1/verdicts", json={"versions": [v], "verdict": verdict, "first_call_seconds": first})
    actions.gc(app.extensions["cachesvc"], actor="test")
    return v


@BOTH
def test_the_stats_are_the_numbers_the_events_gave(app, client):
    activity(app, client)
    with app.extensions["cachesvc"].db.session() as s:
        before = from_events(s)
        t = readmodel.totals(s)
        days = readmodel.daily(s, 3)
    n = {k: c for k, (c, _) in before["by_kind"].items()}
    assert t["restores"] == n["hit"] + n["fallback_restore"] == 4 and t["misses"] == n["miss"] == 1
    assert t["fallbacks"] == 1 and t["publishes"] == n["publish"] == 2 and t["gc_runs"] == before["gc_runs"] == 1
    assert t["verdicts"] == {"paid_off": 1, "partial": 1, "no_hits": 1} and t["hits"] == 2
    saved = before["by_kind"]["paid_off"][1] + before["by_kind"]["partial"][1]
    assert t["compile_seconds_saved"] == saved == 28.0
    today = days[-1]
    assert (today["restores"], today["misses"], today["verdicts"], today["hits"], today["publishes"]) == (4, 1, 3, 2, 2)
    assert today["stored_bytes"] == t["stored_bytes"] == 150


def _statements(app, client, paths) -> list:
    seen = []
    engine = app.extensions["cachesvc"].db.engine
    listener = lambda conn, cursor, statement, *rest: seen.append(statement)  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        for path in paths:
            assert client.get(path).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    return seen


def _add_events(app, n: int, days_ago: float = 0) -> None:
    at = utcnow() - dt.timedelta(days=days_ago)
    rows = [{"kind": "miss", "at": at, "entry_id": None, "version_id": None, "bytes": 0, "seconds": None}] * n
    with app.extensions["cachesvc"].db.engine.begin() as conn:
        conn.execute(insert(Event.__table__), rows)
        rollups.add(conn, rows)


@BOTH
def test_a_scrape_runs_the_same_statements_at_any_event_count_and_reads_no_event(app, client):
    activity(app, client)
    paths = ["/metrics", "/api/v1/stats", "/stats"]
    _statements(app, client, paths)  # warm: the first request of a process reads more (token cache, schema)
    few = _statements(app, client, paths)
    _add_events(app, 20_000)
    _add_events(app, 5_000, days_ago=40)
    many = _statements(app, client, paths)
    assert many == few
    scans = [q for q in many if " events" in q.replace("\n", " ") and "Event" not in q]
    assert [q for q in scans if "FROM events" in q and "entry_id IN" not in q] == []  # per-entry rates: indexed
    with app.extensions["cachesvc"].db.session() as s:
        assert readmodel.totals(s)["misses"] == 25_001


@BOTH
def test_retention_deletes_old_events_and_audit_records_and_the_stats_keep_their_numbers(app, client):
    svc = app.extensions["cachesvc"]
    activity(app, client)
    _add_events(app, 7, days_ago=100)
    with svc.db.session() as s:
        s.add(AuditRecord(actor="test", action="gc", at=utcnow() - dt.timedelta(days=400)))
    with svc.db.session() as s:
        kept = readmodel.totals(s)
    set_settings(svc, EVENTS_RETENTION_DAYS=90, AUDIT_RETENTION_DAYS=365)
    result = Scheduler(svc).run_once()
    assert result["retention"]["events"] == 7 and result["retention"]["audit"] == 1
    with svc.db.session() as s:
        assert s.scalar(select(func.min(Event.at))) > utcnow() - dt.timedelta(days=90)
        assert s.scalar(select(func.min(AuditRecord.at))) > utcnow() - dt.timedelta(days=365)
        after = readmodel.totals(s)
    assert {k: v for k, v in after.items() if k != "gc_runs"} == {k: v for k, v in kept.items() if k != "gc_runs"}
    assert after["gc_runs"] == kept["gc_runs"] + 1  # this round's own GC
    set_settings(svc, EVENTS_RETENTION_DAYS=0, AUDIT_RETENTION_DAYS=0)
    assert retention.apply(svc)["events"] == 0


@pytest.mark.parametrize("database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
def test_the_migration_fills_the_totals_from_the_events_already_there(app, client, database_url):
    activity(app, client)
    svc = app.extensions["cachesvc"]
    with svc.db.session() as s:
        before = from_events(s)
        t = readmodel.totals(s)
    svc.db.engine.dispose()  # PostgreSQL: no pooled connection holds the table the downgrade drops
    command.downgrade(cachesvc_db.alembic_config(database_url), "0011")
    cachesvc_db.upgrade(database_url)
    with svc.db.session() as s:
        assert s.scalar(select(func.count()).select_from(EventRollup)) > 0
        assert readmodel.totals(s) == t
        assert from_events(s) == before
