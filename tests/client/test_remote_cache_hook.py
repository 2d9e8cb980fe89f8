"""The live remote-cache hook into Inductor, pinned on the installed torch, and its fail-safe.

The pin tests run on whatever torch is installed (2.13 here; the lead runs them on the H200 with
2.11): they go through Inductor's own entry points (``FxGraphCache.get_remote_cache``,
``create_cache`` with the class names Inductor passes) and fail when a torch upgrade moves the seam.
"""
from __future__ import annotations

import json
import logging
import socket

import pytest

import cachesvc_client
from cachesvc_client.shared import keys
from cachesvc_client import remote_cache
from tests.helpers import ENV, set_settings
from tests.helpers.remote_cache import _undo_hook, database_url  # noqa: F401 - fixtures: sqlite, unhook

torch = pytest.importorskip("torch")


@pytest.fixture
def storage_settings(local_storage_settings):
    return local_storage_settings


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once the socket closes


def test_the_hook_exists_in_the_installed_torch():
    problems = {cache: remote_cache.check_hook(cache) for cache in remote_cache.CACHES}
    assert problems == {cache: None for cache in remote_cache.CACHES}, (torch.__version__, problems)
    assert set(remote_cache.CACHES) == set(keys.REMOTE_CACHES)  # the names the service's metrics know


def test_inductor_fx_graph_cache_goes_through_cachesvc(live_server, tokens):
    from torch._inductor import config
    from torch._inductor.codecache import FxGraphCache
    from torch._inductor.utils import should_use_remote_fx_graph_cache

    status = cachesvc_client.enable_remote_cache(live_server.url, tokens["write"], env=ENV)
    assert set(status.enabled) == set(remote_cache.DEFAULT_CACHES) and not status.local_only
    assert should_use_remote_fx_graph_cache() and config.autotune_remote_cache
    cache = FxGraphCache.get_remote_cache()  # Inductor's own call, as at every compile
    assert cache is not None and cache.backend is status.enabled["fx-graph"]
    assert cache.get("fgraphkey") is None
    value = {"data": "QUJD", "time_taken_ms": 5}
    cache.put("fgraphkey", value)
    assert FxGraphCache.get_remote_cache().get("fgraphkey") == value
    assert status.stats()["fx-graph"] == {"hits": 1, "misses": 1, "puts": 1, "errors": 0, "skipped": 0, "rejected": 0}
    # Inductor's key reaches the service unchanged: another client reads it by that key
    raw = live_server.app.test_client().get("/api/v1/remote-cache/fx-graph/pt2:fx-graph-v1::fgraphkey:c1",
                                            query_string=ENV, headers={"Authorization": f"Bearer {tokens['read']}"})
    assert raw.status_code == 200 and json.loads(raw.data) == value


@pytest.mark.parametrize("cache,cache_id,cls_name", [  # the calls of autotune_cache.py and autograd_cache.py
    ("autotune", "0123abcd" * 8, "RemoteAutotuneCache"),
    ("bundled-autotune", "bundled-autotune-v1", "RemoteBundledAutotuneCache"),
    ("aot-autograd", "autograd-experimental", "RemoteAOTAutogradCache"),
])
def test_inductor_autotune_and_aot_autograd_caches_go_through_cachesvc(live_server, tokens, cache, cache_id,
                                                                        cls_name):
    from torch._inductor.remote_cache import create_cache

    status = cachesvc_client.enable_remote_cache(live_server.url, tokens["write"], env=ENV, caches=(cache,))
    made = create_cache(cache_id, False, "Fb" + cls_name, cls_name)
    assert made is not None and made.backend is status.enabled[cache]
    made.put("k1", {"XBLOCK": 64, "num_warps": 4})
    assert create_cache(cache_id, False, "Fb" + cls_name, cls_name).get("k1") == {"XBLOCK": 64, "num_warps": 4}


def test_disable_restores_inductor_as_it_was(live_server, tokens):
    from torch._inductor import config
    from torch._inductor.remote_cache import RemoteFxGraphCache

    before = (config.fx_graph_remote_cache, config.autotune_remote_cache)
    cachesvc_client.enable_remote_cache(live_server.url, tokens["write"], env=ENV)
    cachesvc_client.disable_remote_cache()
    assert (config.fx_graph_remote_cache, config.autotune_remote_cache) == before
    assert RemoteFxGraphCache.backend_override_cls is None


