"""HTML pages (Jinja, server-rendered, no JavaScript): the index grouped by name, an entry, the stats.

The pages read the same rows as the JSON API (``cachesvc.readmodel``) and need the same scope
(`read`; anonymous when CACHESVC_ANONYMOUS_READ is on), from a bearer token or a
sign-in (``cachesvc.browse.signin``); the admin pages are ``cachesvc.browse.admin_pages``.
"""
from __future__ import annotations

from itertools import groupby

from flask import Blueprint, render_template, request

from cachesvc_client.shared import keys

from . import charts
from .. import readmodel
from ..services import services
from ..auth import requires
from ..errors import InvalidRequest
from ..schemas import MAX_OFFSET, SORTS
from .signin import page_blueprint

# static/: the pages' stylesheet, served by the service itself (no CDN), open to everyone (auth._FOREIGN)
bp = page_blueprint(Blueprint("web", __name__, template_folder="templates", static_folder="static",
                              static_url_path="/assets"))  # not /static: the app's own (empty) static route

PAGE = 100
FILES_PAGE = 100  # files of each version an entry page lists at once
TOP = 10  # rows of each "top entries" table on the stats page
TOP_SHAPES = 20  # shapes of each key family an entry page shows (chart and table)


def _filters() -> dict:
    args = {f: request.args.get(f, "").strip() for f in readmodel.FILTER_FIELDS}
    args = {k: v for k, v in args.items() if v}
    tags = [t for t in request.args.getlist("tag") if t.strip()]
    for t in tags:
        if "=" not in t:
            raise InvalidRequest(f"tag filter {t!r} is not KEY=VALUE")
    if tags:
        args["tag"] = tags
    search = request.args.get("q", "").strip()
    if search:
        args["search"] = search  # a substring of the name or the shape
    if request.args.get("problem", "").lower() in ("1", "true", "yes"):
        args["problem"] = True  # only entries whose restores get no cache hit
    kind = request.args.get("kind", "").strip()
    if kind:
        if kind not in keys.KINDS:
            raise InvalidRequest(f"kind must be one of {', '.join(keys.KINDS)}")
        args["kind"] = kind
    sort = request.args.get("sort", "newest")
    if sort not in SORTS:
        raise InvalidRequest(f"sort must be one of {', '.join(SORTS)}")
    return dict(args, sort=sort, limit=PAGE, offset=_offset(request.args.get("offset", 0)))


def _offset(raw, name: str = "offset") -> int:
    """A page's offset argument: a number from 0 to MAX_OFFSET (the API's bound; SQLite's OFFSET takes
    64 bits at most, an OverflowError)."""
    raw = str(raw).strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 12:
        raise InvalidRequest(f"{name} must be a number from 0 to {MAX_OFFSET}")
    if int(raw) > MAX_OFFSET:
        raise InvalidRequest(f"{name} must be at most {MAX_OFFSET}")
    return int(raw)


@bp.route("/")
@requires("read")
def index():
    args = _filters()
    with services().db.session() as s:
        page = readmodel.list_entries(s, args)
        rates = readmodel.verdicts_by(s, [r["id"] for r in page["entries"]])
    for r in page["entries"]:
        r["verdicts"] = rates.get(r["id"])
    # rows stay in the chosen sort; a name heads each run of rows that share it (one table: one set of columns)
    groups = [(name, list(items)) for name, items in groupby(page["entries"], key=lambda r: r["name"])]
    query = {("q" if k == "search" else k): v for k, v in args.items() if k not in ("limit", "offset")}
    return render_template("index.html", page=page, groups=groups, args=args, query=query, sorts=SORTS,
                           fields=readmodel.FILTER_FIELDS, kinds=keys.KINDS)


@bp.route("/entries/<int:entry_id>")
@requires("read")
def entry(entry_id):
    with services().db.session() as s:
        detail = readmodel.entry_detail(s, entry_id)
        rates = readmodel.verdicts_by(s, [entry_id], per="version")
        entry_rate = readmodel.verdicts_by(s, [entry_id]).get(entry_id)
        # the fleet's demand of the entry's model in the entry's environment: its key families (usually one)
        demand = readmodel.demand(s, detail["name"], detail["env"], TOP_SHAPES)["items"]
    for family in demand:
        family["chart"] = charts.shape_demand(family["shapes"], top_n=TOP_SHAPES)
    offset = _offset(request.args.get("files_offset", 0), "files_offset")
    for v in detail["versions"]:
        v["verdicts"] = rates.get(v["id"])
        v["restore_command"] = readmodel.restore_command(detail, v, request.url_root)
        v["files_shown"] = v["files"][offset:offset + FILES_PAGE]  # a version may hold 100,000 files
    more = any(len(v["files"]) > offset + FILES_PAGE for v in detail["versions"])
    return render_template("entry.html", e=detail, entry_rate=entry_rate, files_offset=offset, files_page=FILES_PAGE,
                           files_more=more, demand=demand)


@bp.route("/stats")
@requires("read")
def stats_page():
    try:
        days = min(3660, max(1, int(request.args.get("days", 30))))
    except ValueError:
        raise InvalidRequest("days must be a number") from None
    with services().db.session() as s:
        totals, rows, served = readmodel.totals(s), readmodel.daily(s, days), readmodel.served(s)
        top = {sort: readmodel.list_entries(s, {"sort": sort, "limit": TOP, "offset": 0})["entries"]
               for sort in ("most_restored", "largest")}
        problems = readmodel.list_entries(s, {"problem": True, "limit": 1, "offset": 0})["total"]
        rates = readmodel.verdicts_by(s, [r["id"] for rs in top.values() for r in rs])
    return render_template("stats.html", t=totals, rows=rows, days=days, served=served, top=top, rates=rates,
                           problems=problems, chart=charts.stored_and_restores(rows), hit_chart=charts.hit_rate(rows))
