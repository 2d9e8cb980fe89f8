"""The resolve answer's ``blobs`` map: where to fetch each blob, loose or packed.

One builder for the exact-key resolve (``resolving``) and the fallbacks (``fallback``), so both answer
alike (``cachesvc_client.answers`` checks what they send).
"""
from __future__ import annotations

from .. import content
from ..content import blob_url
from ..storage.types import Storage


def blob_entries(storage: Storage, rows, expires: int) -> dict:
    """The ``blobs`` map of a resolve answer from rows with ``digest, encoding, blob_size, stored_size,
    stored_sha256, pack_digest, pack_offset, pack_size`` (rows without a blob left out). A loose blob
    gets ``stored_sha256`` where the service checked its stored bytes. A packed blob also gets ``pack``
    (its pack's URL), ``pack_sha256``, ``pack_size`` and ``offset``; its ``url`` serves the member alone (older clients)."""
    out, pack_urls = {}, {}
    for f in rows:
        if not f.encoding or f.digest in out:
            continue
        if f.pack_digest is None:
            out[f.digest] = {"url": blob_url(storage, f.digest, f.encoding, expires), "encoding": f.encoding,
                             "size": f.blob_size, "stored_size": f.stored_size}
            if f.stored_sha256:  # the service checked the stored bytes itself (cachesvc.content.blobs): a client
                out[f.digest]["stored_sha256"] = f.stored_sha256  # may hash those instead of the decoded ones
            continue
        if f.pack_digest not in pack_urls:
            pack_urls[f.pack_digest] = content.pack_url(storage, f.pack_digest, expires)
        out[f.digest] = {"url": f"/api/v1/blobs/{f.digest}", "encoding": f.encoding, "size": f.blob_size,
                         "stored_size": f.stored_size, "pack": pack_urls[f.pack_digest],
                         "pack_sha256": f.pack_digest, "pack_size": f.pack_size, "offset": f.pack_offset}
    return out
