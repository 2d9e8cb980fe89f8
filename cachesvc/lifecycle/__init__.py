"""Lifecycle: the only code that deletes, and the audit log of who changed what.

::

    admin API / `cachesvc purge|gc|token` / the scheduler -> actions (each admin action once, audited)
        purge   committed -> purged (soft: resolve stops serving it; restores in flight finish)
        gc      after the grace: purged versions' rows and unreferenced blobs, packs and items deleted;
                expired pending versions and their uploads (incoming) too
    Scheduler   in the service: LRU eviction to a byte budget, then GC, one runner across replicas
    store_lock  taken by publish and the remote cache, so GC never deletes what they are about to name

``collect`` holds purge and GC themselves, ``locks`` the store lock; ``audit`` the records.
"""
from .actions import create_token, gc, list_tokens, purge, revoke_token
from .audit import ACTIONS as AUDIT_ACTIONS, cli_actor, listing as audit_listing, record as audit_record, request_actor
from .locks import store_lock
from .scheduler import Scheduler

__all__ = ["AUDIT_ACTIONS", "Scheduler", "audit_listing", "audit_record", "cli_actor", "create_token", "gc", "list_tokens", "purge",
           "request_actor", "revoke_token", "store_lock"]
