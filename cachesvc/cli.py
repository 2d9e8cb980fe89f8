"""`cachesvc` command: serve, db upgrade/current, token create/revoke/list, purge, gc."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import click

from . import config


@click.group()
def main():
    """cachesvc: compilation-cache service for PyTorch."""


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8787, show_default=True, type=int)
@click.option("--workers", default=2, show_default=True, type=int, help="gunicorn worker processes")
@click.option("--threads", default=8, show_default=True, type=int, help="threads per worker")
def serve(host, port, workers, threads):
    """Run the service under gunicorn (embedded default: SQLite + blob dir in CACHESVC_DATA_DIR)."""
    from gunicorn.app.base import BaseApplication

    from . import db
    from .app import create_app

    settings = config.load()
    if settings["AUTO_MIGRATE"]:
        db.upgrade(settings["DATABASE_URL"])
    _metrics_dir(settings)
    app = create_app()
    # create_app checked the schema over a pooled connection: forked workers must not inherit it
    # (two processes on one socket corrupt each other's replies: 8 concurrent publishes got 500s).
    app.extensions["cachesvc"].db.engine.dispose()

    def child_exit(_server, worker):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)

    class _Server(BaseApplication):
        def load_config(self):
            self.cfg.set("bind", f"{host}:{port}")
            self.cfg.set("workers", workers)
            self.cfg.set("threads", threads)
            self.cfg.set("timeout", 300)
            self.cfg.set("accesslog", "-")
            self.cfg.set("child_exit", child_exit)
            self.cfg.set("post_fork", lambda _server, _worker: app.extensions["cachesvc_scheduler"].ensure_started())

        def load(self):
            return app

    click.echo(f"cachesvc on http://{host}:{port}  database={_safe(settings['DATABASE_URL'])}  "
               f"storage={settings['STORAGE_URL']}", err=True)
    _Server().run()


def _metrics_dir(settings: dict) -> None:
    """Workers write their metrics to files in one fresh folder that /metrics sums (prometheus_client's
    multiprocess mode); must happen before prometheus_client is imported."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    path = Path(settings["DATA_DIR"]) / "prometheus" / str(os.getpid())
    shutil.rmtree(path.parent, ignore_errors=True)  # files of earlier runs would add up with ours
    path.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)


def _open(migrate: bool = True):
    """(settings, Database, Storage) for the admin commands; migrates first where AUTO_MIGRATE says so."""
    from . import db as db_mod
    from .storage import from_url

    settings = config.load()
    if migrate and settings["AUTO_MIGRATE"]:
        db_mod.upgrade(settings["DATABASE_URL"])
    database = db_mod.Database(settings["DATABASE_URL"])
    database.check_schema()
    return settings, database, from_url(settings["STORAGE_URL"], settings)


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@main.group("db")
def db_group():
    """Database schema commands."""


@db_group.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision):
    """Apply migrations up to REVISION."""
    from . import db

    url = config.load()["DATABASE_URL"]
    db.upgrade(url, revision)
    click.echo(f"database {_safe(url)} is at {revision}")


@db_group.command("current")
def db_current():
    """Show the database's revision and the code's head."""
    from .db import make_engine, schema_status

    current, head = schema_status(make_engine(config.load()["DATABASE_URL"]))
    click.echo(f"current: {current or 'none'}  head: {head}")


# -- tokens ----------------------------------------------------------------------------

@main.group("token")
def token_group():
    """Bearer tokens: scopes nest, admin > write > read."""


@token_group.command("create")
@click.option("--scope", type=click.Choice(["read", "write", "admin"]), required=True)
@click.option("--name", required=True, help="Who or what uses it, e.g. ci-builder.")
def token_create(scope, name):
    """Create a token and print it, alone, on the last line (it is shown only this once)."""
    from . import audit, auth

    _settings, database, _storage = _open()
    with database.session() as s:
        row, token = auth.create_token(s, name, scope)
        audit.record(s, "token.create", audit.cli_actor(), f"token {row.name}", 0, {"id": row.id, "scope": scope})
        ident = row.id
    database.engine.dispose()
    click.echo(f"created token {ident} {name!r} with scope {scope}; keep it secret, it is not stored:")
    click.echo(token)


