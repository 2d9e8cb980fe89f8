"""The client's settings: every ``CACHESVC_*`` variable, and the cache folders of the tools it restores
for, read from the environment in this one place into one frozen object.

    from cachesvc_client import settings
    s = settings.current()          # Settings: s.url, s.token, s.require_hit, s.extra_roots, ...

The variables (what each does is said where it is used, and in docs/client.md):

    CACHESVC_URL, CACHESVC_TOKEN        the service and its bearer token (CacheClient, the remote cache)
    CACHESVC_ENV_FILE                   the key's environment from this file (process/keyenv.py)
    CACHESVC_ENV_<FIELD>                one field of the key's environment forced (process/fingerprint.py)
    CACHESVC_TRUSTED_KEYS               restore only versions signed by one of these keys (shared/signing.py)
    CACHESVC_SIGNING_KEY                sign what this process publishes (publish/snapshot.py)
    CACHESVC_REQUIRE_HIT                a miss raises (restore/outcome.py)
    CACHESVC_MIN_COMPILE_SECONDS        publish admission (CacheClient.publish)
    CACHESVC_EXTRA_ROOTS                more roots to publish and restore (process/roots.py)
    CACHESVC_PUBLISH_AT_EXIT_S          how long an exiting process waits for the one call's publish
    CACHESVC_COMPILE_ROUTE              force the one call's route (aoti | torch)
    CACHESVC_TORCH_FIXES                0: no torch workarounds (process/torch_fixes.py)
    CACHESVC_USAGE                      0: the one call does not report the shapes it served (usage/)
    CACHESVC_USAGE_INTERVAL_S           seconds between usage reports (usage/reporter.py)
    CACHESVC_USAGE_AT_EXIT_S            how long an exiting process waits for its last usage report
    CACHESVC_LEARNED_PACKAGES           how many packages of learned shapes the one call fetches (0: none)
    CACHESVC_GC_HOLD                    0: the one call does not hold the full collections (process/collector.py)
    CACHESVC_LIBRARY_WARMUP             0: a hit does not ready cuDNN beside the proof (one_call/libraries.py)
    CACHESVC_PROOF_PINS                 0: the proof's trees pin no tensors; the binding walks the slots (proof/pins.py)

and, in ``tool_env``, the variables by which torch, Triton, vLLM, FlashInfer, DeepGEMM and the CUDA driver
place their caches (``TOOL_VARS``), read by ``process/roots.py`` with each tool's own rule.

Why a function and not a module constant: the environment changes under a running client (a test's
``monkeypatch.setenv``, a subprocess's ``env=``, ``CacheClient`` itself setting ``TORCHINDUCTOR_CACHE_DIR``
after a restore), and every reader must see what is set now, as the scattered ``os.environ.get`` calls
did. So ``current()`` builds the object once and keeps it while the variables it was read from are
unchanged (comparing them costs a pass over ``os.environ``); ``reload()`` drops it.

Standard library only (and the shared rules): every room of the client may import it. Variables that
are another program's settings mirrored where they act (torch's ``TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE``
in publish's keying warnings and the temp-dir variables of its ``host_default``, ``ATEN_CPU_CAPABILITY``
and ``CUDA_VISIBLE_DEVICES`` in process/envfiles.py, requests' CA bundle in transport/session.py) and the
model's own variables the one call's proof records stay read where they are. So does
``process/fingerprint.py``'s ``CACHESVC_ENV_<FIELD>``: that file also runs on its own, loaded by path in a
Python without the package, and imports nothing of the client (``env_overrides`` follows its rule).
"""
from __future__ import annotations

import dataclasses
import os
import threading
from types import MappingProxyType
from typing import Mapping, Optional, Tuple

from .shared import keys
from .shared.signing import SIGNING_KEY_VAR, TRUSTED_KEYS_VAR

