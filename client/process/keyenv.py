"""The environment a key is made with: an env file, the ``CACHESVC_ENV_<FIELD>`` overrides, or the probes.

A process without torch or without a GPU (an init container, a sidecar) reads
``torch none`` or ``device x86_64`` and so computes another key than the app it
prepares. The app image writes its environment once, at image build:

    cachesvc-client env --json > /etc/cachesvc/env.json

and the torch-less process restores with it (``--env-file``, ``$CACHESVC_ENV_FILE``,
``CacheClient(env_file=...)`` or ``restore(env=load_env_file(path))``).

Precedence, per field: ``CACHESVC_ENV_<FIELD>`` (non-empty), then the env file,
then what this process reads (``fingerprint.environment()``). The file is the
JSON object ``cachesvc-client env --json`` prints: exactly the six fields of
``keys.ENV_FIELDS``, each a string that passes ``keys.check_env``. Anything else
is refused whole, naming the file and the field (``EnvError``).

Stdlib only.
"""
from __future__ import annotations

import json
import os
import shlex
import stat
import sys
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from .. import settings
from ..settings import ENV_FILE_VAR  # noqa: F401 - public here too (the variable naming the env file)
from ..shared import keys
from .fingerprint import OVERRIDE_PREFIX, environment

#: an env file is six short fields; anything this large is not one
MAX_ENV_FILE_BYTES = 64 * 1024
#: an env file is one flat object: this many brackets already is not one (and json.loads would recurse)
MAX_ENV_NESTING = 32
_HOW_TO_WRITE = "write it with `cachesvc-client env --json > FILE` in the app image"


class EnvError(keys.InvalidKey):
    """The key's environment cannot be used: a bad env file or a bad ``CACHESVC_ENV_<FIELD>``.
    The message names the file or the variable, and the field."""

    @property
    def message(self) -> str:  # as CacheClientError has it, for the callers that log either
        return str(self)


def env_file_from_environ() -> Optional[str]:
    """``$CACHESVC_ENV_FILE``, or None when unset or empty."""
    return settings.current().env_file


def _read_regular_file(path: str) -> bytes:
    """The bytes of the regular file at ``path``, at most MAX_ENV_FILE_BYTES (EnvError otherwise).

    Opened non-blocking and checked with fstat before any read: a FIFO (or a device, a socket) as
    env file would block the read, and a restore's budget with it, until something writes to it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise EnvError(f"env file {path}: cannot be read ({exc.strerror or exc}); {_HOW_TO_WRITE}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise EnvError(f"env file {path}: not a regular file (a FIFO, a device or a directory); {_HOW_TO_WRITE}")
        if st.st_size > MAX_ENV_FILE_BYTES:
            raise EnvError(f"env file {path}: larger than {MAX_ENV_FILE_BYTES} bytes; it is not an env file "
                           f"({_HOW_TO_WRITE})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_ENV_FILE_BYTES + 1)
    except OSError as exc:
        raise EnvError(f"env file {path}: cannot be read ({exc.strerror or exc}); {_HOW_TO_WRITE}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_ENV_FILE_BYTES:  # it grew since the fstat
        raise EnvError(f"env file {path}: larger than {MAX_ENV_FILE_BYTES} bytes; it is not an env file "
                       f"({_HOW_TO_WRITE})")
    return raw


def load_env_file(path: str) -> Dict[str, str]:
    """The environment in the env file at ``path`` (as ``cachesvc-client env --json`` wrote it), validated.

    Returns the six fields. Raises EnvError naming ``path`` and the field: unreadable, not JSON,
    not an object, a field missing or unknown, a value that is not a valid key string. The
    ``CACHESVC_ENV_<FIELD>`` overrides are not applied here (``key_environment`` does that).
    """
    raw = _read_regular_file(path)
    if max(raw.count(b"["), raw.count(b"{")) > MAX_ENV_NESTING:
        raise EnvError(f"env file {path}: nested too deeply for an object of six strings; {_HOW_TO_WRITE}")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise EnvError(f"env file {path}: not JSON ({exc}); {_HOW_TO_WRITE}") from None
    if not isinstance(doc, dict):
        raise EnvError(f"env file {path}: must be a JSON object of the fields {', '.join(keys.ENV_FIELDS)}, "
                       f"got {type(doc).__name__}; {_HOW_TO_WRITE}")
    try:
        return keys.check_env(doc)
    except keys.InvalidKey as exc:
        raise EnvError(f"env file {path}: {exc}") from None


def overrides() -> Dict[str, str]:
    """field -> value of the ``CACHESVC_ENV_<FIELD>`` variables that are set and non-empty."""
    return dict(settings.current().env_overrides)


def check(env: Dict[str, str], env_file: Optional[str] = None) -> Dict[str, str]:
    """``env`` validated by the key rules (``keys.check_env``); EnvError names where a bad field came from:
    its ``CACHESVC_ENV_<FIELD>`` variable, else the env file, else this machine's probe."""
    try:
        return keys.check_env(env)
    except keys.InvalidKey as whole:
        set_here = overrides()
        for field in keys.ENV_FIELDS:
            alone = {f: env.get(f, "x") if f == field else "x" for f in keys.ENV_FIELDS}
            try:
                keys.check_env(alone)
            except keys.InvalidKey as exc:
                where = (f"${OVERRIDE_PREFIX}{field.upper()}" if field in set_here
                         else f"env file {env_file}" if env_file else "this machine's environment")
                raise EnvError(f"{where}: {exc}") from None
        raise EnvError(str(whole)) from None


