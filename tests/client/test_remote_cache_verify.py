"""Issue 15, item 3 (client): what the live remote cache hands Inductor is what was PUT.

The service sends the value's sha256 as PUT (``X-Cachesvc-Sha256``); the
client reads the body up to ``max_bytes``, hashes it and answers a miss
(None to Inductor), logged once and counted in ``stats.rejected``, when the
body does not hash to it, the header is missing, or the body is too large.
Against the real service (in a thread) over local storage and rclone S3,
with the stored object replaced behind the service's back; and against a
proxy that changes the service's answer on the way (a service that lies).
"""
from __future__ import annotations

import logging
import time

import pytest
import zstandard

import cachesvc_client
from cachesvc.storage import blob_key
from cachesvc_client import remote_cache
from tests.helpers import ENV, sha
from tests.helpers.remote_cache import _undo_hook, database_url  # noqa: F401 - fixtures: sqlite, unhook
from tests.reliability.http_faults import FaultyHTTP

pytestmark = pytest.mark.backends("storage")  # remote-cache values replaced in each backend's storage

torch = pytest.importorskip("torch")


def replace_stored(live_server, value: bytes, other: bytes, tmp_path) -> None:
    """Put ``other`` where the service keeps ``value`` (someone with write access to the bucket)."""
    body = tmp_path / "other"
    body.write_bytes(zstandard.ZstdCompressor().compress(other))
    live_server.app.extensions["cachesvc"].storage.put_file(blob_key(sha(value), "zstd"), str(body))


def test_a_value_changed_in_storage_never_reaches_inductor(live_server, tokens, tmp_path, caplog):
    from torch._inductor.codecache import FxGraphCache

    status = cachesvc_client.enable_remote_cache(live_server.url, tokens["write"], env=ENV)
    cache = FxGraphCache.get_remote_cache()  # Inductor's own call, as at every compile
    good, evil = {"data": "R09PRA==", "time_taken_ms": 5}, {"data": "RVZJTA==", "time_taken_ms": 5}
    cache.put("fgraphkey", good)
    assert cache.get("fgraphkey") == good
    backend = status.enabled["fx-graph"]
    stored = backend.session.get(backend.base + "pt2:fx-graph-v1::fgraphkey:c1", params=backend.params).content
    replace_stored(live_server, stored, stored.replace(b"R09PRA==", b"RVZJTA=="), tmp_path)
    with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
        assert cache.get("fgraphkey") is None  # a miss: Inductor compiles, never loads the changed graph
        assert cache.get("fgraphkey") is None
    stats = status.stats()["fx-graph"]
    assert stats["hits"] == 1 and stats["errors"] == 0, stats
    # Refused by this client, or (a service that checks what it serves as well) never served: a miss.
    assert stats["rejected"] == 2 or stats["misses"] == 2, stats
    if stats["rejected"]:
        warned = [r.getMessage() for r in caplog.records if "hashes to" in r.getMessage()]
        assert len(warned) == 1 and "treated as a miss" in warned[0], warned
    assert cache.get("otherkey") is None and evil != good


@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
@pytest.mark.parametrize("lie", ["other body", "no header", "bad header"])
def test_the_client_refuses_an_answer_that_does_not_hash_to_its_header(live_server, tokens, lie, caplog):
    def rewrite(path, status, headers, body):
        if status == 200 and "/remote-cache/" in path:
            if lie == "other body":
                body = body[:-1] + b"!"
            headers = {k: v for k, v in headers.items() if k.lower() != "x-cachesvc-sha256"}
            if lie == "bad header":
                headers["X-Cachesvc-Sha256"] = "not-a-digest"
            elif lie == "other body":
                headers["X-Cachesvc-Sha256"] = sha(body[:-1] + b"x")
        return status, headers, body

    writer = remote_cache.HTTPBackend(live_server.url, "fx-graph", ENV, token=tokens["write"])
    writer.put("k", b"value " * 100)
    with FaultyHTTP(live_server.port, rewrite=rewrite) as proxy:
        reader = remote_cache.HTTPBackend(proxy.url, "fx-graph", ENV, token=tokens["read"], cooldown=0)
        with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
            assert reader.get("k") is None and reader.get("k") is None
    assert reader.stats.to_dict() == {"hits": 0, "misses": 0, "puts": 0, "errors": 0, "skipped": 0, "rejected": 2}
    assert sum("treated as a miss" in r.getMessage() for r in caplog.records) == 1, "logged once"
    assert writer.get("k") == b"value " * 100  # the service's own answer is fine


@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
def test_a_value_over_the_clients_limit_is_refused_unread(live_server, tokens):
    writer = remote_cache.HTTPBackend(live_server.url, "fx-graph", ENV, token=tokens["write"])
    writer.put("big", b"x" * 5000)
    small = remote_cache.HTTPBackend(live_server.url, "fx-graph", ENV, token=tokens["read"], max_bytes=4999)
    assert small.get("big") is None and small.stats.rejected == 1 and small.stats.hits == 0
    roomy = remote_cache.HTTPBackend(live_server.url, "fx-graph", ENV, token=tokens["read"], max_bytes=5000)
    assert roomy.get("big") == b"x" * 5000 and roomy.stats.hits == 1


@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
@pytest.mark.parametrize("how", ["trickle-body", "trickle-headers"])
def test_a_slow_remote_cache_costs_at_most_its_timeout(live_server, tokens, how):
    writer = remote_cache.HTTPBackend(live_server.url, "fx-graph", ENV, token=tokens["write"])
    writer.put("k", b"v" * 200)
    with FaultyHTTP(live_server.port, fault=lambda path: how, delay=0.2) as proxy:
        slow = remote_cache.HTTPBackend(proxy.url, "fx-graph", ENV, token=tokens["read"], timeout=1.0)
        started = time.monotonic()
        assert slow.get("k") is None
        elapsed = time.monotonic() - started
    assert slow.stats.errors == 1 and slow.stats.hits == 0
    assert elapsed < 1.0 + 2.0, elapsed  # the bound, with slack for a loaded machine