@token_group.command("revoke")
@click.argument("ident")
def token_revoke(ident):
    """Revoke the active token(s) with id or name IDENT."""
    from . import audit, auth
    from .errors import CacheError

    _settings, database, _storage = _open()
    try:
        with database.session() as s:
            rows = auth.revoke_token(s, ident)
            for row in rows:
                audit.record(s, "token.revoke", audit.cli_actor(), f"token {row.name}", 0,
                             {"id": row.id, "scope": row.scope})
            done = [(r.id, r.name, r.scope) for r in rows]
    except CacheError as exc:
        raise click.ClickException(exc.message) from None
    finally:
        database.engine.dispose()
    for ident_, name, scope in done:
        click.echo(f"revoked token {ident_} {name!r} ({scope})")


@token_group.command("list")
def token_list():
    """Every token: id, name, scope, created, revoked (never the token)."""
    from sqlalchemy import select

    from . import auth
    from .models import Token

    _settings, database, _storage = _open()
    with database.session() as s:
        rows = [auth.token_summary(t) for t in s.scalars(select(Token).order_by(Token.id))]
    database.engine.dispose()
    for r in rows:
        click.echo(f"{r['id']:>4}  {r['name']:<24} {r['scope']:<6} created {r['created_at']}"
                   + (f"  revoked {r['revoked_at']}" if r["revoked_at"] else ""))


# -- purge and gc ----------------------------------------------------------------------

def _gc(settings, database, storage) -> dict:
    from . import audit, collect

    result = collect.gc(database, storage, settings)
    with database.session() as s:
        audit.record(s, "gc", audit.cli_actor(), "blobs", result["bytes_freed"], result)
    return result


@main.command()
@click.option("--not-restored-for", type=float, help="Days since last restored (never restored: since created).")
@click.option("--older-than", type=float, help="Days since created (fractions allowed).")
@click.option("--keep-latest", type=int, help="Keep this many newest versions of every key.")
@click.option("--torch-version", help="Only versions published with this torch.")
@click.option("--name", help="Only entries with this name.")
@click.option("--device", help="Only entries for this device.")
@click.option("--max-total-bytes", type=int, help="Evict least recently restored versions until the store fits.")
@click.option("--dry-run", is_flag=True, help="Report what would go; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def purge(as_json, dry_run, **criteria):
    """Purge versions matching every given criterion, then collect garbage (same as POST /api/v1/admin/purge)."""
    from . import audit, collect
    from .errors import CacheError

    settings, database, storage = _open(migrate=False)
    try:
        with database.session() as s:
            result = collect.purge(s, criteria, dry_run=dry_run)
            if not dry_run:
                audit.record(s, "purge", audit.cli_actor(),
                             ", ".join(f"{k}={v}" for k, v in result["criteria"].items()), result["bytes_freed"],
                             {"criteria": result["criteria"], "versions": [v["id"] for v in result["versions"]],
                              "entries": [e["name"] for e in result["entries"]]})
        result["gc"] = None if dry_run else _gc(settings, database, storage)
    except CacheError as exc:
        raise click.ClickException(exc.message) from None
    finally:
        database.engine.dispose()
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    verb = "would purge" if dry_run else "purged"
    for e in result["entries"]:
        click.echo(f"{verb} {e['name']} {e['shape']} ({e['env']['torch']}, {e['env']['device']}): "
                   f"versions {', '.join(map(str, e['versions']))}")
    click.echo(f"{verb} {result['version_count']} version(s) of {len(result['entries'])} entr"
               f"{'y' if len(result['entries']) == 1 else 'ies'}; {result['bytes_freed']} bytes freed "
               f"{'once' if dry_run else 'when'} the GC grace has passed")
    if result["gc"]:
        click.echo(_gc_line(result["gc"]))


def _gc_line(r: dict) -> str:
    return (f"gc: {r['blobs_deleted']} blobs and {r.get('packs_deleted', 0)} packs ({r['bytes_freed']} bytes) "
            f"deleted, {r['orphans_deleted'] + r.get('orphan_packs_deleted', 0)} orphan objects, {r['versions_deleted']} dead versions, {r['entries_deleted']} empty entries")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def gc(as_json):
    """Delete blobs no live version, publish in flight or recent purge needs (see cachesvc.collect)."""
    settings, database, storage = _open(migrate=False)
    try:
        result = _gc(settings, database, storage)
    finally:
        database.engine.dispose()
    click.echo(json.dumps(result, indent=2) if as_json else _gc_line(result))


if __name__ == "__main__":
    main()