def key_environment(env_file: Optional[str], probe: Callable[[], Optional[Dict[str, str]]]
                    ) -> Tuple[Optional[Dict[str, str]], Optional[str]]:
    """(the key's environment, the env file it came from or None).

    With ``env_file``: that file, with the ``CACHESVC_ENV_<FIELD>`` overrides on top. Without:
    ``probe()`` (which applies the overrides itself); a probe that returns None (``envfiles``
    cannot tell without torch) gives None. Raises EnvError (see ``check``).
    """
    if env_file:
        return check({**load_env_file(env_file), **overrides()}, env_file), env_file
    env = probe()
    return (None if env is None else check(env)), None


def disagreement(env: Dict[str, str], env_file: Optional[str]) -> Optional[str]:
    """A warning when the key's environment came from ``env_file`` but this process, torch loaded,
    reads another one (the file was written elsewhere, or the process runs elsewhere); None otherwise.
    Only asked once torch is imported, so it costs nothing and never imports torch."""
    if not env_file or "torch" not in sys.modules:
        return None
    here = environment()
    differs = [f for f in keys.ENV_FIELDS if here.get(f) != env.get(f)]
    if not differs:
        return None
    shown = ", ".join(f"{f} {env.get(f)!r} (this process: {here.get(f)!r})" for f in differs)
    return (f"the key's environment comes from {env_file}, which says {shown}: processes that read their own "
            f"environment will not find this version. Write the env file where the app runs "
            f"(`cachesvc-client env --json`), or set CACHESVC_ENV_<FIELD> for what it cannot read there")


# -- what a process without torch or a GPU cannot read ------------------------------------------

_GPU_ARCHES = ("sm_", "gfx")
_NO_TORCH, _NO_GPU = "torch is not installed", "no GPU is visible"


def _unread(field: str, env: Mapping[str, str], entry_arch: str) -> str:
    """Why ``field`` of ``env`` is not what the app reads ("" when it was read and differs for real)."""
    no_torch = env.get("torch") == "none"
    gpu_there, gpu_here = entry_arch.startswith(_GPU_ARCHES), env.get("arch", "").startswith(_GPU_ARCHES)
    if field in ("torch", "triton", "cuda") and no_torch:
        return _NO_TORCH
    if field in ("device", "arch") and gpu_there and not gpu_here:
        return _NO_GPU
    if field == "arch" and no_torch and not gpu_there:  # guessed from /proc/cpuinfo; torch has its own rule
        return _NO_TORCH
    return ""