URL_VAR = "CACHESVC_URL"
TOKEN_VAR = "CACHESVC_TOKEN"
#: names the env file when neither ``--env-file`` nor ``env_file=`` does
ENV_FILE_VAR = "CACHESVC_ENV_FILE"
#: ``CACHESVC_ENV_<FIELD>`` overrides a field (e.g. CACHESVC_ENV_DEVICE=H100)
OVERRIDE_PREFIX = "CACHESVC_ENV_"
#: a miss is an error when this is 1, true or yes (CacheClient.restore, `cachesvc-client restore`, the one call)
REQUIRE_HIT_VAR = "CACHESVC_REQUIRE_HIT"
MIN_COMPILE_SECONDS_VAR = "CACHESVC_MIN_COMPILE_SECONDS"
EXTRA_ROOTS_VAR = "CACHESVC_EXTRA_ROOTS"
PUBLISH_AT_EXIT_VAR = "CACHESVC_PUBLISH_AT_EXIT_S"
COMPILE_ROUTE_VAR = "CACHESVC_COMPILE_ROUTE"  # aoti | torch: force a route (benchmarks, debugging)
TORCH_FIXES_VAR = "CACHESVC_TORCH_FIXES"
USAGE_VAR = "CACHESVC_USAGE"
USAGE_INTERVAL_VAR = "CACHESVC_USAGE_INTERVAL_S"
USAGE_AT_EXIT_VAR = "CACHESVC_USAGE_AT_EXIT_S"
LEARNED_PACKAGES_VAR = "CACHESVC_LEARNED_PACKAGES"
GC_HOLD_VAR = "CACHESVC_GC_HOLD"
LIBRARY_WARMUP_VAR = "CACHESVC_LIBRARY_WARMUP"
PROOF_PINS_VAR = "CACHESVC_PROOF_PINS"

#: the other tools' cache-folder variables (process/roots.py mirrors how each tool reads its own)
TOOL_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_HOME", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT",
             "TORCH_EXTENSIONS_DIR", "FLASHINFER_WORKSPACE_BASE", "DG_JIT_CACHE_DIR", "HOME", "CUDA_CACHE_PATH")

__all__ = ["Settings", "current", "read", "reload", "TOOL_VARS", "URL_VAR", "TOKEN_VAR", "ENV_FILE_VAR",
           "OVERRIDE_PREFIX", "TRUSTED_KEYS_VAR", "SIGNING_KEY_VAR", "REQUIRE_HIT_VAR", "MIN_COMPILE_SECONDS_VAR",
           "EXTRA_ROOTS_VAR", "PUBLISH_AT_EXIT_VAR", "COMPILE_ROUTE_VAR", "TORCH_FIXES_VAR", "USAGE_VAR",
           "USAGE_INTERVAL_VAR", "USAGE_AT_EXIT_VAR", "LEARNED_PACKAGES_VAR", "GC_HOLD_VAR",
           "LIBRARY_WARMUP_VAR", "PROOF_PINS_VAR"]


