"""Fuzz the whole HTTP API from its own OpenAPI document (issue 5, part 1; issue 15, item 7).

schemathesis reads /api/v1/openapi.json from the in-process WSGI app and
generates requests for every operation: ones the document allows (positive)
and ones that break it (negative: wrong types, missing fields, out-of-range
numbers, unknown fields), with the admin token (every endpoint reachable,
including purge, GC and token revoke: the app is a throwaway) on SQLite and
PostgreSQL, and with no token on SQLite (anonymous read is SQLite's default).

The classes of bad input that were 500s (issue 15, item 7) are rare in what
hypothesis draws from a document: a lone surrogate, JSON nested past the
recursion limit, an integer past every bound, NUL, long valid unicode that
PostgreSQL cannot index. Sampled at random they were missed (50 examples an
operation found none of them on the code that had them), so
``test_every_value_of_a_valid_request_swapped_for_a_hostile_one`` sends each
operation's valid request with each hostile value at each place in turn.

Every answer must be below 500, use a status code the document lists, carry
the documented content type, and conform to the document's schema for it
(every 2xx has one; every error has the ``Error`` shape, through ``default``).
Bounded and deterministic for CI: ``derandomize=True``, ``EXAMPLES`` per
operation and caller on SQLite, half that on PostgreSQL. Marked ``fuzz``: the README's command
leaves them out (``scripts/test.sh -m fuzz`` runs them), CI runs them (.ci/run).
test_bad_input.py pins each class of bad input by name in the README's command.

schemathesis' own pytest loader (``schemathesis.pytest.from_fixture``) reads
``Node._nodeid``, which pytest 9 removed, so these tests draw schemathesis'
hypothesis strategies with ``@given`` themselves, one test per operation.
"""
from __future__ import annotations

import copy
import random

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                 status_code_conformance)
from sqlalchemy import select

from cachesvc.models import Entry
from tests.helpers import key, publish, publish_body, resolve_params, set_settings
from tests.helpers.service import OPERATIONS

pytestmark = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)

EXAMPLES = 50
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]


@pytest.fixture
def seeded(app):
    """The app with one committed and one pending version, so that lookups by id and digest, the
    listings and blob uploads have something to find. ``app.config["KNOWN"]``: path parameters that exist."""
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {app.config['TOKENS']['write']}"
    done = publish(c, {"a/b.py": b"code", "c": b"\x7fELF"}, key(tags={"mode": "default"}))
    pending = c.post("/api/v1/versions", json=publish_body({"d": b"not uploaded yet"})).json
    c.put("/api/v1/remote-cache/fx-graph/pt2:fx-graph-v1::k:c1", query_string=key()["env"], data=b"{}")
    # the sweep sends hundreds of usage reports a minute; their flood limit is test_demand.py's
    set_settings(app, USAGE_REPORTS_PER_MINUTE=0)
    app.config["KNOWN"] = {"version_id": done["version"]["id"], "entry_id": done["version"]["entry_id"],
                           "sha256": pending["upload"][0]["sha256"], "ident": "test-read",
                           "cache": "fx-graph", "key": "pt2:fx-graph-v1::k:c1"}
    return app


def api_schema(app):
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)


def test_every_documented_operation_is_fuzzed(app):
    documented = {op.ok().label for op in api_schema(app).get_all_operations()}
    assert documented == set(OPERATIONS)


# -- hostile values: the classes of bad input that were 500s (issue 15, item 7) ----------------------



def _random_path(low: int, high: int, part: int, parts: int) -> str:
    """Valid components of random characters from ``low..high``: text PostgreSQL cannot compress, so a
    long one really fills an index row (a repeated character compresses to nothing)."""
    rnd = random.Random(low)
    return "/".join("".join(chr(rnd.randint(low, high)) for _ in range(part)) for _ in range(parts))


#: Text a URL can carry: nested JSON past the recursion limit (tags), NUL, long valid unicode of 2-, 3-
#: and 4-byte characters (a path of 1,024 of them overflowed PostgreSQL's btree row: a 503).
URL_TEXT = ["[" * 1000, '{"a":' * 1000, "a\x00b", "x" * 5000, _random_path(0x100, 0x7FF, 127, 8),
            _random_path(0x4E00, 0x9FFF, 85, 12), _random_path(0x20000, 0x2A6DF, 63, 16)]
