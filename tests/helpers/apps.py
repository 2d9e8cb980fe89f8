"""The service as the tests run it outside the ``app`` fixture's own wiring (tests/conftest.py uses these too):
a database migrated, one token per scope, an app served over real HTTP.
"""
from __future__ import annotations

import threading
from typing import Dict

from cachesvc import db as cachesvc_db


def migrated(url: str) -> str:
    """``url``'s database, brought to the newest schema."""
    cachesvc_db.upgrade(url)  # the schema comes from the Alembic migrations only
    return url


def make_tokens(app) -> Dict[str, str]:
    """One token per scope in ``app``'s database."""
    from cachesvc import auth

    with app.extensions["cachesvc"].db.session() as s:
        return {scope: auth.create_token(s, f"test-{scope}", scope)[1] for scope in auth.SCOPES}


class LiveServer:
    """A WSGI app served over real HTTP from a background thread."""

    def __init__(self, app):
        from werkzeug.serving import make_server

        self.app = app
        self._server = make_server("127.0.0.1", 0, app, threaded=True)
        self.port = self._server.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"live-server-{self.port}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()  # returns once serve_forever has left its loop
        self._thread.join(timeout=10)
        self._server.server_close()