@dataclasses.dataclass(frozen=True)
class Settings:
    """The client's settings as the environment had them when read. Values are kept as set (a number is
    parsed where it is used, so a bad one fails there, naming its variable, as before)."""

    url: str = ""                                  # CACHESVC_URL ("" when unset)
    token: Optional[str] = None                    # CACHESVC_TOKEN (None when unset or empty)
    env_file: Optional[str] = None                 # CACHESVC_ENV_FILE (None when unset or empty)
    #: field -> value of the CACHESVC_ENV_<FIELD> variables that are set and non-empty
    env_overrides: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    trusted_keys: Optional[str] = None             # CACHESVC_TRUSTED_KEYS (None when unset or empty)
    signing_key: Optional[str] = None              # CACHESVC_SIGNING_KEY (None when unset or empty)
    require_hit: bool = False                      # CACHESVC_REQUIRE_HIT is 1, true or yes (any case)
    min_compile_seconds: str = ""                  # CACHESVC_MIN_COMPILE_SECONDS as set
    extra_roots: str = ""                          # CACHESVC_EXTRA_ROOTS as set
    publish_at_exit: Optional[str] = None          # CACHESVC_PUBLISH_AT_EXIT_S as set (None when unset)
    compile_route: str = ""                        # CACHESVC_COMPILE_ROUTE, stripped
    torch_fixes: bool = True                       # False only for CACHESVC_TORCH_FIXES=0
    usage: bool = True                             # False only for CACHESVC_USAGE=0
    usage_interval: Optional[str] = None           # CACHESVC_USAGE_INTERVAL_S as set (None when unset)
    usage_at_exit: Optional[str] = None            # CACHESVC_USAGE_AT_EXIT_S as set (None when unset)
    learned_packages: Optional[str] = None         # CACHESVC_LEARNED_PACKAGES as set (None when unset)
    gc_hold: bool = True                           # False only for CACHESVC_GC_HOLD=0
    library_warmup: bool = True                    # False only for CACHESVC_LIBRARY_WARMUP=0
    proof_pins: bool = True                        # False only for CACHESVC_PROOF_PINS=0
    #: the TOOL_VARS that are set (an empty value included: some tools count it as set)
    tool_env: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def tool(self, name: str, default: Optional[str] = None) -> Optional[str]:
        """A tool's variable (one of TOOL_VARS) as ``os.environ.get(name, default)`` gave it."""
        return self.tool_env.get(name, default)


def read(environ: Optional[Mapping[str, str]] = None) -> Settings:
    """Settings from ``environ`` (default ``os.environ``), read now."""
    env = os.environ if environ is None else environ
    return Settings(
        url=env.get(URL_VAR, ""),
        token=env.get(TOKEN_VAR) or None,
        env_file=env.get(ENV_FILE_VAR) or None,
        env_overrides=MappingProxyType({f: env[OVERRIDE_PREFIX + f.upper()] for f in keys.ENV_FIELDS
                                        if env.get(OVERRIDE_PREFIX + f.upper())}),
        trusted_keys=env.get(TRUSTED_KEYS_VAR) or None,
        signing_key=env.get(SIGNING_KEY_VAR) or None,
        require_hit=env.get(REQUIRE_HIT_VAR, "").strip().lower() in ("1", "true", "yes"),
        min_compile_seconds=env.get(MIN_COMPILE_SECONDS_VAR, ""),
        extra_roots=env.get(EXTRA_ROOTS_VAR, ""),
        publish_at_exit=env.get(PUBLISH_AT_EXIT_VAR),
        compile_route=env.get(COMPILE_ROUTE_VAR, "").strip(),
        torch_fixes=env.get(TORCH_FIXES_VAR, "1") != "0",
        usage=env.get(USAGE_VAR, "1") != "0",
        usage_interval=env.get(USAGE_INTERVAL_VAR),
        usage_at_exit=env.get(USAGE_AT_EXIT_VAR),
        learned_packages=env.get(LEARNED_PACKAGES_VAR),
        gc_hold=env.get(GC_HOLD_VAR, "1") != "0",
        library_warmup=env.get(LIBRARY_WARMUP_VAR, "1") != "0",
        proof_pins=env.get(PROOF_PINS_VAR, "1") != "0",
        tool_env=MappingProxyType({name: env[name] for name in TOOL_VARS if name in env}),
    )


_lock = threading.Lock()
_cached: Optional[Tuple[tuple, Settings]] = None


def _read_from() -> tuple:
    """The variables Settings is made of, as they are now: what decides whether the cached one still holds."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("CACHESVC_") or k in TOOL_VARS))


def current() -> Settings:
    """This process's settings: read once, and again whenever one of their variables changed."""
    global _cached
    seen = _read_from()
    cached = _cached
    if cached is not None and cached[0] == seen:
        return cached[1]
    with _lock:
        _cached = (seen, read())
        return _cached[1]


def reload() -> Settings:
    """Read the settings again now (tests, or a process that changed its environment)."""
    global _cached
    with _lock:
        _cached = None
    return current()
