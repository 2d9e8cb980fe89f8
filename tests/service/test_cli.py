"""The `cachesvc` commands: bad values get one line naming the flag (exit 2), failures outside the command
line one line saying what to check (exit 1), never a traceback; the admin API's validation in both
modes; the --url mode prints and exits as the direct mode does; nothing is made for a mistyped URL."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest
from sqlalchemy import func, select

from cachesvc import db
from cachesvc.models import AuditRecord, Token, Version
from tests.helpers import foreign_web_server
from tests.helpers.backends import LOCAL, SQLITE
from tests.helpers.commands import assert_one_line, cli, settings_env

SURROGATE = "x\udcff"  # what a name in another encoding becomes in argv (surrogateescape)


def versions(app) -> list:
    with app.extensions["cachesvc"].db.session() as s:
        return sorted(s.execute(select(Version.id, Version.state)).all())


BAD_VALUES = [
    (("token", "create", "--scope", "write", "--name", ""), "--name"),
    (("token", "create", "--scope", "write", "--name", SURROGATE), "--name"),
    (("token", "create", "--scope", "write", "--name", "a\tb"), "--name"),
    (("token", "create", "--scope", "root", "--name", "x"), "--scope"),
    (("token", "revoke", SURROGATE), "printable"),
    (("purge", "--older-than", "nan"), "--older-than"),
    (("purge", "--older-than", "1e400"), "--older-than"),
    (("purge", "--not-restored-for", "-5"), "--not-restored-for"),
    (("purge", "--keep-latest", "-1"), "--keep-latest"),
    (("purge", "--keep-latest", "1.5"), "--keep-latest"),
    (("purge",), "--not-restored-for, --older-than, --keep-latest"),
    (("purge", "--max-total-bytes", "5X"), "--max-total-bytes"),
    (("purge", "--max-total-bytes", "1e5"), "--max-total-bytes"),
    (("purge", "--name", SURROGATE), "--name"),
    (("purge", "--torch-version", ""), "--torch-version"),
    (("serve", "--port", "99999"), "--port"),
    (("serve", "--workers", "0"), "--workers"),
    (("serve", "--host", "999.1.1.1"), "--host"),
    (("db", "upgrade", "--revision", "x"), "--revision"),
]


@SQLITE
@LOCAL
@pytest.mark.parametrize("args,flag", BAD_VALUES, ids=[" ".join(a)[:40] for a, _ in BAD_VALUES])
def test_a_refused_value_is_one_line_naming_the_flag_exit_2_and_changes_nothing(app, catalog, args, flag):
    before = versions(app)
    code, out, err = cli(settings_env(app), *args)
    assert code == 2, (out, err)
    assert_one_line(err, flag)
    assert not re.search(r"\b(not_restored_for|older_than|keep_latest|torch_version|max_total_bytes)\b", err), \
        "a request field's name, not the flag"
    assert versions(app) == before and out == ""


@SQLITE
@LOCAL
def test_the_commands_use_the_api_rules_and_the_sizes_people_write(app, catalog):
    env = settings_env(app)
    code, out, err = cli(env, "purge", "--max-total-bytes", "1.5k", "--dry-run", "--json")
    assert code == 0, err
    assert '"max_total_bytes": 1500' in out  # 1.5k = 1500 bytes, the API's own criterion
    code, out, err = cli(env, "purge", "--keep-latest", "1", "--name", "bert")
    assert code == 0, err
    assert "purged bert" in out and "(400 B)" in out and "400 B freed" in out, out
    with app.extensions["cachesvc"].db.session() as s:
        record = s.scalars(select(AuditRecord).where(AuditRecord.action == "purge")).one()
    assert record.details["entries"] == ["bert"] and record.actor.startswith("cli")


def run_cachesvc(env: Dict[str, str], *args: str, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """`cachesvc ARGS` as a real process, bytes in argv as a shell passes them."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("CACHESVC_")}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "cachesvc.cli", *args], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("env,args,words", [
    ({"CACHESVC_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:1/x"}, ("gc",),
     ("cannot use the database", "127.0.0.1:1", "check CACHESVC_DATABASE_URL")),
    ({"CACHESVC_DATABASE_URL": "postgresql+psycopg://nobody:secret@127.0.0.1:1/x"}, ("token", "list"),
     ("cannot use the database", "***")),
    ({"CACHESVC_DATABASE_URL": "nonsense"}, ("purge", "--name", "x"), ("CACHESVC_DATABASE_URL",)),
    ({"CACHESVC_STORAGE_URL": "ftp://host/x"}, ("gc",), ("CACHESVC_STORAGE_URL", "file:///path or s3://")),
    ({"CACHESVC_STORAGE_URL": "s3://bucket/p", "CACHESVC_S3_ENDPOINT_URL": "http://127.0.0.1:1",
      "CACHESVC_S3_ACCESS_KEY_ID": "k", "CACHESVC_S3_SECRET_ACCESS_KEY": "s"}, ("gc",),
     ("blob storage s3://bucket/p failed", "check CACHESVC_STORAGE_URL")),
    ({"CACHESVC_LRU_BUDGET_BYTES": "lots"}, ("gc",), ("CACHESVC_LRU_BUDGET_BYTES", "500G")),
    ({}, ("token", "revoke", "nobody"), ("no active token has id or name 'nobody'",)),
])
def test_a_failure_outside_the_command_line_is_one_line_saying_what_to_check_exit_1(tmp_path, env, args, words):
    data = tmp_path / "data"
    assert run_cachesvc({"CACHESVC_DATA_DIR": str(data)}, "db", "upgrade").returncode == 0
    done = run_cachesvc({"CACHESVC_DATA_DIR": str(data), **env}, *args)
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines()[-1].startswith(("cachesvc: ", "CACHESVC_")) and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for word in words:
        assert word in done.stderr, (word, done.stderr)
    assert "secret" not in done.stderr


