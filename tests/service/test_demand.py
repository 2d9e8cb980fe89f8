"""The fleet's shape demand (issue 41, part 1, service side): processes report each input shape's calls by how
each was served (``POST /api/v1/usage``); the service keeps them per model name and key family, within its
caps, and answers them busiest first (``GET /api/v1/demand``). On SQLite and PostgreSQL: the counts are
upserts and the caps are held under each database's own lock."""
from __future__ import annotations

import datetime as dt
import io
import json
import threading

import pytest
import requests
from sqlalchemy import func, select, update

from cachesvc.api import usage as usage_api
from cachesvc.demand import ReportLimiter
from cachesvc.models import DemandFamily, DemandShape, Entry
from cachesvc_client.shared import keys
from tests.helpers import key, publish, set_settings
from tests.helpers.backends import SQLITE
from tests.helpers.service import admin, with_token

#: upserts, locks and orderings each database runs its own way (storage plays no part: the local folder); the
#: checks answered before the database is reached run on SQLite only (``SQLITE``)
pytestmark = pytest.mark.backends("database")


def family(name: str = "mlp", tags=None, **env) -> dict:
    """A key family: a key without its shape."""
    k = key(name=name, tags=tags, **env)
    del k["shape"]
    return k


def served(package: int = 0, compile: int = 0, eager: int = 0) -> dict:
    return {"package": package, "compile": compile, "eager": eager}


def report(shapes: dict, fam=None) -> dict:
    """A report item: ``shapes`` is {shape: served}."""
    return {"key": fam or family(), "shapes": [{"shape": s, "served": how} for s, how in shapes.items()]}


def post(c, *items, **extra):
    return c.post("/api/v1/usage", json={"reports": list(items), **extra})


def demand(c, name="mlp", **query):
    resp = c.get("/api/v1/demand", query_string={"name": name, **query})
    assert resp.status_code == 200, resp.json
    return resp.json["items"]


def stored(app) -> tuple:
    """(families, shapes, calls) in the database."""
    calls = DemandShape.package_calls + DemandShape.compile_calls + DemandShape.eager_calls
    with app.extensions["cachesvc"].db.session() as s:
        return (s.scalar(select(func.count()).select_from(DemandFamily)),
                s.scalar(select(func.count()).select_from(DemandShape)),
                int(s.scalar(select(func.coalesce(func.sum(calls), 0)))))


@pytest.fixture
def published(client):
    """Models ``mlp`` and ``bert`` have an entry each (demand is kept only for a name that has one)."""
    publish(client, {"f": b"mlp"}, key())
    publish(client, {"f": b"bert"}, key(name="bert"))


# -- recorded and read back ----------------------------------------------------------------------------


def test_a_report_is_recorded_and_read_back_busiest_first(app, client, tokens, published):
    fam = family(tags={"mode": "default"})
    reader = with_token(app, tokens["read"])  # serving processes hold read tokens
    resp = post(reader, report({"f32[8,256]": served(120, 3), "f32[1,256]": served(0, 2, 5)}, fam), seconds=30.0)
    assert resp.status_code == 200, resp.json
    digest = keys.family_digest("mlp", {"mode": "default"}, fam["env"])
    assert resp.json == {"recorded": [{"name": "mlp", "family": digest, "shapes": 2, "dropped": []}]}
    [item] = demand(reader)
    assert {k: item[k] for k in ("name", "family", "env", "tags", "calls", "shapes_on_record")} == {
        "name": "mlp", "family": digest, "env": fam["env"], "tags": {"mode": "default"}, "calls": 130,
        "shapes_on_record": 2}
    assert [(r["shape"], r["calls"], r["served"]) for r in item["shapes"]] == [
        ("f32[8,256]", 123, served(120, 3)), ("f32[1,256]", 7, served(0, 2, 5))]
    for r in item["shapes"]:
        seen = dt.datetime.strptime(r["first_seen"], "%Y-%m-%dT%H:%M:%SZ")
        assert r["last_seen"] == r["first_seen"] and abs(dt.datetime.utcnow() - seen) < dt.timedelta(minutes=5)


