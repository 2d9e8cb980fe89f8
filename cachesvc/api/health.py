"""Liveness and readiness."""
from __future__ import annotations

from sqlalchemy import text

from ..errors import Unavailable
from ..auth import requires
from .answers import HealthSchema
from . import Blueprint, services

blp = Blueprint("health", __name__, url_prefix="/healthz", description="Health check")


@blp.route("", methods=["GET"])
@requires(None)
@blp.response(200, HealthSchema)
def healthz():
    """200 when the database answers; 503 otherwise."""
    svc = services()
    try:
        with svc.db.session() as s:
            s.execute(text("SELECT 1"))
    except Exception as exc:  # any failure to reach the database means not ready
        raise Unavailable(f"database unreachable: {type(exc).__name__}") from None
    return {"status": "ok", "version": svc.version}
