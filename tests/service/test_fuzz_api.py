"""Fuzz the whole HTTP API from its own OpenAPI document (issue 5, part 1: bad input at every door).

schemathesis reads /api/v1/openapi.json from the in-process WSGI app and
generates requests for every operation: ones the document allows (positive)
and ones that break it (negative: wrong types, missing fields, out-of-range
numbers, unknown fields). Each runs once with the admin token (every endpoint
reachable, including purge, GC and token revoke: the app is a throwaway) and
once with no token. Every answer must be below 500, use a status code the
document lists, carry the documented content type, and, where the document
gives a schema (every error, through ``default``: the ``Error`` shape),
conform to it.

Bounded and deterministic for CI: ``derandomize=True``, ``EXAMPLES`` per
operation and mode, SQLite and local storage only.

schemathesis' own pytest loader (``schemathesis.pytest.from_fixture``) reads
``Node._nodeid``, which pytest 9 removed, so these tests draw schemathesis'
hypothesis strategies with ``@given`` themselves, one test per operation.
"""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                 status_code_conformance)

from tests.helpers import key, publish, publish_body

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]

EXAMPLES = 50
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]

#: Every operation in the document; test_every_documented_operation_is_fuzzed keeps this list honest.
OPERATIONS = [
    "GET /healthz",
    "GET /metrics",
    "POST /api/v1/versions",
    "GET /api/v1/versions/{version_id}",
    "POST /api/v1/versions/{version_id}/commit",
    "PUT /api/v1/blobs/{sha256}",
    "GET /api/v1/blobs/{sha256}",
    "POST /api/v1/versions/{version_id}/packs",
    "POST /api/v1/versions/{version_id}/uploads",
    "PUT /api/v1/packs/{sha256}",
    "GET /api/v1/packs/{sha256}",
    "GET /api/v1/resolve",
    "POST /api/v1/verdicts",
    "GET /api/v1/entries",
    "GET /api/v1/entries/{entry_id}",
    "GET /api/v1/stats",
    "POST /api/v1/admin/purge",
    "POST /api/v1/admin/gc",
    "GET /api/v1/admin/audit",
    "GET /api/v1/admin/tokens",
    "POST /api/v1/admin/tokens",
    "DELETE /api/v1/admin/tokens/{ident}",
    "GET /api/v1/remote-cache/{cache}/{key}",
    "PUT /api/v1/remote-cache/{cache}/{key}",
]


@pytest.fixture
def seeded(app):
    """The app with one committed and one pending version, so that lookups by id and digest, the
    listings and blob uploads have something to find. ``app.config["KNOWN"]``: path parameters that exist."""
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {app.config['TOKENS']['write']}"
    done = publish(c, {"a/b.py": b"code", "c": b"\x7fELF"}, key(tags={"mode": "default"}))
    pending = c.post("/api/v1/versions", json=publish_body({"d": b"not uploaded yet"})).json
    c.put("/api/v1/remote-cache/fx-graph/pt2:fx-graph-v1::k:c1", query_string=key()["env"], data=b"{}")
    app.config["KNOWN"] = {"version_id": done["version"]["id"], "entry_id": done["version"]["entry_id"],
                           "sha256": pending["upload"][0]["sha256"], "ident": "test-read",
                           "cache": "fx-graph", "key": "pt2:fx-graph-v1::k:c1"}
    return app


def api_schema(app):
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)


def test_every_documented_operation_is_fuzzed(app):
    documented = {op.ok().label for op in api_schema(app).get_all_operations()}
    assert documented == set(OPERATIONS)


@pytest.mark.parametrize("who", ["admin", "anonymous"])
@pytest.mark.parametrize("operation", OPERATIONS)
def test_fuzz_operation(seeded, operation, who):
    method, path = operation.split(" ", 1)
    op = api_schema(seeded)[path][method]
    headers = {"Authorization": f"Bearer {seeded.config['TOKENS']['admin']}"} if who == "admin" else {}
    strategies = [op.as_strategy(GenerationMode.POSITIVE), op.as_strategy(GenerationMode.NEGATIVE)]
    known = {k: v for k, v in seeded.config["KNOWN"].items() if "{%s}" % k in path}
    if known:  # random ids and digests rarely exist: also aim at ones that do
        strategies.append(op.as_strategy(GenerationMode.POSITIVE, path_parameters=known))
    cases = st.one_of(strategies)

    @given(case=cases)
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        case.call_and_validate(headers=headers, checks=CHECKS)

    run()
