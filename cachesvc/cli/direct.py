"""The admin commands on the database and storage directly (no ``--url``): needs `cachesvc[server]`.

The parts come from ``app.build_services``, the wiring ``create_app`` uses; arguments go
through the admin API's request schemas and the work through ``cachesvc.lifecycle.actions``, so a
command and ``POST /api/v1/admin/...`` validate, act and audit alike. Failures of the
database, the storage or the settings become one line that says what to check.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from .failures import Failure, needs_server, refusal
from ..config import Settings


def safe_url(url: str) -> str:
    """A database URL with its password hidden."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@contextlib.contextmanager
def translated(settings: Settings) -> Iterator[None]:
    """Failures of the database, storage and settings as one line (exit 1), refusals as the API words them."""
    from marshmallow import ValidationError
    from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError

    from ..errors import CacheError
    from ..storage import StorageError

    try:
        yield
    except ValidationError as exc:
        raise refusal("invalid_request", "invalid request", exc.messages) from None
    except CacheError as exc:
        raise refusal(exc.code, exc.message, exc.details) from None
    except ArgumentError as exc:  # an unparsable URL, an unknown dialect
        raise Failure(f"CACHESVC_DATABASE_URL: {exc}") from None
    except (OperationalError, InterfaceError, DBAPIError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise Failure(f"cannot use the database {safe_url(settings.DATABASE_URL)}: {reason}; check "
                      f"CACHESVC_DATABASE_URL and that the database server runs and lets this user in") from None
    except StorageError as exc:
        raise Failure(f"blob storage {settings.STORAGE_URL} failed: {exc}; check CACHESVC_STORAGE_URL "
                      f"(and the CACHESVC_S3_* settings)") from None


class DirectAdmin:
    """The admin actions on the database named by the settings; ``close()`` when done."""

    def __init__(self, settings: Settings, *, create: bool = False):
        """Opens the database: migrates first where AUTO_MIGRATE says so; a missing SQLite file is
        made only with ``create`` (a command that makes things), otherwise refused."""
        with needs_server(admin=True), translated(settings):
            from .. import db
            from ..app import build_services

            if settings.AUTO_MIGRATE and (create or db.exists(settings.DATABASE_URL)):
                db.upgrade(settings.DATABASE_URL)
            try:
                self.svc = build_services(settings)
            except ValueError as exc:  # from_url: a storage URL of an unknown scheme
                raise Failure(f"CACHESVC_STORAGE_URL: {exc}") from None
            except db.DatabaseNotReady as exc:
                raise Failure(str(exc)) from None
        self.settings = settings

    @staticmethod
    def _actor() -> str:
        from .. import lifecycle

        return lifecycle.cli_actor()

    def purge(self, criteria: dict, dry_run: bool) -> dict:
        from .. import lifecycle
        from ..schemas import PurgeSchema

        with translated(self.settings):
            body = PurgeSchema().load({**{k: v for k, v in criteria.items() if v is not None}, "dry_run": dry_run})
            dry_run = body.pop("dry_run")
            return lifecycle.purge(self.svc, body, actor=self._actor(), dry_run=dry_run)

    def gc(self) -> dict:
        from .. import lifecycle

        with translated(self.settings):
            return lifecycle.gc(self.svc, actor=self._actor())

    def create_token(self, name: str, scope: str) -> dict:
        from .. import lifecycle
        from ..schemas import TokenCreateSchema

        with translated(self.settings):
            body = TokenCreateSchema().load({"name": name, "scope": scope})
            return lifecycle.create_token(self.svc, body["name"], body["scope"], actor=self._actor())

    def list_tokens(self) -> list:
        from .. import lifecycle

        with translated(self.settings):
            return lifecycle.list_tokens(self.svc)["tokens"]

    def revoke_token(self, ident: str) -> list:
        from .. import lifecycle

        with translated(self.settings):
            return lifecycle.revoke_token(self.svc, ident, actor=self._actor())["revoked"]

    def close(self) -> None:
        self.svc.db.engine.dispose()
