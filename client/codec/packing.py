"""Packs of small blobs: built at publish, read back at restore (the service side is ``cachesvc.content.packs``).

A pack is the members' stored bytes (each zstd or identity, by the same rule
as a loose blob) back to back, named by its own sha256. Publish packs the
small blobs the service reported missing, in digest order, cutting a pack
once its members' *decoded* sizes reach the service's ``target_size`` (so a
pack never exceeds it); each member is hashed again as it is read, like a
loose upload.

Restore reads the members of a pack in *runs*: members close together
(gaps under ``MERGE_GAP``) are fetched by one ``Range`` GET of at most
``RUN_BYTES``; a pack no larger than ``RUN_BYTES`` that is mostly wanted is
fetched whole. Runs, not packs, are the unit of work, so a few large packs
still spread over every worker.
"""
from __future__ import annotations

import hashlib
import io
from typing import Dict, Iterator, List, Optional, Tuple

from .encoding import encode

#: wanted members closer than this are fetched by one GET, the gap read and dropped
MERGE_GAP = 64 << 10
#: one GET reads at most this many bytes of a pack (more runs: more workers busy)
RUN_BYTES = 4 << 20
#: a pack at least this much wanted (stored bytes) is fetched whole, when it fits one run
MOSTLY = 0.5


def groups(items: List[dict], target: int) -> Iterator[List[dict]]:
    """Upload items (``sha256``, ``size``) in digest order, cut so each group's decoded bytes stay within
    ``target``."""
    group, size = [], 0
    for item in sorted(items, key=lambda i: i["sha256"]):
        if group and size + item["size"] > target:
            yield group
            group, size = [], 0
        group.append(item)
        size += item["size"]
    if group:
        yield group


def build(group: List[dict], paths: Dict[str, str]) -> Tuple[dict, bytes]:
    """Read and encode the group's blobs into one pack. Returns (``{"sha256", "members"}``, the pack's bytes).
    Raises IntegrityError when a file no longer hashes to its digest."""
    out = io.BytesIO()
    members = []
    for item in group:
        encoding, body, length = encode(paths[item["sha256"]], item["sha256"])
        try:
            data = body.read()
        finally:
            body.close()
        members.append({"sha256": item["sha256"], "offset": out.tell(), "stored_size": len(data),
                        "encoding": encoding, "size": item["size"]})
        out.write(data)
    data = out.getvalue()
    return {"sha256": hashlib.sha256(data).hexdigest(), "members": members}, data


def runs(members: List[Tuple[str, dict]], pack_size: Optional[int]) -> List[Tuple[Optional[Tuple[int, int]], list]]:
    """Plan the GETs for the wanted ``members`` (digest, resolve entry) of one pack.

    Returns ``[(byte range [start, end) or None for the whole pack, [(digest, entry), ...]), ...]``.
    """
    members = sorted(members, key=lambda m: m[1]["offset"])
    wanted = sum(m[1]["stored_size"] for m in members)
    if pack_size and pack_size <= RUN_BYTES and wanted >= MOSTLY * pack_size:
        return [(None, members)]
    out: List[Tuple[Optional[Tuple[int, int]], list]] = []
    start = end = None
    cur: list = []
    for digest, b in members:
        lo, hi = b["offset"], b["offset"] + b["stored_size"]
        if cur and (lo - end >= MERGE_GAP or hi - start > RUN_BYTES):
            out.append(((start, end), cur))
            cur = []
        if not cur:
            start = lo
        cur.append((digest, b))
        end = hi if not cur[:-1] else max(end, hi)
    if cur:
        out.append(((start, end), cur))
    return out
