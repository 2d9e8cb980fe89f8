"""Inductor's live remote cache: values by Inductor's own key, stored as blobs.

A process that enabled ``cachesvc_client.enable_remote_cache()`` asks here,
at every compile, for the FX graph (or autotune result) Inductor is about to
build, and puts what it built. Unlike a published version nothing is
snapshotted: items appear one by one, while the fleet runs.

An item is named by ``(cache, env_digest, key)``:

* ``cache``: the client's name for Inductor's cache (``fx-graph``,
  ``autotune``, ``bundled-autotune``, ...);
* ``env_digest``: sha256 of the process's environment fingerprint
  (``cachesvc_client.shared.keys.ENV_FIELDS``: torch, triton, cuda, python, device,
  arch). Inductor's keys already hash the torch version and the device, but
  that is Inductor's business and may change; the namespace makes sure items
  from another torch or device never mix, whatever Inductor's keys hold;
* ``key``: the key as Inductor hands it to its backend.

The value is opaque bytes (Inductor's JSON-encoded dict). It is stored
zstd-compressed in the blob store under its sha256, so the blob layout, GC
and both storage backends are the ones of published versions; a blob named
by an item is never collected, and GC evicts items not used for
``REMOTE_CACHE_MAX_IDLE_DAYS`` so it can collect theirs (``cachesvc.lifecycle.collect``).

A GET checks what it read before serving it (whoever can write to the bucket
must not reach Inductor through it): the stored bytes are decoded, bounded by
the value's size recorded at PUT (``cachesvc.storage.decoding``), and must hash to
the value's sha256 recorded at PUT; anything else is a miss, logged and
counted (``corrupt``). The 200 carries that sha256 in ``X-Cachesvc-Sha256``
for the client's own check. A PUT of a value whose stored object is lost or
replaced writes it again (``content.store_value``), so the fleet's next compile heals it.

A PUT takes the store lock (shared) like a publish, so GC runs wholly before
or after it and never deletes a blob between its upload and its item row.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import logging
from typing import Dict, NamedTuple, Optional

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from cachesvc_client.shared import keys

from . import content
from . import lifecycle
from .errors import InvalidRequest, PayloadTooLarge
from .models import Blob, RemoteCacheItem, utcnow
from .storage.types import Storage

log = logging.getLogger(__name__)

def check_name(cache: str, key: str) -> None:
    """Raise InvalidRequest unless the cache name and key follow ``cachesvc_client.shared.keys``' rules."""
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


class Lookup(NamedTuple):
    """What a GET found: ``value`` (None on a miss) and ``result``, the metrics label: ``hit``, ``miss``
    (no item, or its object is lost) or ``corrupt`` (the stored bytes are not the value that was PUT)."""

    value: Optional[bytes]
    result: str
    sha256: Optional[str] = None  # of ``value``, checked


def get(session: Session, storage: Storage, cache: str, env: Dict[str, str], key: str,
        now: Optional[dt.datetime] = None) -> Lookup:
    """The value stored under the name, checked against the sha256 and size recorded when it was PUT: a lost
    object or bytes that are not that value are a miss, logged. Raises StorageError when storage fails."""
    item = _find(session, cache, env, key)
    if item is None:
        return Lookup(None, "miss")
    blob = session.get(Blob, item.digest)
    if blob is None:  # cannot happen while GC keeps item blobs; a miss all the same
        log.warning("remote cache item %s/%s names blob %s, which is not stored", cache, key, item.digest)
        return Lookup(None, "miss")
    value, why = content.read_value(storage, blob, item.size)
    if value is None:  # a miss: Inductor compiles, and its PUT stores the value again (``put``)
        log.warning("remote cache item %s/%s (id %s): blob %s is %s; answered as a miss", cache, key, item.id,
                    blob.digest, "indexed but missing from storage" if why == "lost" else why)
        return Lookup(None, "miss" if why == "lost" else "corrupt")
    session.execute(update(RemoteCacheItem).where(RemoteCacheItem.id == item.id)
                    .values(hit_count=RemoteCacheItem.hit_count + 1, last_used_at=now or utcnow()))
    return Lookup(value, "hit", blob.digest)


def put(session: Session, storage: Storage, cache: str, env: Dict[str, str], key: str, value: bytes,
        now: Optional[dt.datetime] = None) -> dict:
    """Store ``value`` under the name (replacing an older value); return the item's summary. A blob already
    stored for the value is checked first: one whose object is lost or no longer holds the value is written
    again from ``value`` (``content.store_value``)."""
    now = now or utcnow()
    digest = hashlib.sha256(value).hexdigest()
    lifecycle.store_lock(session)  # GC runs wholly before this (the blob row is gone: store it again) or after
    content.store_value(session, storage, value, session.get(Blob, digest))  # new, or lost or replaced: stored
    values = {"cache": cache, "env_digest": keys.env_digest(env), "key": key, "env": env, "digest": digest,
              "size": len(value), "created_at": now, "last_used_at": now, "hit_count": 0}
    mod = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    stmt = mod.insert(RemoteCacheItem).values(**values)
    session.execute(stmt.on_conflict_do_update(
        index_elements=["cache", "env_digest", "key"],
        set_={"digest": digest, "size": len(value), "last_used_at": now}))
    return {"cache": cache, "key": key, "sha256": digest, "size": len(value)}