def test_reports_add_up_and_last_seen_moves_on(app, client, published):
    assert post(client, report({"a": served(1, 2, 3), "b": served(eager=1)})).status_code == 200
    hour_ago = dt.datetime.utcnow().replace(microsecond=0) - dt.timedelta(hours=1)
    with app.extensions["cachesvc"].db.session() as s:
        s.execute(update(DemandShape).values(first_seen=hour_ago, last_seen=hour_ago))
    assert post(client, report({"a": served(10, 20, 30)})).json["recorded"][0]["shapes"] == 1
    rows = {r["shape"]: r for r in demand(client)[0]["shapes"]}
    assert rows["a"]["served"] == served(11, 22, 33) and rows["a"]["calls"] == 66
    assert rows["a"]["first_seen"] == hour_ago.isoformat() + "Z" < rows["a"]["last_seen"]
    assert rows["b"]["last_seen"] == hour_ago.isoformat() + "Z"  # not in the second report
    # one family twice in one request: both items count
    resp = post(client, report({"b": served(eager=2)}), report({"b": served(package=1)}))
    assert [r["shapes"] for r in resp.json["recorded"]] == [1, 1]
    assert {r["shape"]: r["served"] for r in demand(client)[0]["shapes"]}["b"] == served(1, 0, 3)


