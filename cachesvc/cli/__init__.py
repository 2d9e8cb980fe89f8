"""`cachesvc`: serve, db upgrade/current, token create/list/revoke, purge, gc.

The admin commands (token, purge, gc) work in one of two modes, with the same output and
exit codes: on the database and storage the ``CACHESVC_*`` settings name (``direct``; needs
`cachesvc[server]`), or with ``--url`` / ``CACHESVC_URL`` over a running service's admin API
with an admin token (``remote``; requests only). Either way the admin API's validation
decides (the request schemas), and errors name the flags.

Exit codes: 0 done; 1 a failure outside the command line (unreachable, refused, not found),
told in one line that says what to check; 2 a usage error (a flag's value refused), told
in one line that names the flag. Never a traceback (``--traceback`` shows one for an
unexpected error).
"""
from __future__ import annotations

import json
import socket
import sys
from typing import Optional

import click

from cachesvc_client.shared import units  # a shared rule: sizes read as the client's flags read them

from .. import __version__, config
from . import render
from .failures import BadUsage, needs_server

ADMIN_HELP = "Admin commands use the database directly, or a running service's admin API with --url."


class Size(click.ParamType):
    """A byte size: ``500G``, ``1.5TB``, ``10GiB``, ``2048`` (``cachesvc_client.shared.units.parse_size``). The
    service imports of the client only its shared stdlib rules (``tests/test_layers.py``), not the client's
    command-line module, so the flag type over the shared rule is its own."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return units.parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _Main(click.Group):
    """Runs a command and ends every failure in one line on stderr (see the module docstring)."""

    def main(self, args=None, prog_name=None, **extra):
        extra.pop("standalone_mode", None)
        argv = sys.argv[1:] if args is None else list(args)
        try:
            rv = super().main(argv, "cachesvc", standalone_mode=False, **extra)
        except click.UsageError as exc:
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            _die(f"{exc.format_message()}{hint}", exc.exit_code)
        except click.ClickException as exc:
            _die(exc.format_message(), exc.exit_code)
        except click.Abort:
            _die("aborted", 1)
        except SystemExit as exc:  # settings that do not parse, a database not ready: their message says it
            if isinstance(exc.code, str):
                _die(exc.code, 1)
            raise
        except Exception as exc:  # noqa: BLE001 - a bug: one line, unless asked for the traceback
            if "--traceback" in argv:
                raise
            _die(f"unexpected {type(exc).__name__}: {exc} (a bug: run again with `cachesvc --traceback ...` "
                 f"and report what it prints)", 1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _die(message: str, code: int) -> None:
    click.echo(f"cachesvc: {message}", err=True)
    sys.exit(code)


class FiniteFloat(click.ParamType):
    """A finite number (``nan`` and ``1e400`` are not a number of days, and JSON cannot carry them)."""

    name = "number"

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if number != number or number in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def admin_options(fn):
    """``--url`` and ``--token``: the remote mode of an admin command."""
    fn = click.option("--token", envvar="CACHESVC_TOKEN", metavar="TOKEN",
                      help="Admin token for --url (env CACHESVC_TOKEN).")(fn)
    return click.option("--url", envvar="CACHESVC_URL", metavar="URL",
                        help="Use this service's admin API instead of the database (env CACHESVC_URL).")(fn)


def _admin(url: Optional[str], token: Optional[str], *, create: bool = False):
    """The remote admin (``url``) or the direct one (the database and storage of the settings)."""
    if url:
        from .remote import HttpAdmin

        return HttpAdmin(url, token)
    from .direct import DirectAdmin

    return DirectAdmin(config.load(), create=create)


def _echo(lines) -> None:
    for line in lines:
        click.echo(line)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]}, epilog=ADMIN_HELP)
@click.version_option(__version__, "-V", "--version", prog_name="cachesvc")
@click.option("--traceback", is_flag=True, help="Show the traceback of an unexpected error.")
def main(traceback):
    """cachesvc: compilation-cache service for PyTorch."""


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8787, show_default=True, type=click.IntRange(1, 65535))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 512),
              help="gunicorn worker processes")
@click.option("--threads", default=8, show_default=True, type=click.IntRange(1, 1024), help="threads per worker")
def serve(host, port, workers, threads):
    """Run the service under gunicorn (embedded default: SQLite + blob dir in CACHESVC_DATA_DIR)."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise BadUsage(f"--host: cannot listen on {host!r}: {exc}") from None
    settings = config.load()
    with needs_server(admin=False):
        from .direct import translated
        from .serve import serve as run

        with translated(settings):
            run(settings, host=host, port=port, workers=workers, threads=threads)