#: Integers past every bound the document states (ids are 32 bits, offsets 10**9, sizes 2**36).
HUGE_INTS = [2**31, 2**63, -(2**63) - 1, 10**30, 10**300]
URL_VALUES = URL_TEXT + [str(n) for n in HUGE_INTS]
#: Only a JSON body carries a lone surrogate (a URL is UTF-8 bytes; raw bytes: test_bad_input.py).
SURROGATES = ["\ud800", "a\udfffb", "x/\udcff"]


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


#: ... and real nesting (a body nested past the recursion limit: test_api.py, the serializer can't send it)
BODY_VALUES = SURROGATES + URL_TEXT + HUGE_INTS + [_nested(200)]


def _paths(value, prefix=()):
    """The path (keys from the top) of every value under a JSON value: where a hostile value may go."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield prefix + (k,)
        yield from _paths(v, prefix + (k,))


def _spoiled(value, path, new, as_key=False):
    """``value`` with the value at ``path`` replaced by ``new`` (or its key, ``as_key``); the containers on
    the way are copied (schemathesis' own values, such as a DelimitedValue, cannot be deep-copied)."""
    out = copy.copy(value)
    if len(path) > 1:
        out[path[0]] = _spoiled(value[path[0]], path[1:], new, as_key)
    elif as_key:
        out[new] = out.pop(path[0])
    else:
        out[path[0]] = new
    return out


def valid_requests(known: dict) -> dict:
    """A request each operation accepts (body and query) for the hostile cases to spoil one value of:
    values that only the document's types allow are mostly refused for another reason (a name's rules)."""
    k, env = key(tags={"mode": "default"}), key()["env"]
    digest, version = known["sha256"], known["version_id"]
    return {
        "POST /api/v1/versions": {"body": publish_body({"a/b.py": b"code"}, k, kind="mega-cache", merge=True,
                                                       meta={"note": "n"}, compile_seconds=1.5)},
        "POST /api/v1/versions/{version_id}/commit": {"body": {"uploaded": [{"sha256": digest, "encoding": "zstd"}],
                                                               "packs": []}},
        "POST /api/v1/versions/{version_id}/packs": {"body": {"packs": [{"sha256": digest, "size": 10}]}},
        "PUT /api/v1/blobs/{sha256}": {"query": {"version": version, "encoding": "identity"}},
        "PUT /api/v1/packs/{sha256}": {"query": {"version": version}},
        "GET /api/v1/resolve": {"query": {**resolve_params(k), "fallback": "shape", "fallback_max_bytes": 100,
                                          "kind": "inductor-dir"}},
        "POST /api/v1/verdicts": {"body": {"versions": [version], "verdict": "no_hits", "first_call_seconds": 0.5}},
        "POST /api/v1/usage": {"body": {"reports": [{"key": {f: k[f] for f in ("name", "tags", "env")}, "shapes": [
            {"shape": k["shape"], "served": {"package": 3, "compile": 1, "eager": 0}}]}], "seconds": 30.0}},
        "GET /api/v1/demand": {"query": {"name": "mlp", **env, "limit": 10}},
        "GET /api/v1/entries": {"query": {"name": "mlp", "shape": k["shape"], "tags": '{"mode":"default"}',
                                          "tag": "mode=default", **env, "kind": "inductor-dir", "sort": "largest",
                                          "limit": 10, "offset": 0}},
        "GET /api/v1/stats": {"query": {"days": 7}},
        "POST /api/v1/admin/purge": {"body": {"name": "mlp", "torch_version": env["torch"], "device": env["device"],
                                              "older_than": 1, "keep_latest": 1, "dry_run": True}},
        "GET /api/v1/admin/audit": {"query": {"action": "publish", "limit": 5, "offset": 0}},
        "POST /api/v1/admin/tokens": {"body": {"name": "fuzz", "scope": "read"}},
        "GET /api/v1/remote-cache/{cache}/{key}": {"query": env},
        "PUT /api/v1/remote-cache/{cache}/{key}": {"query": env},
    }


def hostile_requests(valid: dict, known: dict):
    """(what, changes) for each hostile value at each place of a valid request: every body value and
    object key, every query parameter, every path parameter."""
    for part, values in (("body", BODY_VALUES), ("query", URL_VALUES)):
        if part not in valid:
            continue
        for path in _paths(valid[part]):
            for new in values:
                yield f"{part}{list(path)} = {new!r:.40}", {part: _spoiled(valid[part], path, new)}
            if part == "body" and isinstance(path[-1], str):  # an object's key: meta, tags, roots, ...
                for new in SURROGATES + ["a\x00b", "[" * 1000]:
                    yield f"body key {list(path)} -> {new!r:.40}", {part: _spoiled(valid[part], path, new, True)}
    for name in known:
        for new in URL_VALUES:
            yield f"path {name} = {new!r:.40}", {"path_parameters": {**known, name: new}}


# -- the tests -------------------------------------------------------------------------------------

#: (database, caller, examples): PostgreSQL gets half the examples; what differs there is the database
CALLERS = [pytest.param("sqlite", "admin", EXAMPLES, id="sqlite-admin"),
           pytest.param("sqlite", "anonymous", EXAMPLES, id="sqlite-anonymous"),
           pytest.param("postgres", "admin", EXAMPLES // 2, id="postgres-admin", marks=pytest.mark.postgres)]


def _known(seeded, path: str) -> dict:
    return {k: v for k, v in seeded.config["KNOWN"].items() if "{%s}" % k in path}


@pytest.mark.fuzz
@pytest.mark.parametrize("database_url,who,examples", CALLERS, indirect=["database_url"])
@pytest.mark.parametrize("operation", OPERATIONS)
def test_fuzz_operation(seeded, operation, who, examples):
    method, path = operation.split(" ", 1)
    op = api_schema(seeded)[path][method]
    headers = {"Authorization": f"Bearer {seeded.config['TOKENS']['admin']}"} if who == "admin" else {}
    known = _known(seeded, path)
    strategies = [op.as_strategy(GenerationMode.POSITIVE), op.as_strategy(GenerationMode.NEGATIVE)]
    if known:  # random ids and digests rarely exist: also aim at ones that do
        strategies.append(op.as_strategy(GenerationMode.POSITIVE, path_parameters=known))
    cases = st.one_of(strategies)

    @given(case=cases)
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        case.call_and_validate(headers=headers, checks=CHECKS)

    run()


@pytest.mark.fuzz
@pytest.mark.parametrize("database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
def test_every_value_of_a_valid_request_swapped_for_a_hostile_one(seeded):
    """Exhaustive where the fuzz samples: each operation's valid request with each hostile value at each
    place in turn (~1,700 requests a database), every answer checked against the document."""
    schema, failures, sent = api_schema(seeded), [], 0
    headers = {"Authorization": f"Bearer {seeded.config['TOKENS']['admin']}"}
    valid = valid_requests(seeded.config["KNOWN"])
    for operation in OPERATIONS:
        method, path = operation.split(" ", 1)
        op, known = schema[path][method], _known(seeded, path)
        for what, changes in hostile_requests(valid.get(operation, {}), known):
            sent += 1
            try:
                op.Case(**{"path_parameters": known, **changes}).call_and_validate(headers=headers, checks=CHECKS)
            except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup, or the app's (a 500)
                failures.append(f"{operation}: {what}: {type(exc).__name__}: {str(exc)[:300]}")
    assert sent > 1000
    assert not failures, f"{len(failures)} of {sent}:\n" + "\n".join(failures[:15])
    _pages_render(seeded, headers)


def _pages_render(app, headers) -> None:
    """What the sweep stored renders: one stored value (a lone surrogate in meta) made a page a 500 for
    good; and the index's own query parsing (not in the document) takes the URL values."""
    c = app.test_client()
    with app.extensions["cachesvc"].db.session() as s:
        entry_ids = s.scalars(select(Entry.id)).all()
    assert entry_ids
    for url in [f"/entries/{i}" for i in entry_ids] + ["/", "/stats"]:
        assert c.get(url, headers=headers).status_code == 200, url
    for name in ("offset", "tag", "name", "kind", "sort", "days"):
        for value in URL_VALUES:
            resp = c.get("/" if name != "days" else "/stats", query_string={name: value}, headers=headers)
            assert resp.status_code < 500, (name, value[:40])