def test_surrogates_in_argv_from_a_shell_are_refused_in_one_line(tmp_path):
    data = tmp_path / "data"
    made = subprocess.run(["bash", "-c", f"{sys.executable} -m cachesvc.cli token create --scope read "
                                         "--name $(printf '\\xed\\xa0\\x80')"],
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("CACHESVC_")},
                               "CACHESVC_DATA_DIR": str(data)}, capture_output=True, text=True, timeout=120)
    assert made.returncode == 2 and "--name" in made.stderr and "Traceback" not in made.stderr, made.stderr


def test_reading_commands_make_no_folder_or_database_for_a_mistyped_path(tmp_path):
    typo = tmp_path / "typo" / "deeper"
    env = {"CACHESVC_DATABASE_URL": f"sqlite:///{typo / 'cachesvc.db'}", "CACHESVC_DATA_DIR": str(tmp_path / "d")}
    current = run_cachesvc(env, "db", "current")
    assert current.returncode == 0 and current.stdout.strip() == (
        f"current: none (no database at {typo / 'cachesvc.db'})  head: {db.head_revision()}"), current
    for args in (("token", "list"), ("token", "revoke", "x"), ("purge", "--name", "x", "--dry-run"), ("gc",)):
        done = run_cachesvc(env, *args)
        assert done.returncode == 1 and "no database at" in done.stderr and "cachesvc db upgrade" in done.stderr, done
    assert not (tmp_path / "typo").exists() and not (tmp_path / "d").exists()
    made = run_cachesvc(env, "token", "create", "--scope", "read", "--name", "first")  # a command that makes things
    assert made.returncode == 0 and made.stdout.splitlines()[-1].startswith("cs_"), made
    assert run_cachesvc(env, "db", "current").stdout.strip() == f"current: {db.head_revision()}  head: {db.head_revision()}"


def test_an_unexpected_error_is_one_line_unless_the_traceback_is_asked_for(monkeypatch, tmp_path):
    from cachesvc.cli import render

    monkeypatch.setattr(render, "gc_line", lambda r: 1 / 0)
    env = settings_env(CACHESVC_DATA_DIR=str(tmp_path))
    assert cli(env, "db", "upgrade")[0] == 0
    code, _, err = cli(env, "gc")
    assert code == 1 and "unexpected ZeroDivisionError" in err and "--traceback" in err
    with pytest.raises(ZeroDivisionError):
        cli(env, "--traceback", "gc")


def test_help_and_version():
    assert cli({}, "-h")[0] == 0 and "--url" in cli({}, "purge", "-h")[1]
    code, out, _ = cli({}, "--version")
    assert code == 0 and "cachesvc, version" in out