@main.group("db")
def db_group():
    """Database schema commands."""


@db_group.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="A revision id, head, or +N.")
def db_upgrade(revision):
    """Apply migrations up to REVISION (makes an SQLite database and its folder when there is none)."""
    settings = config.load()
    with needs_server(admin=False):
        from .. import db
        from .direct import safe_url, translated

        with translated(settings):
            try:
                db.upgrade(settings.DATABASE_URL, revision)
            except db.UnknownRevision as exc:
                raise BadUsage(f"--revision: {exc}") from None
            current, head = _revisions(db, settings.DATABASE_URL)
    click.echo(f"database {safe_url(settings.DATABASE_URL)} is at revision {current} (head: {head})")


def _revisions(db, url: str) -> tuple:
    engine = db.make_engine(url)
    try:
        return db.schema_status(engine)
    finally:
        engine.dispose()


@db_group.command("current")
def db_current():
    """Show the database's revision and the code's head (creates nothing)."""
    settings = config.load()
    with needs_server(admin=False):
        from .. import db
        from .direct import translated

        url = settings.DATABASE_URL
        with translated(settings):
            if not db.exists(url):
                click.echo(f"current: none (no database at {db.sqlite_path(url).resolve()})  head: {db.head_revision()}")
                return
            current, head = _revisions(db, url)
    click.echo(f"current: {current or 'none'}  head: {head}")


# -- tokens ----------------------------------------------------------------------------

@main.group("token", epilog=ADMIN_HELP)
def token_group():
    """Bearer tokens: scopes nest, admin > write > read."""


@token_group.command("create")
@click.option("--scope", type=click.Choice(["read", "write", "admin"]), required=True)
@click.option("--name", required=True, help="Who or what uses it, e.g. ci-builder.")
@admin_options
def token_create(scope, name, url, token):
    """Create a token and print it, alone, on the last line (it is shown only this once)."""
    admin = _admin(url, token, create=True)
    try:
        _echo(render.token_created(admin.create_token(name, scope)))
    finally:
        admin.close()


@token_group.command("revoke")
@click.argument("ident")
@admin_options
def token_revoke(ident, url, token):
    """Revoke the active token(s) with id or name IDENT."""
    admin = _admin(url, token)
    try:
        _echo(render.revoked(admin.revoke_token(ident)))
    finally:
        admin.close()


@token_group.command("list")
@admin_options
def token_list(url, token):
    """Every token: id, name, scope, created, revoked (never the token)."""
    admin = _admin(url, token)
    try:
        _echo(render.token_rows(admin.list_tokens()))
    finally:
        admin.close()


# -- purge and gc ----------------------------------------------------------------------

@main.command(epilog=ADMIN_HELP)
@click.option("--not-restored-for", type=FiniteFloat(), help="Days since last restored (never restored: since created).")
@click.option("--older-than", type=FiniteFloat(), help="Days since created (fractions allowed).")
@click.option("--keep-latest", type=int, help="Keep this many newest versions of every key and kind.")
@click.option("--torch-version", help="Only versions published with this torch.")
@click.option("--name", help="Only entries with this name.")
@click.option("--device", help="Only entries for this device.")
@click.option("--max-total-bytes", type=Size(),
              help="Evict least recently restored versions until the store fits: 500G, 1.5T, 500000000000.")
@click.option("--dry-run", is_flag=True, help="Report what would go; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@admin_options
def purge(as_json, dry_run, url, token, **criteria):
    """Purge versions matching every given criterion, then collect garbage (POST /api/v1/admin/purge)."""
    admin = _admin(url, token)
    try:
        result = admin.purge(criteria, dry_run)
    finally:
        admin.close()
    _echo([json.dumps(result, indent=2, sort_keys=True)] if as_json else render.purge_lines(result))


@main.command(epilog=ADMIN_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@admin_options
def gc(as_json, url, token):
    """Delete blobs no live version, publish in flight or recent purge needs (see cachesvc.lifecycle.collect)."""
    admin = _admin(url, token)
    try:
        result = admin.gc()
    finally:
        admin.close()
    click.echo(json.dumps(result, indent=2, sort_keys=True) if as_json else render.gc_line(result))
