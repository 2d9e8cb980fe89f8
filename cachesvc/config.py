"""Settings, in layers: defaults, then environment variables, then overrides.

Every setting has an environment variable ``CACHESVC_<NAME>``. The table in
docs/settings.md is generated from ``SETTINGS`` (``scripts/settings_doc.py``; a
test fails when the page is stale), so the help texts here are the documentation.

``load`` returns one frozen ``Settings`` (an attribute per setting, typed from its parser). It
refuses what names no setting: an override key, or a ``CACHESVC_*`` variable that is neither a
setting nor one that another part reads (``ELSEWHERE``), naming the nearest valid one, so a typo
is an error at start, never a default silently kept. ``Settings.replace`` makes a changed copy.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

#: name -> (default, parser, help). Defaults that depend on other settings are None; ``SHOWN_DEFAULTS``
#: says them for the docs.
SETTINGS: Dict[str, tuple] = {
    "DATA_DIR": ("./cachesvc-data", str, "Folder for the embedded defaults (SQLite file and blob dir)."),
    "DATABASE_URL": (None, str, "SQLAlchemy URL. PostgreSQL: `postgresql+psycopg://user:pw@host/db`."),
    "STORAGE_URL": (None, str, "Blob storage: `file:///path` or `s3://bucket/prefix`."),
    "S3_ENDPOINT_URL": ("", str, "S3 endpoint for MinIO or any S3-compatible store; empty for AWS."),
    "S3_REGION": ("us-east-1", str, "S3 region used for signing."),
    "S3_ACCESS_KEY_ID": ("", str, "S3 access key; empty uses boto3's default credential chain."),
    "S3_SECRET_ACCESS_KEY": ("", str, "S3 secret key."),
    "S3_PRESIGN": (True, "bool", "Hand clients presigned S3 URLs so bytes bypass the service."),
    "S3_PUBLIC_ENDPOINT_URL": ("", str, "Endpoint written into presigned URLs when clients reach S3 by another address."),
    "PRESIGN_EXPIRES": (3600, int, "Seconds a presigned URL stays valid."),
    "UPLOAD_LEASE_SECONDS": (3600, int, "Seconds a pending (uncommitted) version may wait for its blobs."),
    "MAX_FILES": (100_000, int, "Most files one version may hold."),
    "MAX_REQUEST_BYTES": (64 * 1024**2, "size", "Largest publish or commit body (a version's manifest: up to MAX_FILES files)."),
    "BODY_LIMIT_BYTES": (64 * 1024, "size", "Largest body of every other request that has no limit of its own: pages and their forms (sign-in, purge, tokens), admin JSON. Checked before anything reads the body; blob, pack and remote-cache uploads and the JSON routes sized to their schema (verdicts, upload targets) have their own."),
    "MAX_BLOB_BYTES": (16 * 1024**3, "size", "Largest blob upload through the service (local backend)."),
    "AUTO_MIGRATE": (None, "bool", "Run migrations at `cachesvc serve` and before the admin commands that use the database directly (`token`, `purge`, `gc` without `--url`)."),
    "ANONYMOUS_READ": (None, "bool", "Let requests without a token read (browse, resolve, download, stats). Writing always needs a token."),
    "SECRET_KEY": (None, str, "Key that signs the pages' session cookies and their forms' CSRF tokens. Every replica must have the same one (put it in a Secret), and it must stay secret (with it, and the tokens table, one can forge a sign-in). Unset: a random key per `cachesvc serve` (its workers share it), so sign-ins end when the service restarts and hold on one replica only."),
    "SESSION_HOURS": (12.0, float, "Hours a sign-in on the pages lasts. A revoked token signs its sessions out at their next request whatever this says."),
    "COOKIE_SECURE": (False, "bool", "Send the session cookie over https only, always. Off: the cookie is Secure when the request came over https; behind a proxy that ends TLS (an ingress), turn this on."),
    "SERVE_PROXY": (False, "bool", "`cachesvc serve` puts nginx in front of gunicorn (on a Unix socket): nginx reads every request's headers and body (10 s and 30 s timeouts, bodies buffered and bounded per route) before a gunicorn thread sees it, so slow clients cannot hold the workers. On in the image; needs nginx installed."),
    "PRODUCTION": (False, "bool", "A service for a fleet (the Kubernetes overlays set it): refuse to start without a `SECRET_KEY` of 32+ characters that is not a placeholder (every replica must sign sign-ins alike), or with `COOKIE_SECURE` off. Off (the embedded dev server's default): a missing key is a random one, with a warning."),
    "METRICS_PUBLIC": (True, "bool", "Serve /metrics without a token; off: /metrics needs a token with read scope."),
    "HIT_FLUSH_SECONDS": (2.0, float, "Seconds between writes of the restore counters (restore_count, last_restored_at, hit events) that resolves tally in memory; 0 writes each hit in its request."),
    "TOKEN_CACHE_SECONDS": (5.0, float, "Seconds a serving process reuses a token lookup; a revoked token stops working within this; 0 looks it up on every request."),
    "GC_GRACE_SECONDS": (None, float, "Seconds a purged version's blobs stay after the purge, so restores that already resolved it finish."),
    "FALLBACK_MAX_BYTES": (2 * 1024**3, "size", "Most bytes a `shapes` fallback restore brings (the union of the most restored shapes of a key)."),
    "LRU_BUDGET_BYTES": (0, "size", "Stored bytes the scheduled eviction keeps: least recently restored versions are purged beyond it, then GC runs; 0: off."),
    "GC_INTERVAL_SECONDS": (0, float, "Seconds between scheduled runs of that eviction (LRU_BUDGET_BYTES) and GC inside the service; 0: no scheduled runs."),
    "REMOTE_CACHE_MAX_BYTES": (64 * 1024**2, "size", "Largest value Inductor's live remote cache may store (PUT /api/v1/remote-cache); larger ones get 413 and stay in the process's local cache."),
    "EVENTS_RETENTION_DAYS": (90.0, float, "Days the events table (one row a resolve, a verdict, a publish) keeps a row; the scheduled rounds (GC_INTERVAL_SECONDS) delete older ones. The stats keep their totals (event_rollups); the pages' per-entry hit rates cover this window. 0 keeps them for ever."),
    "AUDIT_RETENTION_DAYS": (365.0, float, "Days the audit log keeps a record; the scheduled rounds delete older ones. 0 keeps them for ever."),
    "REMOTE_CACHE_MAX_IDLE_DAYS": (30.0, float, "GC evicts remote-cache items not read or written for this many days; 0 never evicts."),
    "DEMAND_MAX_SHAPES": (256, int, "Most input shapes the fleet's demand (`POST /api/v1/usage`) keeps on record per key family (a model's name, tags and environment). A new shape past it is dropped, and the answer says so; the shapes on record keep counting. Nothing is ever evicted, so one reporter's shapes never push out another's. 0 keeps none."),
    "DEMAND_MAX_FAMILIES": (256, int, "Most key families (tags and environments) of one model name the fleet's demand keeps on record; a report for a new family past it is dropped, the families on record keep counting. 0 keeps none."),
    "USAGE_REPORTS_PER_MINUTE": (120, int, "Usage reports (`POST /api/v1/usage` requests) one token, or one client address without a token, may send a minute (bursts up to it, refilled over the minute); past it a report gets 429 with `Retry-After` and changes nothing. Each serving process (each gunicorn worker, each replica) counts on its own. 0: no limit."),
}

#: how the docs show the defaults that are None in SETTINGS (worked out in ``load``)
SHOWN_DEFAULTS: Dict[str, str] = {
    "DATABASE_URL": "`sqlite:///<DATA_DIR>/cachesvc.db`",
    "STORAGE_URL": "`file://<DATA_DIR>/blobs`",
    "AUTO_MIGRATE": "on for SQLite, off otherwise",
    "ANONYMOUS_READ": "on for SQLite, off otherwise",
    "GC_GRACE_SECONDS": "`PRESIGN_EXPIRES` + 3600",
    "SECRET_KEY": "random, per process",
}


def _parse(kind: Any, raw: str) -> Any:
    if kind == "size":  # bytes: 500000000000, 500G, 1.5T, 64MiB
        from cachesvc_client.shared.units import parse_size

        return parse_size(raw)
    if kind == "bool":
        val = raw.strip().lower()
        if val in ("1", "true", "yes", "on"):
            return True
        if val in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"expected a boolean, got {raw!r}")
    return kind(raw)


#: ``CACHESVC_*`` variables that other parts read from the same environment, so the service lets them
#: be: the client's (docs/settings.md's client table; tests/service/test_settings.py ties the two), the
#: scripts' and the compose file's. ``CACHESVC_ENV_<FIELD>`` is the client's too.
ELSEWHERE = frozenset({
    "URL", "TOKEN", "ENV_FILE", "MIN_COMPILE_SECONDS", "COMPILE_ROUTE", "SIGNING_KEY", "TRUSTED_KEYS",
    "EXTRA_ROOTS", "REQUIRE_HIT", "PUBLISH_AT_EXIT_S", "TORCH_FIXES", "USAGE", "USAGE_INTERVAL_S",
    "USAGE_AT_EXIT_S", "LEARNED_PACKAGES", "GC_HOLD", "LIBRARY_WARMUP", "PROOF_PINS",  # the client library
    "TORCH", "TEST_PG", "GPU_RESULTS", "GPU_COMPILE_MODELS", "GPU_DECODER",  # scripts/ and the tests' harness
    "BUCKET", "PORT", "PUBLISH",  # docker-compose.yml, deploy/integrations
})
ELSEWHERE_PREFIXES = ("ENV_",)

#: set only by a test's overrides (Flask's TESTING: the pages then accept a per-process key quietly)
_OVERRIDE_ONLY: Dict[str, tuple] = {"TESTING": (False, "bool", "")}

_TYPES = {"size": int, "bool": bool}


def _type(name: str, kind: Any) -> Any:
    """A field's type: its parser's (``size`` is an int), Optional for the one setting left unset."""
    typ = _TYPES.get(kind, kind)
    return Optional[typ] if name == "SECRET_KEY" else typ  # unset: a random key per serve


def _nearest(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.5)
    return f" (did you mean {close[0]}?)" if close else ""


class SettingsError(SystemExit):
    """A setting that does not exist or does not parse; the message names it (and the nearest one).
    A SystemExit, as the commands print it as one line."""


def _checked(name: str, value: Any) -> Any:
    """An override's ``value`` for ``name`` as its field's type: a string is parsed as its variable would
    be, an int passes for a float, a path for a string; None leaves a derived default to ``load``."""
    default, kind, _help = SETTINGS.get(name) or _OVERRIDE_ONLY[name]
    if value is None and (default is None or name == "SECRET_KEY"):
        return None
    typ = _TYPES.get(kind, kind)
    if isinstance(value, str) and typ is not str:
        try:
            return _parse(kind, value)
        except ValueError as exc:
            raise SettingsError(f"setting {name}: {exc}") from None
    if typ is str and isinstance(value, os.PathLike):
        return os.fspath(value)
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise SettingsError(f"setting {name}: expected {typ.__name__}, got {type(value).__name__} {value!r}")
    return value


def _namespace() -> Dict[str, Any]:
    def replace(self, **changes: Any) -> "Settings":
        """A copy with ``changes`` (names as in SETTINGS); refuses a name that is no setting
        (SettingsError). Derived defaults are not worked out again: set them too."""
        for name in changes:
            if name not in _FIELDS:
                raise SettingsError(f"{name} is not a setting{_nearest(name, _FIELDS)}; see docs/settings.md")
        return dataclasses.replace(self, **{k: _checked(k, v) for k, v in changes.items()})

    return {"replace": replace, "__doc__": "The service's settings, one frozen attribute each (config.SETTINGS); "
                                          "made by ``load``, changed copies by ``replace``."}


_FIELDS = {**SETTINGS, **_OVERRIDE_ONLY}
Settings = dataclasses.make_dataclass(
    "Settings", [(name, _type(name, kind)) for name, (_default, kind, _help) in _FIELDS.items()],
    namespace=_namespace(), frozen=True)
Settings.__module__ = __name__


def _from_environ(environ: Mapping[str, str]) -> Dict[str, Any]:
    """The settings the ``CACHESVC_*`` variables give; SettingsError for one that names nothing or
    does not parse."""
    given: Dict[str, Any] = {}
    for var, raw in environ.items():
        if not var.startswith("CACHESVC_"):
            continue
        name = var[len("CACHESVC_"):]
        if name in SETTINGS:
            try:
                given[name] = _parse(SETTINGS[name][1], raw)
            except ValueError as exc:
                raise SettingsError(f"{var}: {exc}") from None
        elif name not in ELSEWHERE and not name.startswith(ELSEWHERE_PREFIXES):
            known = [f"CACHESVC_{n}" for n in SETTINGS]
            raise SettingsError(f"{var} is set but names no setting{_nearest(var, known)}; unset it "
                                f"(the settings are in docs/settings.md)")
    return given


def load(overrides: Optional[Mapping[str, Any]] = None, environ: Optional[Mapping[str, str]] = None) -> Settings:
    """The settings: defaults < ``CACHESVC_*`` env < ``overrides`` (names as in SETTINGS, or TESTING).

    Raises SettingsError (a SystemExit) for an override key or a ``CACHESVC_*`` variable that names no
    setting, or a value that does not parse or has the wrong type.
    """
    environ = os.environ if environ is None else environ
    cfg: Dict[str, Any] = {name: default for name, (default, _kind, _help) in _FIELDS.items()}
    cfg.update(_from_environ(environ))
    for name, value in (overrides or {}).items():
        if name not in _FIELDS:
            raise SettingsError(f"{name} is not a setting{_nearest(name, _FIELDS)}; see docs/settings.md")
        cfg[name] = _checked(name, value)
    data = Path(cfg["DATA_DIR"]).resolve()
    cfg["DATA_DIR"] = str(data)
    if not cfg["DATABASE_URL"]:
        cfg["DATABASE_URL"] = f"sqlite:///{data / 'cachesvc.db'}"
    if not cfg["STORAGE_URL"]:
        cfg["STORAGE_URL"] = (data / "blobs").as_uri()
    if cfg["AUTO_MIGRATE"] is None:
        cfg["AUTO_MIGRATE"] = cfg["DATABASE_URL"].startswith("sqlite")
    if cfg["ANONYMOUS_READ"] is None:
        cfg["ANONYMOUS_READ"] = cfg["DATABASE_URL"].startswith("sqlite")
    if cfg["GC_GRACE_SECONDS"] is None:
        cfg["GC_GRACE_SECONDS"] = float(cfg["PRESIGN_EXPIRES"]) + 3600
    return Settings(**cfg)


def s3_options(settings: Settings) -> Dict[str, Any]:
    """The ``S3_*`` settings, as ``storage.from_url`` takes them (storage knows no Settings)."""
    return {name: getattr(settings, name) for name in SETTINGS if name.startswith("S3_")}


#: what a key copied from an example still says (secret.example.yaml, .env.example): never a real key
_PLACEHOLDERS = ("change-me", "changeme", "replace-me", "example", "secret-key", "xxxx")
MIN_SECRET_KEY = 32


def check_production(cfg: Settings) -> None:
    """With ``PRODUCTION`` on, raise SystemExit naming each setting that is not fit for a fleet."""
    if not cfg.PRODUCTION:
        return
    problems = []
    key = cfg.SECRET_KEY or ""
    if not key:
        problems.append("CACHESVC_SECRET_KEY is unset (every replica must sign sign-ins with the same key)")
    elif any(p in key.lower() for p in _PLACEHOLDERS):
        problems.append("CACHESVC_SECRET_KEY is a placeholder from an example")
    elif len(key) < MIN_SECRET_KEY:
        problems.append(f"CACHESVC_SECRET_KEY has {len(key)} characters, fewer than {MIN_SECRET_KEY}")
    if not cfg.COOKIE_SECURE:
        problems.append("CACHESVC_COOKIE_SECURE is off (a sign-in cookie must never travel over plain http)")
    if problems:
        raise SystemExit("cachesvc: CACHESVC_PRODUCTION is on, and " + "; ".join(problems) + ". Make a key with "
                         "`python3 -c 'import secrets; print(secrets.token_hex(32))'` into the Secret "
                         "(docs/security.md), or set CACHESVC_PRODUCTION=false for a trial")
