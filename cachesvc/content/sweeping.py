"""What GC (``cachesvc.lifecycle.collect``) reads and deletes of the stored objects: the loose blobs, the
packs and the presigned uploads found in storage, and their deletes. Which of them are garbage is the
index's to say, and lifecycle's to decide; this module only names the objects (the object layout is
``cachesvc.storage``'s) and removes them.

A failed delete is logged and counted, never raised: the object is still there for the next GC's sweep.
"""
from __future__ import annotations

import logging
import re
from collections import defaultdict
from typing import Dict, Iterable, Iterator, List, Tuple

from ..storage import INCOMING, Storage, StorageError, blob_key, pack_key

log = logging.getLogger(__name__)

_KEY_RE = re.compile(r"^v1/blobs/[0-9a-f]{2}/([0-9a-f]{64})(\.zst)?$")
_PACK_KEY_RE = re.compile(r"^v1/packs/[0-9a-f]{2}/([0-9a-f]{64})$")


def _delete_keys(storage: Storage, keys: Iterable[str]) -> int:
    """Delete storage objects; failures are logged and left for the next sweep. Returns how many failed."""
    failed = 0
    for key in keys:
        try:
            storage.delete(key)
        except StorageError as exc:
            failed += 1
            log.warning("gc: could not delete %s: %s", key, exc)
    return failed


def delete_blobs(storage: Storage, blobs: Iterable[Tuple[str, str]]) -> int:
    """Delete the loose blobs ``(digest, encoding)``; returns how many deletes failed."""
    return _delete_keys(storage, [blob_key(d, enc) for d, enc in blobs])


def delete_packs(storage: Storage, digests: Iterable[str]) -> int:
    """Delete the packs named ``digests``; returns how many deletes failed."""
    return _delete_keys(storage, [pack_key(d) for d in digests])


def delete_uploads(storage: Storage, keys: Iterable[str]) -> int:
    """Delete presigned uploads (keys from ``uploads_by_version``); returns how many deletes failed."""
    return _delete_keys(storage, keys)


def stored_blobs(storage: Storage) -> Iterator[Tuple[str, str]]:
    """``(digest, encoding)`` of every loose blob object in storage, row or not."""
    for key in storage.iter_keys("v1/blobs/"):
        m = _KEY_RE.match(key)
        if m:
            yield m.group(1), "zstd" if m.group(2) else "identity"


def stored_packs(storage: Storage) -> Iterator[str]:
    """The digest of every pack object in storage, row or not."""
    return (m.group(1) for m in map(_PACK_KEY_RE.match, storage.iter_keys("v1/packs/")) if m)


def uploads_by_version(storage: Storage) -> Dict[int, List[str]]:
    """Every presigned upload in storage (``v1/incoming/<version id>/``) by the id of its version; -1 for
    keys under a name that is no version id (nothing the service handed out)."""
    found: Dict[int, List[str]] = defaultdict(list)
    for key in storage.iter_keys(INCOMING):
        version = key[len(INCOMING):].split("/", 1)[0]
        found[int(version) if version.isdigit() and len(version) < 12 else -1].append(key)
    return found


def sweep_received(storage: Storage, older_than: float) -> int:
    """Remove uploads through the service left half-received (a service killed mid-upload) older than
    ``older_than`` seconds (``Storage.sweep_incoming``); returns how many."""
    return storage.sweep_incoming(older_than)