# -------------------------------------------------------------------- the --url mode


def normalized(text: str) -> str:
    """Output with what differs between two runs (ids, tokens, times) blanked."""
    text = re.sub(r"cs_[A-Za-z0-9_-]+", "cs_…", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z", "<time>", text)
    return re.sub(r"token \d+", "token <id>", text)


@SQLITE
@LOCAL
def test_the_url_mode_prints_and_exits_as_the_direct_mode(app, catalog, live_server, tokens):
    direct = settings_env(app)
    remote = settings_env(CACHESVC_URL=live_server.url, CACHESVC_TOKEN=tokens["admin"])
    cases = [("purge", "--name", "bert", "--dry-run"), ("purge", "--keep-latest", "-1"), ("purge",),
             ("purge", "--older-than", "nan"), ("purge", "--name", SURROGATE), ("purge", "--torch-version", ""),
             ("token", "create", "--scope", "read", "--name", ""), ("token", "create", "--scope", "read", "--name", SURROGATE),
             ("token", "revoke", "nobody"), ("token", "list"), ("gc",), ("gc", "--json")]
    for args in cases:
        got = [cli(env, *args) for env in (direct, remote)]
        assert normalized(str(got[0])) == normalized(str(got[1])), (args, got)
    # what changes things, once each way
    for env, name in ((direct, "by-cli"), (remote, "by-url")):
        code, out, err = cli(env, "token", "create", "--scope", "write", "--name", name)
        assert code == 0 and normalized(out) == (f"created token <id> '{name}' with scope write; keep it secret, "
                                                 "it is not stored:\ncs_…\n"), (out, err)
        code, out, _ = cli(env, "token", "revoke", name)
        assert code == 0 and re.fullmatch(rf"revoked token \d+ '{name}' \(write\)\n", out), out
    code, out, _ = cli(remote, "purge", "--keep-latest", "1")
    assert code == 0 and "purged 3 version(s) of 2 entries" in out and "gc: " in out, out
    with app.extensions["cachesvc"].db.session() as s:
        actors = dict(s.execute(select(AuditRecord.target, AuditRecord.actor)
                                .where(AuditRecord.action == "token.create")).all())
        purges = s.scalars(select(AuditRecord).where(AuditRecord.action == "purge")).all()
        assert s.scalar(select(func.count()).select_from(Token).where(Token.revoked_at.isnot(None))) == 2
    assert actors["token by-url"] == "token:test-admin" and actors["token by-cli"].startswith("cli")
    assert [p.actor for p in purges] == ["token:test-admin"] and len(purges[0].details["versions"]) == 3


@SQLITE
@LOCAL
def test_the_url_mode_says_what_is_wrong_with_the_url_or_the_token(app, live_server, tokens):
    refused = settings_env(CACHESVC_URL="http://127.0.0.1:9")  # nothing listens on the discard port
    code, _, err = cli(refused, "gc")
    assert code == 1 and "cannot reach the service at http://127.0.0.1:9" in err
    for url in ("http://[::1", "ftp://host", "http://host:99999"):
        code, _, err = cli(settings_env(), "token", "list", "--url", url)
        assert code == 2, (url, err)
        assert_one_line(err, "--url")
    code, _, err = cli(settings_env(CACHESVC_URL=live_server.url), "token", "list")
    assert code == 1 and "give an admin token with --token or CACHESVC_TOKEN" in err
    code, _, err = cli(settings_env(CACHESVC_URL=live_server.url, CACHESVC_TOKEN=tokens["write"]), "gc")
    assert code == 1 and "need a token with scope admin" in err
    code, _, err = cli(settings_env(CACHESVC_URL=live_server.url, CACHESVC_TOKEN="cs_wrong"), "gc")
    assert code == 1 and "unknown or revoked" in err
    with html_server() as other:  # some other web server at that address
        code, _, err = cli(settings_env(CACHESVC_URL=other, CACHESVC_TOKEN=tokens["admin"]), "gc")
    assert code == 1 and "not cachesvc's JSON" in err and "<html>" not in err
    assert_one_line(err)


def html_server():
    """A web server on loopback that answers everything with an HTML 404 page."""
    return foreign_web_server(b"<html><body>Not Found</body></html>")
