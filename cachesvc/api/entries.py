"""Browse entries (JSON): filter, sort and page; one entry with its versions, files and shared blobs."""
from __future__ import annotations


from .. import readmodel
from ..auth import requires
from ..schemas import EntryFilterArgs
from .version_answers import EntryDetailSchema, EntryListSchema
from ..services import services
from . import Blueprint

blp = Blueprint("entries", __name__, url_prefix="/api/v1/entries", description="Browse cache entries")


@blp.route("", methods=["GET"])
@requires("read")
@blp.arguments(EntryFilterArgs, location="query")
@blp.response(200, EntryListSchema)
def list_entries(args):
    """Entries with at least one committed version.

    Filters (combined with AND) on every key field; `sort` is `newest`
    (last published), `largest`, `most_restored` or `last_restored`; page with
    `limit` and `offset` (`next_offset` is null on the last page).
    """
    with services().db.session() as s:
        return readmodel.list_entries(s, args)


@blp.route("/<int:entry_id>", methods=["GET"])
@requires("read")
@blp.response(200, EntryDetailSchema)
def get_entry(entry_id):
    """An entry with its committed versions (newest first), each version's files with sizes and sha256,
    and which versions share blobs."""
    with services().db.session() as s:
        return readmodel.entry_detail(s, entry_id)
