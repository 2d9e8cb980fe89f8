"""Inductor's live remote cache: values by Inductor's own key, stored as blobs.

A process that enabled ``cachesvc_client.enable_remote_cache()`` asks here,
at every compile, for the FX graph (or autotune result) Inductor is about to
build, and puts what it built. Unlike a published version nothing is
snapshotted: items appear one by one, while the fleet runs.

An item is named by ``(cache, env_digest, key)``:

* ``cache``: the client's name for Inductor's cache (``fx-graph``,
  ``autotune``, ``bundled-autotune``, ...);
* ``env_digest``: sha256 of the process's environment fingerprint
  (``cachesvc_client.keys.ENV_FIELDS``: torch, triton, cuda, python, device,
  arch). Inductor's keys already hash the torch version and the device, but
  that is Inductor's business and may change; the namespace makes sure items
  from another torch or device never mix, whatever Inductor's keys hold;
* ``key``: the key as Inductor hands it to its backend.

The value is opaque bytes (Inductor's JSON-encoded dict). It is stored
zstd-compressed in the blob store under its sha256, so the blob layout, GC
and both storage backends are the ones of published versions; a blob named
by an item is never collected (``referenced_by_items``), and ``evict`` drops
items not used for ``REMOTE_CACHE_MAX_IDLE_DAYS`` so GC can collect them.

A PUT takes the store lock (shared) like a publish, so GC runs wholly before
or after it and never deletes a blob between its upload and its item row.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import io
import logging
from typing import Dict, Optional

import zstandard
from sqlalchemy import delete, exists, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from cachesvc_client import keys

from . import blobs, collect, index, packs
from .db import Database
from .errors import InvalidRequest, PayloadTooLarge
from .models import Blob, RemoteCacheItem, utcnow
from .storage import BlobNotFound, Storage

log = logging.getLogger(__name__)

def check_name(cache: str, key: str) -> None:
    """Raise InvalidRequest unless the cache name and key follow ``cachesvc_client.keys``' rules."""
    try:
        keys.check_cache_name(cache)
        keys.check_remote_key(key)
    except keys.InvalidKey as exc:
        raise InvalidRequest(str(exc)) from None


def read_body(req, limit: int) -> bytes:
    """The body of request ``req``, refused with PayloadTooLarge beyond ``limit`` bytes.

    A declared Content-Length is checked before anything is read; a chunked body is read up to
    ``limit`` + 1 bytes.
    """
    too_large = (f"the value is larger than {limit} bytes (CACHESVC_REMOTE_CACHE_MAX_BYTES); "
                 f"Inductor keeps it in its local cache only")
    if req.content_length is not None and req.content_length > limit:
        raise PayloadTooLarge(too_large, {"limit": limit, "size": req.content_length})
    data = req.stream.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(too_large, {"limit": limit})
    if not data:
        raise InvalidRequest("the value is empty; Inductor never stores an empty value")
    return data


def _find(session: Session, cache: str, env: Dict[str, str], key: str) -> Optional[RemoteCacheItem]:
    return session.scalars(select(RemoteCacheItem).where(
        RemoteCacheItem.cache == cache, RemoteCacheItem.env_digest == keys.env_digest(env),
        RemoteCacheItem.key == key)).first()


def get(session: Session, storage: Storage, cache: str, env: Dict[str, str], key: str,
        now: Optional[dt.datetime] = None) -> Optional[bytes]:
    """The value stored under the name, or None (a miss, also when its object is lost). Raises StorageError
    when storage fails."""
    now = now or utcnow()
    item = _find(session, cache, env, key)
    if item is None:
        return None
    blob = session.get(Blob, item.digest)
    if blob is None:  # cannot happen while GC keeps item blobs; a miss all the same
        log.warning("remote cache item %s/%s names blob %s, which is not stored", cache, key, item.digest)
        return None
    try:
        raw = packs.read_stored(storage, blob)
    except BlobNotFound:  # one lost object: a miss for this key (Inductor compiles and puts it again)
        log.warning("remote cache item %s/%s: blob %s is indexed but missing from storage", cache, key, blob.digest)
        return None
    try:
        value = blobs.decode_all(raw) if blob.encoding == "zstd" else raw  # several frames if a large publish stored it
    except blobs.BadBlob as exc:  # a damaged object: a miss, like a lost one
        log.warning("remote cache item %s/%s: blob %s does not decode: %s", cache, key, blob.digest, exc)
        return None
    session.execute(update(RemoteCacheItem).where(RemoteCacheItem.id == item.id)
                    .values(hit_count=RemoteCacheItem.hit_count + 1, last_used_at=now))
    return value


def put(session: Session, storage: Storage, cache: str, env: Dict[str, str], key: str, value: bytes,
        now: Optional[dt.datetime] = None) -> dict:
    """Store ``value`` under the name (replacing an older value); return the item's summary."""
    now = now or utcnow()
    digest = hashlib.sha256(value).hexdigest()
    collect.store_lock(session)  # GC runs wholly before this (the blob row is gone: store it again) or after
    blob = session.get(Blob, digest)
    encoding = blob.encoding if blob is not None else "zstd"
    if blob is None or not packs.stored_somewhere(storage, blob):  # new, or its object was lost
        body = zstandard.ZstdCompressor(level=3).compress(value) if encoding == "zstd" else value
        row = blobs.receive(storage, digest, encoding, io.BytesIO(body))
        if blob is not None and blob.pack_digest is not None:  # its pack was lost: the row names the new object
            session.execute(update(Blob).where(Blob.digest == digest)
                            .values(pack_digest=None, pack_offset=None, stored_size=row["stored_size"]))
        else:
            index.insert_blobs(session, [row])
    values = {"cache": cache, "env_digest": keys.env_digest(env), "key": key, "env": env, "digest": digest,
              "size": len(value), "created_at": now, "last_used_at": now, "hit_count": 0}
    mod = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    stmt = mod.insert(RemoteCacheItem).values(**values)
    session.execute(stmt.on_conflict_do_update(
        index_elements=["cache", "env_digest", "key"],
        set_={"digest": digest, "size": len(value), "last_used_at": now}))
    return {"cache": cache, "key": key, "sha256": digest, "size": len(value)}


# -- garbage collection ----------------------------------------------------------------

def referenced_by_items(digest_col):
    """SQL condition: some remote-cache item names the blob ``digest_col`` (GC keeps it)."""
    return exists().where(RemoteCacheItem.digest == digest_col)


def evict(db: Database, settings: dict, now: Optional[dt.datetime] = None) -> dict:
    """Delete the items not used for ``REMOTE_CACHE_MAX_IDLE_DAYS`` (0: never); GC then collects their blobs."""
    days = settings["REMOTE_CACHE_MAX_IDLE_DAYS"]
    if not days:
        return {"remote_cache_items_evicted": 0}
    cutoff = (now or utcnow()) - dt.timedelta(days=days)
    with db.session() as s:
        gone = s.execute(delete(RemoteCacheItem).where(RemoteCacheItem.last_used_at < cutoff)).rowcount
    return {"remote_cache_items_evicted": gone}
