"""`cachesvc` command: serve, db upgrade, db current."""
from __future__ import annotations

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
    app = create_app()

    class _Server(BaseApplication):
        def load_config(self):
            self.cfg.set("bind", f"{host}:{port}")
            self.cfg.set("workers", workers)
            self.cfg.set("threads", threads)
            self.cfg.set("timeout", 300)
            self.cfg.set("accesslog", "-")

        def load(self):
            return app

    click.echo(f"cachesvc on http://{host}:{port}  database={_safe(settings['DATABASE_URL'])}  "
               f"storage={settings['STORAGE_URL']}", err=True)
    _Server().run()


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


if __name__ == "__main__":
    main()
