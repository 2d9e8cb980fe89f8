"""The browsable API: Swagger UI at /api/v1/docs (flask-smorest's page), its JS and CSS from here.

The assets come from the ``swagger-ui-bundle`` package (Swagger UI's own release files), served by
the service itself: the page works where the browser reaches the service but no CDN (a cluster with
no way out), and what it runs is the version pinned with the service, not whatever a CDN serves.
"""
from __future__ import annotations

from pathlib import Path

import flask
from swagger_ui_bundle import swagger_ui_path

from ..auth import requires

#: OPENAPI_SWAGGER_UI_URL: where flask-smorest's page loads swagger-ui-bundle.js and swagger-ui.css from
ASSETS_URL = "/api/v1/docs/assets/"

bp = flask.Blueprint("api_docs_assets", __name__)
_STATIC = Path(__file__).resolve().parent / "static"


@bp.route("/api/v1/docs/init.js")
@requires(None)
def init_script():
    """What starts Swagger UI on its page (cachesvc/templates/swagger_ui.html, which replaces flask-smorest's
    page so that no script is inline)."""
    return flask.send_from_directory(_STATIC, "swagger-init.js", max_age=3600)


@bp.route(ASSETS_URL + "<path:filename>")
@requires(None)
def asset(filename: str):
    """A Swagger UI file (send_from_directory refuses paths outside the package's folder: 404)."""
    return flask.send_from_directory(swagger_ui_path, filename, max_age=86400)
