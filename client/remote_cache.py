"""cachesvc as Inductor's live remote cache (FX graphs, autotune results).

    import cachesvc_client
    cachesvc_client.enable_remote_cache()       # CACHESVC_URL, CACHESVC_TOKEN
    ... torch.compile(model)(x) ...             # a new shape: asks the fleet first

After this, every compile in the process asks cachesvc for the FX graph (and,
on GPU, the autotune result) before building it, and puts what it built, so a
process that compiles a shape mid-run finds it if any process of the fleet
compiled it before, with no restart and no restore.

**The hook.** Inductor picks its remote cache by class name
(``torch._inductor.remote_cache.create_cache(..., "RemoteFxGraphCache")``)
and has no registration API. Its ``RemoteCache`` classes do have one seam
meant for swapping the backend: the class attribute ``backend_override_cls``,
a zero-argument callable returning the byte-level backend, which
``RedisRemoteCache.__init__`` honours before it would touch Redis (torch's
own ``torch._inductor.mock_cache.PatchCaches`` uses it). We set it on
``RemoteFxGraphCache``, ``RemoteAOTAutogradCache`` and ``RemoteAutotuneCache``
(``RemoteBundledAutotuneCache`` on request: see ``DEFAULT_CACHES``) and
switch the matching config flags on. All
else stays Inductor's: when to look up, the key (``pt2:<cache id>::<key>:c1``)
and the JSON serde, so the bytes we move are the ones Redis would hold. We
take no private function and replace no class, so a torch that reshuffles its
internals but keeps the seam keeps working. ``check_hook`` feature-detects
every piece per cache; a missing one is logged once and that cache stays
local-only (``tests/client/test_remote_cache_hook.py`` pins the hook on the
installed torch: 2.13 here, 2.11 on the GPU machine).

**The layer.** The backend layer, bytes in and out (not the ``RemoteCache``
layer of JSON-able dicts): the seam hands us bytes there, Inductor keeps its
own key format and serde (so a torch that changes them changes both sides
at once), the service stores an opaque blob it never parses, and the bytes
are exactly what the Redis backend would store, so the two compare 1:1.

**Remote hits stay remote.** Inductor 2.13 writes an FX graph or AOTAutograd
entry to its local cache dir only when it compiled it, not when the remote
cache served it: keep the remote cache on in every process of the fleet,
and publish snapshots from processes that compiled.

**Never fails the process; checks what it hands Inductor**: see
``cachesvc_client.transport.remote``, the byte-level backend over HTTP.

In the compile worker processes Inductor starts for GPU kernels the hook is
not set; the autotune cache those workers create is rebuilt in this process
(Inductor pickles only its key), which works when the ``redis`` package is
importable there (Inductor builds a lazy Redis client that is never used).
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
from typing import Dict, Optional, Tuple

from . import settings
from .shared import keys
from .errors import CacheClientError
from .process.fingerprint import environment
from .transport.api import check_url
from .transport.remote import MAX_VALUE, SESSION_POOL, BackendStats, HTTPBackend  # noqa: F401 - public here too
from .transport.session import new_session

log = logging.getLogger("cachesvc_client.remote_cache")

#: our cache name -> (class in torch._inductor.remote_cache, config module, config flag that switches it on)
CACHES: Dict[str, Tuple[str, str, str]] = {
    "fx-graph": ("RemoteFxGraphCache", "torch._inductor.config", "fx_graph_remote_cache"),
    "autotune": ("RemoteAutotuneCache", "torch._inductor.config", "autotune_remote_cache"),
    "bundled-autotune": ("RemoteBundledAutotuneCache", "torch._inductor.config", "bundled_autotune_remote_cache"),
    "aot-autograd": ("RemoteAOTAutogradCache", "torch._functorch.config", "enable_remote_autograd_cache"),
}
#: bundled-autotune is opt-in: switched on, Inductor 2.13 asserts in AutotuneCacheBundler.begin_compile for a
#: graph without Triton kernels (a CPU graph has no backend hash), so the compile itself fails
DEFAULT_CACHES = ("fx-graph", "aot-autograd", "autotune")
_REMOTE_CACHE_MODULE = "torch._inductor.remote_cache"
# -- the hook -------------------------------------------------------------------------------

def check_hook(cache: str) -> Optional[str]:
    """Why the installed torch cannot take our backend for ``cache`` (None: it can)."""
    cls_name, config_module, flag = CACHES[cache]
    try:
        module = importlib.import_module(_REMOTE_CACHE_MODULE)
        config = importlib.import_module(config_module)
    except Exception as exc:  # torch missing or broken: never fail the process
        return f"cannot import {_REMOTE_CACHE_MODULE} or {config_module}: {type(exc).__name__}: {exc}"
    cls = getattr(module, cls_name, None)
    base = getattr(module, "RemoteCache", None)
    if not isinstance(cls, type) or not isinstance(base, type) or not issubclass(cls, base):
        return f"{_REMOTE_CACHE_MODULE}.{cls_name} is not a RemoteCache class in this torch"
    if not hasattr(cls, "backend_override_cls"):
        return f"{_REMOTE_CACHE_MODULE}.{cls_name} has no backend_override_cls in this torch"
    if not callable(getattr(module, "create_cache", None)):
        return f"{_REMOTE_CACHE_MODULE}.create_cache is missing in this torch"
    if not hasattr(config, flag):
        return f"{config_module}.{flag} is missing in this torch"
    return None


@dataclasses.dataclass
class RemoteCacheStatus:
    """What ``enable_remote_cache`` did: the caches now remote, and why the others stay local."""

    enabled: Dict[str, HTTPBackend] = dataclasses.field(default_factory=dict)
    local_only: Dict[str, str] = dataclasses.field(default_factory=dict)  # cache -> reason

    def stats(self) -> Dict[str, dict]:
        return {name: backend.stats.to_dict() for name, backend in self.enabled.items()}


class InductorHooks:
    """What this process changed in Inductor: per cache, the class attribute and config flag set, and
    their values before, so ``disable_remote_cache`` puts back exactly what was there.

    Inductor's classes and config flags are process-wide, so the record of what was changed in them
    is too: ``HOOKS`` is the one instance (the only module-level state of the client, with
    ``torch_fixes.FIXES`` and ``transport.deadlines``' watchdog, each for the same reason).
    Thread-safe.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self._saved: Dict[str, tuple] = {}  # cache -> (class, previous override, config module, flag, its value)

    def install(self, cache: str, backend: HTTPBackend) -> None:
        """Point Inductor's class for ``cache`` at ``backend`` and switch its flag on (the first state is
        saved). Call it holding ``lock``."""
        cls_name, config_module, flag = CACHES[cache]
        cls = getattr(importlib.import_module(_REMOTE_CACHE_MODULE), cls_name)
        config = importlib.import_module(config_module)
        if cache not in self._saved:
            self._saved[cache] = (cls, cls.__dict__.get("backend_override_cls"), config, flag, getattr(config, flag))
        cls.backend_override_cls = _backend_factory(backend)
        setattr(config, flag, True)

    def undo(self) -> None:
        """Inductor's classes and config flags as they were before the first ``install``."""
        with self.lock:
            for cls, override, config, flag, value in self._saved.values():
                if override is None:
                    if "backend_override_cls" in cls.__dict__:
                        delattr(cls, "backend_override_cls")
                else:
                    cls.backend_override_cls = override
                setattr(config, flag, value)
            self._saved.clear()


HOOKS = InductorHooks()


def _backend_factory(backend: HTTPBackend):
    def factory() -> HTTPBackend:  # Inductor calls it with no argument, once per cache object it makes
        return backend
    return factory


def enable_remote_cache(url: Optional[str] = None, token: Optional[str] = None, *,
                        caches: Tuple[str, ...] = DEFAULT_CACHES, timeout: float = 5.0, cooldown: float = 30.0,
                        env: Optional[Dict[str, str]] = None, max_bytes: int = MAX_VALUE) -> RemoteCacheStatus:
    """Make Inductor use cachesvc as its remote FX-graph and autotune cache in this process.

    Args:
        url: the service, default ``$CACHESVC_URL``. token: default ``$CACHESVC_TOKEN`` (read scope reads,
            write scope also puts).
        caches: which of ``CACHES`` to hook. timeout: seconds per request, in all. cooldown: seconds
            without requests after a failure. max_bytes: the largest value taken from the service.
        env: the environment fingerprint naming the namespace, default ``environment()``.

    Returns a RemoteCacheStatus. Never raises for a missing hook, a missing URL, a bad fingerprint or an
    unreachable service: it logs a warning and leaves those caches local-only. Call it before the first
    compile (Inductor makes its AOTAutograd remote cache once per process).
    Raises ValueError only for a cache name not in ``CACHES`` (a programming error).
    """
    unknown = [c for c in caches if c not in CACHES]
    if unknown:
        raise ValueError(f"unknown cache(s) {unknown}; known: {', '.join(CACHES)}")
    status = RemoteCacheStatus()
    given = settings.current()
    url = url or given.url
    token = token or given.token
    reason = "no service URL: pass url= or set CACHESVC_URL" if not url else None
    if reason is None:
        try:
            check_url(url)
        except CacheClientError as exc:
            reason = exc.message
    if reason is None:
        try:
            env = keys.check_env(env if env is not None else environment())
        except keys.InvalidKey as exc:
            reason = f"bad environment fingerprint ({exc}): fix CACHESVC_ENV_* or env="
    if reason is not None:
        status.local_only = dict.fromkeys(caches, reason)
        log.warning("cachesvc remote cache not enabled: %s", reason)
        return status
    session = new_session(SESSION_POOL, token)
    with HOOKS.lock:
        for cache in caches:
            problem = check_hook(cache)
            if problem is None:
                try:
                    backend = HTTPBackend(url, cache, env, token=token, timeout=timeout, cooldown=cooldown,
                                          session=session, max_bytes=max_bytes)
                    HOOKS.install(cache, backend)
                    status.enabled[cache] = backend
                except Exception as exc:  # a torch that refuses the attribute or the flag: never fail
                    problem = f"hooking failed: {type(exc).__name__}: {exc}"
            if problem is not None:
                status.local_only[cache] = problem
                log.warning("cachesvc remote cache %s stays local-only: %s", cache, problem)
    if status.enabled:
        log.info("cachesvc remote cache on for %s at %s", ", ".join(status.enabled), url)
    return status


def disable_remote_cache() -> None:
    """Undo ``enable_remote_cache``: Inductor's classes and config flags as they were."""
    HOOKS.undo()
