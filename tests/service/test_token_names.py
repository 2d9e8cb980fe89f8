"""Issue 27 item 10: token names are unique among active tokens (the migration, the API, the CLI, the page),
so `cachesvc token revoke NAME` revokes exactly one; a revoked token's name may be given again."""
from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import create_engine, inspect, text

from cachesvc import db
from tests.helpers.commands import cli, settings_env

LOCAL = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)


@LOCAL
def test_a_duplicate_name_is_a_clear_4xx_and_a_cli_usage_error_and_revoke_by_name_revokes_one(app, tokens):
    admin = app.test_client()
    admin.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {tokens['admin']}"
    first = admin.post("/api/v1/admin/tokens", json={"name": "ci", "scope": "write"})
    assert first.status_code in (200, 201), first.json
    again = admin.post("/api/v1/admin/tokens", json={"name": "ci", "scope": "read"})
    assert again.status_code == 400 and "a token named 'ci' is already active" in again.json["error"]["message"]
    env = settings_env(app)
    code, out, err = cli(env, "token", "create", "--scope", "read", "--name", "ci")
    assert code == 2 and "already active" in err and "cachesvc token revoke ci" in err, (out, err)
    code, out, _ = cli(env, "token", "revoke", "ci")
    assert code == 0 and len(out.strip().splitlines()) == 1, out
    code, out, _ = cli(env, "token", "create", "--scope", "read", "--name", "ci")
    assert code == 0, "a revoked token's name may be given again"
    names = [t["name"] for t in admin.get("/api/v1/admin/tokens").json["tokens"]]
    assert names.count("ci") == 2


def test_the_migration_renames_active_duplicates_and_leaves_revoked_ones(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    db.upgrade(url, "0010")
    engine = create_engine(url)
    now, rows = dt.datetime(2026, 12, 1), [("ci", None), ("ci", None), ("ci", dt.datetime(2026, 12, 1)),
                                           ("ci-2", None), ("ci", None), ("fleet", None)]
    with engine.begin() as conn:
        for i, (name, revoked) in enumerate(rows, 1):
            conn.execute(text("INSERT INTO tokens (id, name, scope, token_hash, created_at, revoked_at) "
                              "VALUES (:i, :n, 'read', :h, :c, :r)"), {"i": i, "n": name, "h": f"{i:064d}", "c": now,
                                                                      "r": revoked})
    db.upgrade(url)
    with engine.connect() as conn:
        got = dict(conn.execute(text("SELECT id, name FROM tokens ORDER BY id")).all())
    assert got == {1: "ci", 2: "ci-2-2", 3: "ci", 4: "ci-2", 5: "ci-5", 6: "fleet"}
    assert "uq_tokens_active_name" in {i["name"] for i in inspect(engine).get_indexes("tokens")}
    with pytest.raises(Exception), engine.begin() as conn:
        conn.execute(text("INSERT INTO tokens (name, scope, token_hash, created_at) VALUES "
                          "('fleet', 'read', :h, :c)"), {"h": "f" * 64, "c": now})
    engine.dispose()
