"""Demand: the shapes the fleet called a model with, the most called first (what a build job builds for)."""
from __future__ import annotations

from cachesvc_client.shared.keys import ENV_FIELDS

from .. import readmodel
from ..auth import requires
from ..schemas import DemandArgs
from ..services import services
from . import Blueprint
from .answers import DemandAnswerSchema

blp = Blueprint("demand", __name__, url_prefix="/api/v1/demand",
                description="The shapes the fleet called each model with")


@blp.route("", methods=["GET"])
@requires("read")
@blp.arguments(DemandArgs, location="query")
@blp.response(200, DemandAnswerSchema)
def get(args):
    """The key families of model `name` (with the six environment fields: of that environment only), the
    most called first, each with its `limit` most called shapes and their calls by how each was served.

    An unknown name has no items. Counts are what processes reported (`POST /api/v1/usage`).
    """
    env = {f: args[f] for f in ENV_FIELDS} if ENV_FIELDS[0] in args else None
    with services().db.session() as s:
        return readmodel.demand(s, args["name"], env, args["limit"])
