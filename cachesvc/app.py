"""The app factory: settings, database, storage, blueprints, error handlers."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from flask import Flask
from flask_smorest import Api

from . import __version__, auth, config, errors
from .db import Database
from .demand import ReportLimiter
from .resolve import HitLog
from .schemas import ErrorSchema
from .storage import Storage, StorageError, from_url
from .storage.decoding import BadBlob
from .ttlcache import TTLCache

log = logging.getLogger(__name__)


def _unavailable(exc: Exception) -> errors.CacheError:
    # Views that stat or read blobs (commit, GC, purge) let the backend's failure rise to here.
    log.warning("blob storage unavailable: %s", exc)
    return errors.Unavailable(f"blob storage is unavailable ({exc}); retry shortly")


#: storage's own errors as the API's (errors.py imports nothing above it, so they are named here): bytes that
#: are not what the manifest says are the uploader's mistake, nothing stored (400); a failing backend a 503
STORAGE_ERRORS = {BadBlob: lambda exc: errors.InvalidRequest(str(exc), exc.details), StorageError: _unavailable}


@dataclass
class Services:
    db: Database
    storage: Storage
    settings: config.Settings
    version: str = __version__
    hits: Optional[HitLog] = None  # restore counters, written every HIT_FLUSH_SECONDS
    tokens: TTLCache = field(default_factory=lambda: TTLCache(0))  # sha256(Authorization) -> Principal
    usage_limiter: ReportLimiter = field(default_factory=ReportLimiter)  # usage reports per sender, this process


def build_services(settings: config.Settings) -> Services:
    """The service's parts from ``settings``: what create_app wires into the app, and what the
    `cachesvc` admin commands use when they work on the database directly.

    Raises DatabaseNotReady (a SystemExit naming the command to run) when the database is missing
    or its schema is behind; ValueError for a storage URL of an unknown scheme.
    """
    db = Database(settings.DATABASE_URL)
    try:
        db.check_schema()
        storage = from_url(settings.STORAGE_URL, config.s3_options(settings))
    except BaseException:
        db.engine.dispose()
        raise
    return Services(db=db, storage=storage, settings=settings, hits=HitLog(db, settings.HIT_FLUSH_SECONDS),
                    tokens=TTLCache(settings.TOKEN_CACHE_SECONDS))


class _Api(Api):
    """flask-smorest's Api, its OpenAPI document written when first read (``spec``) rather than at each blueprint's
    registration. Describing the views (resolving every schema) was two thirds of building an app, 40 of its 60 ms
    on the suite's VM: every gunicorn worker, CLI command and test app paid it, though only the document's page and
    /openapi.json read it. The routes are registered at once; the same calls then write the same document, in the
    same order, under a lock (a worker's first requests may read it together)."""

    ERROR_SCHEMA = ErrorSchema  # the documented error shape is the one errors.py answers

    def __init__(self, app: Flask):
        self._undocumented: list = []  # (blueprint, name, parameters), in registration order
        self._documenting = threading.Lock()
        super().__init__(app)

    @property
    def spec(self):
        spec = self.__dict__.get("_spec")
        if self._undocumented:
            with self._documenting:
                while self._undocumented:
                    blp, name, parameters = self._undocumented[0]
                    blp.register_views_in_doc(self, self._app, spec, name=name, parameters=parameters)
                    spec.tag({"name": name, "description": blp.description})
                    self._undocumented.pop(0)
        return spec

    @spec.setter
    def spec(self, value) -> None:  # flask-smorest's __init__ and init_app set it
        self.__dict__["_spec"] = value

    def register_blueprint(self, blp, *, parameters=None, **options) -> None:
        """As flask-smorest's, its views described in the document when ``spec`` is next read."""
        name = options.get("name", blp.name)
        self._app.extensions["flask-smorest"]["blp_name_to_api"][name] = self
        self._app.register_blueprint(blp, **options)
        self._undocumented.append((blp, name, parameters))


def _install_api(app: Flask) -> None:
    """The request hooks (metrics, UTF-8 query strings, auth, JSON bodies) and the API's blueprints."""
    from .api import (admin, blobs, demand, entries, health, metrics as metrics_api, packs as packs_api, resolve,
                      stats, usage, verdicts, versions)
    from .api import remote_cache as remote_cache_api
    from .api import add_security_headers, check_body_size, require_json_body, require_utf8_query
    from .metrics import Metrics

    metrics = Metrics()
    app.extensions["cachesvc_metrics"] = metrics
    metrics.install(app)
    app.after_request(add_security_headers)
    app.before_request(check_body_size)  # before anything (CSRF, a form, JSON) reads the body
    app.before_request(auth.check_request)  # before anything checks the request: 401/403 before any 400
    app.before_request(require_utf8_query)  # before anything reads request.args
    app.before_request(require_json_body)

    api = _Api(app)
    for module in (versions, blobs, packs_api, resolve, verdicts, usage, demand, entries, stats, admin, health,
                   metrics_api, remote_cache_api):
        api.register_blueprint(module.blp)


def create_app(overrides: Optional[Mapping[str, Any]] = None) -> Flask:
    """Build the WSGI app. ``overrides`` win over ``CACHESVC_*`` environment variables.

    Raises SystemExit with the command to run when the database schema is behind.
    """
    from .api import docs

    settings = config.load(overrides)
    config.check_production(settings)  # before anything serves: a fleet never runs on a per-process key
    app = Flask(__name__)
    app.config.update(
        TESTING=settings.TESTING,
        MAX_CONTENT_LENGTH=settings.BODY_LIMIT_BYTES,  # each route's own: api.check_body_size
        API_TITLE="cachesvc",
        API_VERSION="v1",
        OPENAPI_VERSION="3.0.3",
        OPENAPI_URL_PREFIX="/api/v1",
        OPENAPI_JSON_PATH="openapi.json",
        OPENAPI_SWAGGER_UI_PATH="docs",  # the browsable API: /api/v1/docs
        OPENAPI_SWAGGER_UI_URL=docs.ASSETS_URL,  # its JS and CSS from the service (swagger-ui-bundle), no CDN
        API_SPEC_OPTIONS={
            "info": {"description": "Compilation-cache service for PyTorch: publish and restore torch.compile "
                                    "state. Send `Authorization: Bearer <token>`; scopes nest: admin > write > "
                                    "read. Anonymous requests may read when CACHESVC_ANONYMOUS_READ is on."},
            "components": {"securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
        },
    )
    app.extensions["cachesvc"] = build_services(settings)

    _install_api(app)
    from . import browse

    browse.register_pages(app, settings)
    app.register_blueprint(docs.bp)
    from .lifecycle import Scheduler

    sched = app.extensions["cachesvc_scheduler"] = Scheduler(app.extensions["cachesvc"])
    app.before_request(sched.ensure_started)  # in the serving process, never before a fork
    errors.register(app, STORAGE_ERRORS)  # after Api(): our JSON error shape replaces flask-smorest's
    if not app.debug and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return app
