"""Entries as the JSON API (``GET /api/v1/entries``) and the HTML pages read them: the same rows for both.

``search`` keeps the entries whose name or shape contains it (the pages' search box).
``shared_bytes`` on a row and on a version: the stored bytes of its blobs that another
committed version (of any entry) names too, which is where the dedup ratio comes from.

An entry is listed while it has a committed version. Its row carries the
newest committed version's bytes (``size``: what a restore fetches), the
version count, the bytes of all its versions, the kinds of its committed
versions, created / last restored and the restore count, and ``problem``
when the newest version's restores get no cache hit (``cachesvc.resolve.verdicts``).
With a ``kind`` filter only versions of that kind count, and only entries
with one are listed.
"""
from __future__ import annotations

import json
import shlex
from collections import defaultdict
from itertools import combinations
from typing import Dict, List

from sqlalchemy import distinct, exists, func, select
from sqlalchemy.orm import Session, aliased

from cachesvc_client.shared import keys

from .. import index
from ..models import Blob, Entry, Version, VersionFile

FILTER_FIELDS = ("name", "shape") + keys.ENV_FIELDS


def _like_literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _tag_pair(item: str) -> str:
    """KEY=VALUE as it appears inside canonical tags JSON (``"k":"v"``)."""
    k, _, v = item.partition("=")
    return json.dumps({k: v}, separators=(",", ":"), ensure_ascii=False)[1:-1]


def list_entries(session: Session, args: dict) -> dict:
    """Filtered, sorted, paginated entry rows (``args`` as EntryFilterArgs loads them).

    Three queries, none of which groups every version: the page (each entry
    joined to its newest committed version, the one no newer committed version
    of the entry follows, so the default sort walks the version id index
    backwards and stops after the page), the count of entries with a committed
    version, and the version count and bytes of the page's entries only. The
    count still reads one index entry per committed version: it is what a
    list request costs at 100,000 entries.
    """
    newer = aliased(Version)
    of_kind = [Version.kind == args["kind"]] if args.get("kind") else []
    is_newest = ~exists().where(newer.entry_id == Version.entry_id, newer.state == "committed",
                                newer.id > Version.id, *([newer.kind == args["kind"]] if of_kind else []))
    q = (select(Entry, Version.total_bytes, Version.id, Version.committed_at, Version.last_verdict)
         .join(Entry, Entry.id == Version.entry_id).where(Version.state == "committed", is_newest, *of_kind))
    # Counted off the versions' (entry_id, state, id) index; entries joined only when filtered.
    count = select(func.count(distinct(Version.entry_id))).where(Version.state == "committed", *of_kind)
    conds = _filters(args)
    if conds:
        q, count = q.where(*conds), count.join(Entry, Entry.id == Version.entry_id).where(*conds)
    if args.get("problem") is not None:
        flagged = Version.problem
        cond = flagged if args["problem"] else ~flagged | Version.last_verdict.is_(None)
        q, count = q.where(cond), count.where(cond, is_newest)
    total = session.scalar(count)
    order = {
        "newest": (Version.id.desc(),),
        "largest": (Version.total_bytes.desc(),),
        "most_restored": (Entry.restore_count.desc(),),
        "last_restored": (Entry.last_restored_at.is_(None), Entry.last_restored_at.desc()),
    }[args.get("sort", "newest")]
    page = session.execute(q.order_by(*order, Entry.id.desc()).limit(args["limit"]).offset(args["offset"])).all()
    counts = {eid: (n, all_bytes) for eid, n, all_bytes in session.execute(
        select(Version.entry_id, func.count(Version.id), func.sum(Version.total_bytes))
        .where(Version.state == "committed", Version.entry_id.in_([e.id for e, *_ in page]), *of_kind)
        .group_by(Version.entry_id))} if page else {}
    rows = [dict(index.entry_summary(e), versions=counts[e.id][0], size=size, versions_bytes=int(counts[e.id][1]),
                 newest_version_id=newest, last_published_at=index.iso(published), problem=verdict == "no_hits")
            for e, size, newest, published, verdict in page]
    kinds = _kinds(session, [r["id"] for r in rows])
    shared = shared_bytes(session, [r["newest_version_id"] for r in rows])
    purged = dict(session.execute(
        select(Version.entry_id, func.count(Version.id)).where(Version.state == "purged", *of_kind,
                                                               Version.entry_id.in_([r["id"] for r in rows]))
        .group_by(Version.entry_id)).all()) if rows else {}
    for r in rows:
        r["kinds"] = kinds.get(r["id"], [])
        r["shared_bytes"] = shared.get(r["newest_version_id"], 0)
        r["purged_versions"] = purged.get(r["id"], 0)  # purged, not yet removed by GC
    nxt = args["offset"] + len(rows)
    return {"total": total, "limit": args["limit"], "offset": args["offset"], "sort": args.get("sort", "newest"),
            "next_offset": nxt if nxt < total else None, "entries": rows}


def _filters(args: dict) -> list:
    """The WHERE conditions on entries that ``args`` asks for."""
    conds = [getattr(Entry, f) == args[f] for f in FILTER_FIELDS if args.get(f)]
    if args.get("tags"):
        conds.append(Entry.tags == keys.canonical_tags(index.parse_tags(args["tags"])))
    for item in args.get("tag") or ():
        conds.append(Entry.tags.like(f"%{_like_literal(_tag_pair(item))}%", escape="\\"))
    if args.get("search"):
        pattern = f"%{_like_literal(args['search'])}%"
        conds.append(Entry.name.ilike(pattern, escape="\\") | Entry.shape.ilike(pattern, escape="\\"))
    return conds