def test_concurrent_reports_lose_no_call_and_keep_the_cap_exact(app, published, live_server, tokens):
    """Eight senders at once over real HTTP, each reporting a shared shape 15 times and new shapes of its own
    against a cap of 20: every call of the shared shape counts, and the family ends with exactly 20 shapes."""
    set_settings(app, DEMAND_MAX_SHAPES=20, USAGE_REPORTS_PER_MINUTE=0)
    senders, rounds = 8, 15
    answers, failures = [], []

    def sender(n: int) -> None:
        with requests.Session() as http:
            http.headers["Authorization"] = f"Bearer {tokens['read']}"
            for i in range(rounds):
                body = {"reports": [report({"shared": served(package=1, compile=n % 2),
                                            f"own-{n}-{i}": served(eager=1)})]}
                try:
                    resp = http.post(f"{live_server.url}/api/v1/usage", json=body, timeout=60)
                    (answers if resp.status_code == 200 else failures).append(resp.json())
                except Exception as exc:  # a 500 (not JSON), a dropped connection: a failure of the test
                    failures.append(repr(exc))

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    [item] = demand(admin(app), limit=256)
    shared = next(r for r in item["shapes"] if r["shape"] == "shared")
    assert shared["served"] == served(package=senders * rounds, compile=senders // 2 * rounds)
    assert item["shapes_on_record"] == 20
    recorded = sum(a["recorded"][0]["shapes"] for a in answers)
    dropped = [d for a in answers for d in a["recorded"][0]["dropped"]]
    assert recorded == senders * rounds + 19  # the shared shape in every report, 19 own shapes fit
    assert len(dropped) == senders * rounds - 19 and all("CACHESVC_DEMAND_MAX_SHAPES" in d["reason"] for d in dropped)
    assert stored(app) == (1, 20, senders * rounds + senders // 2 * rounds + 19)


# -- what is kept --------------------------------------------------------------------------------------


def test_a_name_without_an_entry_is_dropped_with_the_reason_and_nothing_is_stored(app, client, published):
    resp = post(client, report({"a": served(1), "b": served(2)}, family(name="never-published")),
                report({"a": served(1)}))
    assert resp.status_code == 200, resp.json
    nothing, kept = resp.json["recorded"]
    assert nothing["name"] == "never-published" and nothing["shapes"] == 0
    assert [d["shape"] for d in nothing["dropped"]] == ["a", "b"]
    assert all(d["reason"].startswith("no entry is named 'never-published': demand is kept for published models")
               for d in nothing["dropped"])
    assert kept["shapes"] == 1 and kept["dropped"] == []
    assert demand(client, "never-published") == []
    assert stored(app) == (1, 1, 1)


def test_the_shape_cap_drops_new_shapes_keeps_counting_old_ones_and_touches_no_other_model(app, client, published):
    set_settings(app, DEMAND_MAX_SHAPES=3)
    first = post(client, report({"s1": served(1), "s2": served(5), "s3": served(2), "s4": served(9),
                                 "s5": served(eager=1)})).json["recorded"][0]
    assert first["shapes"] == 3  # the most called new shapes fit first
    assert [d["shape"] for d in first["dropped"]] == ["s1", "s5"]
    reason = first["dropped"][0]["reason"]
    assert "3 shapes on record" in reason and "CACHESVC_DEMAND_MAX_SHAPES" in reason
    # a flood of new shapes for mlp: none is kept, the shapes on record keep counting
    for i in range(5):
        again = post(client, report({"s4": served(1), **{f"flood-{i}-{j}": served(100) for j in range(60)}}))
        assert again.json["recorded"][0]["shapes"] == 1 and len(again.json["recorded"][0]["dropped"]) == 60
    [item] = demand(client)
    assert [(r["shape"], r["calls"]) for r in item["shapes"]] == [("s4", 14), ("s2", 5), ("s3", 2)]
    # another model, and another family of the same model, have their own room
    assert post(client, report({"b1": served(1), "b2": served(1), "b3": served(1)}, family(name="bert"))
                ).json["recorded"][0]["shapes"] == 3
    other_tags = family(tags={"mode": "max-autotune"})
    assert post(client, report({"t1": served(1)}, other_tags)).json["recorded"][0]["shapes"] == 1
    assert [i["shapes_on_record"] for i in demand(client, "bert")] == [3]
    assert sorted(i["shapes_on_record"] for i in demand(client)) == [1, 3]


def test_the_family_cap_drops_new_families_of_a_name_only(app, client, published):
    set_settings(app, DEMAND_MAX_FAMILIES=2)
    for mode in ("a", "b"):
        assert post(client, report({"s": served(1)}, family(tags={"mode": mode}))).json["recorded"][0]["shapes"] == 1
    third = post(client, report({"s": served(1)}, family(tags={"mode": "c"}))).json["recorded"][0]
    assert third["shapes"] == 0 and "CACHESVC_DEMAND_MAX_FAMILIES" in third["dropped"][0]["reason"]
    assert post(client, report({"s": served(4)}, family(tags={"mode": "a"}))).json["recorded"][0]["shapes"] == 1
    assert post(client, report({"s": served(1)}, family(name="bert"))).json["recorded"][0]["shapes"] == 1
    assert [(i["tags"], i["calls"]) for i in demand(client)] == [({"mode": "a"}, 5), ({"mode": "b"}, 1)]


def test_purge_and_gc_leave_demand_and_a_name_without_entries_takes_no_more(app, client, published):
    post(client, report({"s": served(3)}))
    boss = admin(app)
    assert boss.post("/api/v1/admin/purge", json={"name": "mlp"}).status_code == 200
    set_settings(app, GC_GRACE_SECONDS=0.0)
    with app.extensions["cachesvc"].db.session() as s:  # GC leaves a new entry its publish's margin
        s.execute(update(Entry).values(created_at=dt.datetime.utcnow() - dt.timedelta(days=1)))
    gc = boss.post("/api/v1/admin/gc", json={})
    assert gc.status_code == 200 and gc.json["entries_deleted"] == 1, gc.json
    assert [i["calls"] for i in demand(client)] == [3]
    assert post(client, report({"s": served(1)})).json["recorded"][0]["shapes"] == 0
    assert [i["calls"] for i in demand(client)] == [3]


# -- who may report, and how often -----------------------------------------------------------------------


def test_a_report_needs_a_token_unless_anonymous_read_and_401_comes_before_400(app, published):
    anonymous = app.test_client()
    set_settings(app, ANONYMOUS_READ=False)
    for body in ({"reports": [report({"s": served(1)})]}, {"reports": "not a list"}):
        resp = anonymous.post("/api/v1/usage", json=body)
        assert resp.status_code == 401 and resp.json["error"]["code"] == "unauthorized", resp.json
    bad_token = with_token(app, "cs_" + "x" * 43)
    assert post(bad_token, report({"s": served(1)})).status_code == 401
    assert anonymous.get("/api/v1/demand", query_string={"name": "mlp"}).status_code == 401
    assert stored(app) == (0, 0, 0)
    set_settings(app, ANONYMOUS_READ=True)
    assert post(anonymous, report({"s": served(1)})).json["recorded"][0]["shapes"] == 1
    assert demand(anonymous)[0]["calls"] == 1


def test_past_the_per_minute_limit_a_sender_gets_429_with_retry_after_and_nothing_is_stored(app, client, tokens,
                                                                                             published):
    set_settings(app, USAGE_REPORTS_PER_MINUTE=3)
    for _ in range(3):
        assert post(client, report({"s": served(1)})).status_code == 200
    refused = post(client, report({"s": served(1000)}))
    assert refused.status_code == 429 and refused.json["error"]["code"] == "rate_limited", refused.json
    assert "CACHESVC_USAGE_REPORTS_PER_MINUTE" in refused.json["error"]["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 20 and refused.json["error"]["details"] == {
        "retry_after": int(refused.headers["Retry-After"])}
    assert post(client, {"not": "even valid"}).status_code == 429  # every request counts, before its body is read
    assert stored(app) == (1, 1, 3)
    reader = with_token(app, tokens["read"])  # another token has a limit of its own
    assert post(reader, report({"s": served(1)})).status_code == 200
    assert stored(app) == (1, 1, 4)


def test_the_limiter_refills_over_the_minute_forgets_the_oldest_sender_and_can_be_off():
    now = [0.0]
    limiter = ReportLimiter(max_senders=2, clock=lambda: now[0])
    assert [limiter.admit("a", 2) for _ in range(2)] == [None, None]
    assert limiter.admit("a", 2) == pytest.approx(30.0)  # one report every 30 s
    now[0] = 29.0
    assert limiter.admit("a", 2) == pytest.approx(1.0)  # refused reports are not counted
    now[0] = 30.0
    assert limiter.admit("a", 2) is None and limiter.admit("a", 2) is not None
    for sender in ("b", "c"):
        assert limiter.admit(sender, 2) is None
    assert len(limiter) == 2  # "a", the least recently seen, is forgotten: a full bucket again
    assert limiter.admit("a", 2) is None
    assert all(limiter.admit("z", 0) is None for _ in range(1000))


# -- bad reports: a 4xx naming the problem, and nothing stored ------------------------------------------------

GOOD = report({"f32[8]": served(1)})
SHAPE = GOOD["shapes"][0]


def _with(**changes) -> dict:
    item = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = item
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
    return {"reports": [item]}


BAD = {
    "65 shapes": ({"reports": [report({f"s{i}": served(1) for i in range(65)})]}, "json.reports.0.shapes"),
    "17 reports": ({"reports": [GOOD] * 17}, "json.reports"),
    "no reports": ({"reports": []}, "json.reports"),
    "no shapes": (_with(shapes=[]), "json.reports.0.shapes"),
    "a shape too long": (_with(shapes=[{"shape": "x" * (keys.MAX_SHAPE + 1), "served": served(1)}]),
                         "is 2001 characters long"),
    "a shape with a control character": (_with(shapes__0__shape="f32[\n]"), "control characters"),
    "a negative count": (_with(shapes__0__served__package=-1), "json.reports.0.shapes.0.served.package"),
    "a count past 2**31-1": (_with(shapes__0__served__compile=2**31), "json.reports.0.shapes.0.served.compile"),
    "a float count": (_with(shapes__0__served__package=1.0), "Not a valid integer"),
    "a bool count": (_with(shapes__0__served__eager=True), "Not a valid integer"),
    "a string count": (_with(shapes__0__served__package="1"), "Not a valid integer"),
    "a missing count": (_with(shapes__0__served__eager=KeyError), "json.reports.0.shapes.0.served.eager"),
    "no call at all": (_with(shapes__0__served=served()), "at least one call"),
    "a shape twice": (_with(shapes=[SHAPE, SHAPE]), "shape 'f32[8]' is given twice"),
    "an unknown top field": ({**_with(), "window": 30}, "json.window"),
    "an unknown key field": (_with(key__shape="f32[8]"), "json.reports.0.key.shape"),
    "an unknown shape field": (_with(shapes__0__calls=1), "json.reports.0.shapes.0.calls"),
    "an unknown served field": (_with(shapes__0__served__cached=1), "json.reports.0.shapes.0.served.cached"),
    "a missing env field": (_with(key__env__arch=KeyError), "json.reports.0.key.env.arch"),
    "bad tags": (_with(key__tags={"not a key": "v"}), "tag key 'not a key'"),
    "a tag that is no string": (_with(key__tags={"mode": 1}), "json.reports.0.key.tags"),
    "a name too long": (_with(key__name="n" * 201), "name is 201 characters long"),
    "a window past a day": ({**_with(), "seconds": 86401}, "json.seconds"),
}


@SQLITE
@pytest.mark.parametrize("case", BAD)
def test_a_bad_report_is_refused_naming_the_problem_and_stores_nothing(app, client, published, case):
    body, words = BAD[case]
    body = {"reports": [GOOD] + body["reports"][:16], **{k: v for k, v in body.items() if k != "reports"}} \
        if case not in ("17 reports", "no reports") else body  # with a good item before it: all or nothing
    resp = client.post("/api/v1/usage", json=body)
    assert resp.status_code == 422, (case, resp.json)
    assert resp.is_json and resp.json["error"]["code"] == "invalid_request"
    assert words.replace("reports.0.", "reports.1.") in resp.json["error"]["message"] or \
        words in resp.json["error"]["message"], (case, resp.json["error"]["message"])
    assert stored(app) == (0, 0, 0)


@SQLITE
def test_a_body_that_is_not_json_is_a_400_and_one_past_the_limit_a_413_unread(app, client, published):
    resp = client.post("/api/v1/usage", data=b'{"reports": [', content_type="application/json")
    assert resp.status_code == 400 and resp.is_json
    limit = app.view_functions["usage.post"]._cachesvc_body_limit
    body = io.BytesIO(b"{}")
    resp = client.post("/api/v1/usage", input_stream=body, content_type="application/json",
                       environ_overrides={"CONTENT_LENGTH": str(limit + 1)})  # what the headers say, past it
    assert resp.status_code == 413 and resp.json["error"]["code"] == "payload_too_large"
    assert body.tell() == 0 and stored(app) == (0, 0, 0)


@SQLITE
def test_the_largest_report_the_schema_allows_is_read_and_answered(app, client):
    """The body limit is worked out from it (the widest characters, JSON-escaped, indented): no valid
    report is ever a 413. Nothing is published here, so every item is dropped."""
    resp = client.post("/api/v1/usage", data=json.dumps(usage_api.LARGEST, indent=2), content_type="application/json")
    assert resp.status_code == 200, str(resp.json)[:300]
    assert len(resp.json["recorded"]) == 16 and all(r["shapes"] == 0 and len(r["dropped"]) == 64
                                                    for r in resp.json["recorded"])


# -- reading the demand --------------------------------------------------------------------------------------


def test_demand_orders_families_and_shapes_limits_and_filters_by_environment(app, client, published):
    gpu = family(device="NVIDIA H200", arch="sm_90", cuda="12.8")
    post(client, report({"b": served(5), "a": served(5), "c": served(eager=9), "d": served(1)}),
         report({"x": served(100)}, gpu), report({"y": served(1)}, family(tags={"mode": "x"})))
    items = demand(client)
    assert [(i["env"]["device"], i["tags"], i["calls"]) for i in items] == [
        ("NVIDIA H200", {}, 100), ("x86_64", {}, 20), ("x86_64", {"mode": "x"}, 1)]
    assert [r["shape"] for r in items[1]["shapes"]] == ["c", "a", "b", "d"]  # calls, then the shape's text
    assert [r["shape"] for r in demand(client, limit=2)[1]["shapes"]] == ["c", "a"]
    assert demand(client, limit=2)[1]["shapes_on_record"] == 4
    only = demand(client, **gpu["env"])
    assert [(i["family"], i["calls"]) for i in only] == [(keys.family_digest("mlp", {}, gpu["env"]), 100)]
    assert demand(client, **{**gpu["env"], "torch": "9.9"}) == []
    assert demand(client, "bert") == [] and demand(client, "no-such-model") == []


@SQLITE
@pytest.mark.parametrize("query, words", [({}, "query.name"), ({"name": "mlp", "torch": "2.13.0+cpu"},
                                                                "missing: triton, cuda"),
                                          ({"name": "mlp", "limit": 0}, "query.limit"),
                                          ({"name": "mlp", "limit": 257}, "query.limit"),
                                          ({"name": "n" * 201}, "name is 201 characters long")])
def test_bad_demand_queries_are_refused_naming_the_problem(client, query, words):
    resp = client.get("/api/v1/demand", query_string=query)
    assert resp.status_code == 422 and words in resp.json["error"]["message"], resp.json