def test_a_missing_hook_warns_once_and_stays_local_only(monkeypatch, caplog, live_server, tokens):
    from torch._inductor import remote_cache as inductor_remote_cache

    monkeypatch.delattr(inductor_remote_cache.RemoteCache, "backend_override_cls")
    monkeypatch.delattr(inductor_remote_cache, "RemoteAutotuneCache")
    with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
        status = cachesvc_client.enable_remote_cache(live_server.url, tokens["write"], env=ENV)
    assert not status.enabled
    assert "backend_override_cls" in status.local_only["fx-graph"]
    assert "RemoteAutotuneCache is not a RemoteCache class" in status.local_only["autotune"]
    warned = [r.getMessage() for r in caplog.records if "stays local-only" in r.getMessage()]
    assert len(warned) == len(remote_cache.DEFAULT_CACHES)
    from torch._inductor import config

    assert not config.fx_graph_remote_cache, "the remote FX-graph cache must stay off (it would try Redis)"


@pytest.mark.parametrize("url,env,says", [
    (None, ENV, "CACHESVC_URL"),
    ("http://127.0.0.1:9", {**ENV, "torch": "2.13\x01"}, "CACHESVC_ENV_"),
])
def test_no_url_or_a_bad_fingerprint_enables_nothing_and_says_what_to_fix(monkeypatch, caplog, url, env, says):
    monkeypatch.delenv("CACHESVC_URL", raising=False)
    with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
        status = cachesvc_client.enable_remote_cache(url, env=env)
    assert not status.enabled and says in status.local_only["fx-graph"]
    assert any(says in r.getMessage() for r in caplog.records)


def test_an_unreachable_service_is_a_miss_then_a_quiet_cooldown(caplog):
    backend = remote_cache.HTTPBackend(closed_port_url(), "fx-graph", ENV, timeout=1.0, cooldown=60)
    with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
        assert backend.get("k") is None
        backend.put("k", b"v")
        assert backend.get("k") is None
    assert backend.stats.to_dict() == {"hits": 0, "misses": 0, "puts": 0, "errors": 1, "skipped": 2, "rejected": 0}
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "treated as a miss" in warned[0].getMessage()


def test_service_errors_are_misses_and_a_read_only_token_stops_puts(live_server, tokens, caplog):
    backend = remote_cache.HTTPBackend(live_server.url, "fx-graph", ENV, token=tokens["read"], cooldown=0)
    with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
        backend.put("k", b"v")
        backend.put("k2", b"v")
    assert backend.stats.puts == 0 and backend.stats.skipped == 0 and not backend._can_put
    assert sum("may read but not write" in r.getMessage() for r in caplog.records) == 1
    assert backend.get("k") is None and backend.stats.misses == 1
    bad = remote_cache.HTTPBackend(live_server.url, "fx-graph", ENV, token="cs_wrong", cooldown=0)
    assert bad.get("k") is None and bad.stats.errors == 1  # 401: an error, answered as a miss
    lost = remote_cache.HTTPBackend(live_server.url + "/healthz?", "fx-graph", ENV, cooldown=0)
    assert lost.get("k") is None and lost.stats.errors == 1  # a 200 that is not a value: an error, a miss


def test_keys_outside_the_service_rules_are_sent_hashed(live_server, tokens):
    backend = remote_cache.HTTPBackend(live_server.url, "fx-graph", ENV, token=tokens["write"])
    odd = "key with spaces/and slashes " + "x" * 600
    backend.put(odd, b"value")
    assert backend.stats.puts == 1 and backend.get(odd) == b"value"
    assert remote_cache.HTTPBackend.wire_key(odd).startswith("sha256-")
    assert remote_cache.HTTPBackend.wire_key("pt2:fx-graph-v1::abc:c1") == "pt2:fx-graph-v1::abc:c1"


def test_a_value_over_the_limit_stays_local_without_an_error(live_server, tokens):
    set_settings(live_server.app, REMOTE_CACHE_MAX_BYTES=100)
    backend = remote_cache.HTTPBackend(live_server.url, "fx-graph", ENV, token=tokens["write"])
    backend.put("big", b"x" * 101)
    assert backend.stats.to_dict() == {"hits": 0, "misses": 0, "puts": 0, "errors": 0, "skipped": 0, "rejected": 0}
    backend.put("small", b"x" * 100)
    assert backend.get("small") == b"x" * 100