def _held_elsewhere(version_ids: List[int]):
    """(version_id, digest) of ``version_ids``' blobs that another committed version names too."""
    mine = (select(VersionFile.version_id, VersionFile.digest).distinct()
            .where(VersionFile.version_id.in_(version_ids)).subquery())
    other, other_version = aliased(VersionFile), aliased(Version)
    elsewhere = exists().where(other.digest == mine.c.digest, other.version_id != mine.c.version_id,
                               other_version.id == other.version_id, other_version.state == "committed")
    return mine, elsewhere


def shared_bytes(session: Session, version_ids: List[int]) -> Dict[int, int]:
    """version id -> stored bytes of its blobs that another committed version names too (one query)."""
    if not version_ids:
        return {}
    mine, elsewhere = _held_elsewhere(version_ids)
    return {vid: int(n) for vid, n in session.execute(
        select(mine.c.version_id, func.coalesce(func.sum(Blob.stored_size), 0))
        .join(Blob, Blob.digest == mine.c.digest).where(elsewhere).group_by(mine.c.version_id))}


def shared_digests(session: Session, version_ids: List[int]) -> Dict[int, set]:
    """version id -> the digests of its blobs that another committed version names too."""
    out: Dict[int, set] = defaultdict(set)
    if version_ids:
        mine, elsewhere = _held_elsewhere(version_ids)
        for vid, digest in session.execute(select(mine.c.version_id, mine.c.digest).where(elsewhere)):
            out[vid].add(digest)
    return out


def restore_command(entry: dict, version: dict, url: str) -> str:
    """The `cachesvc-client restore` command line that fetches ``version`` of ``entry``: its exact key,
    the environment as ``CACHESVC_ENV_<FIELD>`` (so a process without torch or a GPU asks for it),
    the token from ``$CACHESVC_TOKEN``."""
    env = " ".join(f"CACHESVC_ENV_{f.upper()}={shlex.quote(entry['env'][f])}" for f in keys.ENV_FIELDS)
    args = ["cachesvc-client", "restore", "--url", url.rstrip("/"), "--name", entry["name"], "--shape", entry["shape"]]
    for k, v in sorted(entry["tags"].items()):
        args += ["--tag", f"{k}={v}"]
    if version["kind"] != keys.DEFAULT_KIND:
        args += ["--kind", version["kind"]]
    return f"{env} {' '.join(shlex.quote(a) for a in args)}"


def _kinds(session: Session, entry_ids: List[int]) -> Dict[int, List[str]]:
    """entry id -> the sorted kinds of its committed versions."""
    out: Dict[int, List[str]] = defaultdict(list)
    if entry_ids:
        for entry_id, kind in session.execute(select(Version.entry_id, Version.kind).distinct()
                                              .where(Version.entry_id.in_(entry_ids), Version.state == "committed")
                                              .order_by(Version.entry_id, Version.kind)):
            out[entry_id].append(kind)
    return out


def entry_detail(session: Session, entry_id: int) -> dict:
    """An entry with its committed versions (newest first), each with its files, and the blobs they share;
    ``purged_versions``: those purged and not yet removed by GC (no files).

    A file is ``shared`` when another committed version (of any entry) names its blob; a version's
    ``shared_with`` counts the blobs it shares with each other version of this entry, and its
    ``shared_bytes`` the stored bytes of all its shared blobs.
    """
    entry = index.get_or_404(session, Entry, entry_id, "entry")
    every = session.scalars(select(Version).where(Version.entry_id == entry_id,
                                                  Version.state.in_(("committed", "purged")))
                            .order_by(Version.id.desc())).all()
    versions = [v for v in every if v.state == "committed"]
    files: Dict[int, List[VersionFile]] = defaultdict(list)
    if versions:
        for f in session.scalars(select(VersionFile).where(VersionFile.version_id.in_([v.id for v in versions]))
                                 .order_by(VersionFile.root, VersionFile.path)):
            files[f.version_id].append(f)
    blobs = index.present_blobs(session, {f.digest for fs in files.values() for f in fs})
    sets = {v.id: {f.digest for f in files[v.id]} for v in versions}
    elsewhere = shared_digests(session, list(sets))
    out_versions = []
    kinds_seen = set()
    for v in versions:
        mine = sets[v.id]
        row = index.version_summary(v)
        row["newest_of_kind"] = v.kind not in kinds_seen  # what a resolve of this kind returns
        kinds_seen.add(v.kind)
        row["blob_count"] = len(mine)
        row["stored_bytes"] = sum(blobs[d].stored_size for d in mine if d in blobs)
        row["shared_bytes"] = sum(blobs[d].stored_size for d in elsewhere[v.id] if d in blobs)
        row["shared_with"] = {str(o): len(mine & sets[o]) for o in sets if o != v.id and mine & sets[o]}
        row["files"] = [{**index.file_row(f),
                         "stored_size": blobs[f.digest].stored_size if f.digest in blobs else None,
                         "encoding": blobs[f.digest].encoding if f.digest in blobs else None,
                         "shared": f.digest in elsewhere[v.id]}
                        for f in files[v.id]]
        out_versions.append(row)
    shared = []
    for a, b in combinations([v.id for v in versions], 2):
        common = sets[a] & sets[b]
        if common:
            shared.append({"versions": [a, b], "blobs": len(common),
                           "stored_bytes": sum(blobs[d].stored_size for d in common if d in blobs)})
    purged = [dict(index.version_summary(v), purged_at=index.iso(v.purged_at)) for v in every if v.state == "purged"]
    return dict(index.entry_summary(entry), versions=out_versions, shared_blobs=shared, purged_versions=purged,
                size=versions[0].total_bytes if versions else 0)