def unreadable_hint(env: Mapping[str, str], env_file: Optional[str], nearest: List[dict]) -> Optional[str]:
    """On a miss: when the nearest entry differs from this key only in fields this process could not
    read (no torch: torch, triton, cuda, arch; no GPU: device, arch), say so and how to fix it; else None.

    ``nearest`` is the service's ``nearest`` list (``[{entry, version_id, differs: [{field, wanted, have}]}]``).
    """
    if not env or not nearest or not nearest[0].get("differs"):
        return None
    differs, entry = nearest[0]["differs"], nearest[0].get("entry", {})
    theirs = {d["field"]: d["have"] for d in differs}
    reasons = {d["field"]: _unread(d["field"], env, theirs.get("arch", env.get("arch", ""))) for d in differs}
    if not all(reasons.values()):
        return None
    groups = [(why, [f for f in keys.ENV_FIELDS if reasons.get(f) == why]) for why in (_NO_TORCH, _NO_GPU)]
    said = " and ".join(f"{', '.join(fields)} ({why} {'there' if env_file else 'here'})"
                        for why, fields in groups if fields)
    shown = ", ".join(f"{d['field']} {d['wanted']!r} != {d['have']!r}" for d in differs)
    gpu = [f"{OVERRIDE_PREFIX}{f.upper()}={shlex.quote(theirs[f])}" for f in ("device", "arch")
           if reasons.get(f) == _NO_GPU]
    gpu_fix = (f"; where that build has no GPU, set {' '.join(gpu)} (entry {entry.get('id')}'s) for it" if gpu else "")
    if env_file:
        return (f"the env file {env_file} was written where it could not read {said}: this key differs from "
                f"entry {entry.get('id')} only in those ({shown}). Write it again in the app image with "
                f"`cachesvc-client env --json > {env_file}`{gpu_fix}")
    return (f"this container could not read {said}, so its key differs from entry {entry.get('id')} only in "
            f"those ({shown}). Restore with the app's environment: run `cachesvc-client env --json > env.json` in "
            f"the app image (where torch and the GPU are) and pass `--env-file env.json` (or set "
            f"{ENV_FILE_VAR}){gpu_fix}")


def write_warnings(env: Mapping[str, str]) -> List[str]:
    """What is wrong with writing ``env`` (this process's) as an env file for the app: read without torch,
    or a CUDA/ROCm build of torch with no GPU visible (the app on its GPU reads another device and arch)."""
    out = []
    if env.get("torch") == "none":
        out.append("torch is not installed here, so the file says torch none (and triton, cuda, arch as read "
                   "without it): run `cachesvc-client env --json` in the app image, where torch is")
    elif env.get("cuda", "none") != "none" and not env.get("arch", "").startswith(_GPU_ARCHES):
        out.append(f"torch here is a GPU build ({env['cuda']}) but no GPU is visible, so the file says device "
                   f"{env.get('device')!r}, arch {env.get('arch')!r}; the app on its GPU reads the GPU's name and "
                   f"sm_XY. Set {OVERRIDE_PREFIX}DEVICE and {OVERRIDE_PREFIX}ARCH to the GPU's values (e.g. "
                   f"{OVERRIDE_PREFIX}DEVICE='NVIDIA H200' {OVERRIDE_PREFIX}ARCH=sm_90) when writing it, or write it "
                   f"on a GPU node (unless the app runs on the CPU)")
    return out


__all__ = ["ENV_FILE_VAR", "EnvError", "check", "disagreement", "env_file_from_environ", "key_environment",
           "load_env_file", "overrides", "unreadable_hint", "write_warnings"]
