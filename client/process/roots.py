"""Snapshot roots: every folder a fresh process reads compile state from.

A *root* is a role (a name valid in any process) and the folder it maps to in
*this* process. Publish walks each root and records paths relative to it;
restore maps each role back to a folder with ``resolve_root`` in the
restoring process, under its own HOME, TMPDIR, user and cache dir. Nothing
here imports torch or triton: the locations are computed by replicating their
rules (torch 2.13, triton 3.x), so the restoring side can resolve roots
before torch is imported.

Roles (see ``resolve_root``):

``inductor``  Inductor's cache dir (``TORCHINDUCTOR_CACHE_DIR``): fxgraph/,
              aotautograd/, two-letter code dirs (.py/.cpp/.so), dynamo/ (PGO),
              triton/<device>/ (Inductor points TRITON_CACHE_DIR here), ...
``pch``       Precompiled C++ headers (~150 MB): always under torch's *default*
              cache dir ``<tempfile.gettempdir()>/torchinductor_<user>``, whatever
              TORCHINDUCTOR_CACHE_DIR says. Without it a fresh process rebuilds
              the PCH (~6 s on 2 cores) even on an fxgraph cache hit.
``memo``      Inductor's PersistentMemoizer on-disk store (``should_pad``
              decisions of pad_mm, GPU only), also under the default cache dir.
``triton``    Triton's own cache dir, for what Triton compiles before Inductor
              sets TRITON_CACHE_DIR (driver utils, launchers). Left out of
              ``default_roots`` when it lies inside the inductor root (publish
              still adds the driver helper the process loaded from it:
              ``driver_helpers``).
``nv``        The CUDA driver's JIT cache (PTX -> SASS).
``vllm``      vLLM's compile cache, ``<VLLM_CACHE_ROOT>/torch_compile_cache``: one
              ``<hash>/rank_<r>_<dp>/<prefix>/`` per compiled model (vllm_compile_cache.py,
              the graphs, ``inductor_cache/``, ``triton_cache/``) and, in current releases,
              ``torch_aot_compile/<hash>/`` (AOT artifacts, their ``inductor_cache/``).
``vllm_aot``  ``<VLLM_CACHE_ROOT>/torch_aot_compile``: where vLLM releases before that
              nesting kept the AOT artifacts (``<hash>/rank_<r>_<dp>/model``).

Extra roots (``extra_roots``): a deployment names more folders, published
and restored like the others, in ``$CACHESVC_EXTRA_ROOTS`` (``role=/folder``,
comma-separated) or ``extra_roots=``; these are known by name alone
(``known_extra_dir``), and a restore places them without being told:

``torch_extensions``  torch C++ extensions (``cpp_extension.load``/``load_inline``):
              ``$TORCH_EXTENSIONS_DIR``, else ``~/.cache/torch_extensions`` (its
              ``<py>_<cpu|cuXY>/<name>/`` build folders).
``flashinfer`` FlashInfer's JIT: ``${FLASHINFER_WORKSPACE_BASE:-~}/.cache/flashinfer``.
``deep_gemm``  DeepGEMM's JIT kernels: ``$DG_JIT_CACHE_DIR``, else ``$HOME/.deep_gemm``.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import getpass
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from .. import settings
from ..settings import EXTRA_ROOTS_VAR  # noqa: F401 - named here too, in the errors about extra roots
from ..shared.keys import InvalidKey, check_role

#: Every role this client knows, in publish order.
ROLES: Tuple[str, ...] = ("inductor", "pch", "memo", "triton", "nv", "vllm", "vllm_aot")
#: Extra roots known by name alone (``known_extra_dir``): published when named, restored whenever a version has them.
KNOWN_EXTRA: Tuple[str, ...] = ("torch_extensions", "flashinfer", "deep_gemm")
#: Roles whose folder every process of the user on the host shares (the default temp dir's
#: torchinductor_<user>, ~/.triton, ~/.nv): what they hold may be a neighbour's, so they travel
#: only beside files of the process's own roots (its cache dir, vLLM's), never alone.
SHARED_ROLES: Tuple[str, ...] = ("pch", "memo", "triton", "nv")


@dataclass(frozen=True)
class Root:
    """A snapshot root: ``role`` names it in any process, ``path`` is where it is in this one.

    ``exclude`` lists absolute folders inside ``path`` that belong to another
    root (e.g. ``pch`` inside ``inductor`` when TORCHINDUCTOR_CACHE_DIR is the
    default dir); walk them with ``walk(root.path, exclude=root.exclude)`` so
    no file is published under two roles.
    """

    role: str
    path: str
    exclude: Tuple[str, ...] = ()


# --------------------------------------------------------------------------
# Locations
# --------------------------------------------------------------------------


def _username() -> str:
    """Mirror of the user part of ``torch._inductor.runtime.cache_dir_utils.default_cache_dir``.

    getpass.getuser() reads LOGNAME, USER, LNAME, USERNAME (first non-empty),
    then the password database; torch falls back to ``uid_<uid>`` when that
    fails, and replaces characters that are invalid in Windows file names.
    """
    try:
        username = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        getuid = getattr(os, "getuid", None)
        username = f"uid_{getuid()}" if callable(getuid) else "unknown_user"
    return re.sub(r'[\\/:*?"<>|]', "_", username)


def default_cache_dir() -> str:
    """Torch's default Inductor cache dir: ``<tempfile.gettempdir()>/torchinductor_<user>``.

    Mirrors ``torch._inductor.runtime.cache_dir_utils.default_cache_dir`` (torch
    2.13; fbcode builds use /var/tmp instead, not handled). It ignores
    TORCHINDUCTOR_CACHE_DIR. tempfile.gettempdir() honours TMPDIR, TEMP, TMP
    (first that is a writable folder), else /tmp, /var/tmp, /usr/tmp, the cwd;
    Python caches the answer for the life of the process, as torch sees it.
    """
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + _username())


def inductor_cache_dir(cache_dir: Optional[str] = None) -> str:
    """Mirror of ``torch._inductor.runtime.cache_dir_utils.cache_dir`` (without its side effects).

    ``cache_dir`` given wins; else $TORCHINDUCTOR_CACHE_DIR; else ``default_cache_dir()``.
    """
    if not cache_dir:
        cache_dir = settings.current().tool("TORCHINDUCTOR_CACHE_DIR")
    if cache_dir is None:  # torch tests "is None": an empty variable means the cwd
        cache_dir = default_cache_dir()
    return os.path.abspath(cache_dir)


def triton_cache_dir() -> str:
    """Triton's cache dir as Triton resolves it (``triton.knobs.cache.dir`` / ``FileCacheManager``).

    TRITON_CACHE_DIR if set and not blank; else ``$TRITON_HOME/.triton/cache``
    where TRITON_HOME defaults to the home dir (``os.path.expanduser("~")``,
    i.e. $HOME, else the password database).
    """
    directory = settings.current().tool("TRITON_CACHE_DIR", "").strip()
    return os.path.abspath(directory) if directory else triton_home_dir()


def triton_home_dir() -> str:
    """Triton's own cache dir, whatever TRITON_CACHE_DIR says: ``$TRITON_HOME/.triton/cache``, else the home dir's."""
    home = settings.current().tool("TRITON_HOME") or os.path.expanduser("~")
    return os.path.abspath(os.path.join(home, ".triton", "cache"))


def vllm_cache_root() -> str:
    """Mirror of ``vllm.envs.VLLM_CACHE_ROOT``: ``$VLLM_CACHE_ROOT``, else ``$XDG_CACHE_HOME/vllm``,
    else ``~/.cache/vllm`` (user-expanded; vLLM reads the variables with ``os.getenv(name, default)``,
    so a variable set to "" counts as set)."""
    tool = settings.current().tool
    xdg = tool("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    return os.path.abspath(os.path.expanduser(tool("VLLM_CACHE_ROOT", os.path.join(xdg, "vllm"))))


def known_extra_dir(role: str) -> str:
    """The folder a known extra root (``KNOWN_EXTRA``) is in this process, by its tool's own rule."""
    home = os.path.expanduser("~")
    tool = settings.current().tool
    if role == "torch_extensions":
        # torch.utils.cpp_extension._get_build_directory: TORCH_EXTENSIONS_DIR as given (even ""), else
        # realpath(torch._appdirs.user_cache_dir("torch_extensions")) / "<py>_<accelerator>"; the root is that
        # parent, so every Python and accelerator's folder travels
        given = tool("TORCH_EXTENSIONS_DIR")
        if given is not None:
            return os.path.abspath(given)
        return os.path.realpath(os.path.join(tool("XDG_CACHE_HOME", os.path.join(home, ".cache")),
                                             "torch_extensions"))
    if role == "flashinfer":
        # flashinfer.jit.env: Path(os.getenv("FLASHINFER_WORKSPACE_BASE", Path.home())) / ".cache" / "flashinfer"
        return os.path.abspath(os.path.join(tool("FLASHINFER_WORKSPACE_BASE", home), ".cache", "flashinfer"))
    if role == "deep_gemm":
        # DeepGEMM's csrc/jit/compiler.hpp: $DG_JIT_CACHE_DIR when not empty, else $HOME/.deep_gemm
        return os.path.abspath(tool("DG_JIT_CACHE_DIR") or os.path.join(tool("HOME") or home, ".deep_gemm"))
    raise ValueError(f"{role!r} is not a known extra root; known: {', '.join(KNOWN_EXTRA)}")


def extra_roots(given: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """role -> absolute folder of this deployment's extra roots: ``$CACHESVC_EXTRA_ROOTS`` (``role=/folder`` or
    a ``KNOWN_EXTRA`` name alone, comma-separated), then ``given`` (the same as a mapping; "" or None: the
    known folder). A role must pass the role rule and not be a built-in one; a folder must be absolute (``~``
    expands). Raises InvalidKey naming the setting and the item."""
    spec: Dict[str, Optional[str]] = {}
    for item in settings.current().extra_roots.split(","):
        if item.strip():
            role, sep, folder = item.partition("=")
            spec[role.strip()] = folder.strip() if sep else None
    spec.update(given or {})
    out = {}
    for role, folder in spec.items():
        where = f"{EXTRA_ROOTS_VAR} / extra_roots: {role!r}"
        try:
            check_role(role)
        except InvalidKey as exc:
            raise InvalidKey(f"{where}: {exc}") from None
        if role in ROLES:
            raise InvalidKey(f"{where} is a built-in root; name extra roots only")
        if not folder:
            if role not in KNOWN_EXTRA:
                raise InvalidKey(f"{where} needs a folder (role=/folder); known by name alone: "
                                 f"{', '.join(KNOWN_EXTRA)}")
            folder = known_extra_dir(role)
        folder = os.path.expanduser(folder)
        if not os.path.isabs(folder):
            raise InvalidKey(f"{where}: its folder must be absolute, got {folder!r}")
        out[role] = os.path.abspath(folder)
    return out


def resolve_root(role: str, cache_dir: Optional[str] = None, extra: Optional[Mapping[str, str]] = None) -> str:
    """The absolute folder ``role`` maps to in this process. ValueError for an unknown role.

    ``cache_dir`` is the Inductor cache dir this process uses (None or ""
    means $TORCHINDUCTOR_CACHE_DIR, else torch's default). ``extra``: the extra roots (``extra_roots()``;
    None: read them now); a known extra root resolves even when not named.
    """
    if role == "inductor":
        return inductor_cache_dir(cache_dir)
    if role == "pch":
        # torch._inductor.codecache._HEADER_DIR, computed at import of codecache:
        #   os.path.join(default_cache_dir(), "precompiled_headers")
        # It deliberately uses default_cache_dir(), not cache_dir(), so the PCH
        # lives under TMPDIR even when TORCHINDUCTOR_CACHE_DIR points elsewhere.
        return os.path.abspath(os.path.join(default_cache_dir(), "precompiled_headers"))
    if role == "memo":
        # torch._inductor.runtime.caching.implementations._OnDiskCacheImpl._base_dir:
        #   Path(default_cache_dir(), "cache")  (also the default dir, not cache_dir())
        return os.path.abspath(os.path.join(default_cache_dir(), "cache"))
    if role == "triton":
        return triton_cache_dir()
    if role == "nv":
        # CUDA driver JIT cache: CUDA_CACHE_PATH, default ~/.nv/ComputeCache on Linux.
        path = settings.current().tool("CUDA_CACHE_PATH") or os.path.join(os.path.expanduser("~"), ".nv", "ComputeCache")
        return os.path.abspath(path)
    if role == "vllm":
        # vllm.compilation.backends.VllmBackend: os.path.join(envs.VLLM_CACHE_ROOT, "torch_compile_cache", hash)
        return os.path.join(vllm_cache_root(), "torch_compile_cache")
    if role == "vllm_aot":
        return os.path.join(vllm_cache_root(), "torch_aot_compile")
    named = extra_roots() if extra is None else extra
    if role in named:
        return named[role]
    if role in KNOWN_EXTRA:
        return known_extra_dir(role)
    raise ValueError(f"unknown root role {role!r}; known: {', '.join(ROLES + KNOWN_EXTRA)}; name it in "
                     f"{EXTRA_ROOTS_VAR} (role=/folder) to restore it")


def inside(path: str, parent: str) -> bool:
    """Whether ``path`` is ``parent`` or below it (lexically, after normalising)."""
    path, parent = os.path.normpath(path), os.path.normpath(parent)
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def with_exclusions(roots: Iterable[Root]) -> List[Root]:
    """Give each root an ``exclude`` of the other roots nested strictly inside it."""
    roots = list(roots)
    out = []
    for r in roots:
        nested = sorted({os.path.abspath(o.path) for o in roots
                         if o is not r and inside(o.path, r.path) and not inside(r.path, o.path)})
        out.append(Root(r.role, r.path, tuple(nested)))
    return out


def default_roots(cache_dir: Optional[str] = None, extra: Optional[Mapping[str, str]] = None) -> List[Root]:
    """The roots to snapshot for a process whose Inductor cache dir is ``cache_dir``.

    Every role of ``ROLES``, then the extra roots (``extra``; None: ``extra_roots()``, the setting), except
    ``triton`` when Triton's dir is the inductor root or inside it (Inductor's own triton/<device> dirs
    travel with that root), and except a role whose folder another role already names.
    Nested roots (``pch`` and ``memo`` sit inside the inductor root when
    TORCHINDUCTOR_CACHE_DIR is the default dir; an extra root inside another) are listed in the outer
    root's ``exclude``, so no file travels twice. Folders need not exist.
    """
    inductor = resolve_root("inductor", cache_dir)
    named = extra_roots() if extra is None else dict(extra)
    roots: List[Root] = []
    seen = set()
    for role in ROLES + tuple(sorted(named)):
        path = resolve_root(role, inductor, named)
        if role == "triton" and inside(path, inductor):
            continue
        if path in seen:
            continue
        seen.add(path)
        roots.append(Root(role, path))
    return with_exclusions(roots)


# --------------------------------------------------------------------------
# Junk
# --------------------------------------------------------------------------

# Folder names whose whole subtree is junk.
_JUNK_DIRS = frozenset({
    # Inductor lock folders: <cache>/locks (codecache.get_lock_dir) and
    # precompiled_headers/locks (_HEADER_LOCK_DIR). Only empty FileLock files;
    # recreated on demand (os.makedirs), meaningless in another process.
    "locks",
    # Python bytecode caches: derived from the .py next to them, specific to
    # one interpreter and regenerated on import. (Inductor loads its generated
    # .py by exec, so none appear in practice; a stray one is never needed.)
    "__pycache__",
    # cachesvc's own restore state (restore.lock, restored.json) under the
    # inductor root: per host, must never be published.
    ".cachesvc",
})


def _is_junk_dir(name: str) -> bool:
    # Triton >= 3.0 FileCacheManager.put writes into a temp dir
    # <key>/tmp.pid_<pid>_<uuid>/ then os.replace()s the file out and removes
    # the dir; one left behind is an interrupted write.
    return name in _JUNK_DIRS or name.startswith("tmp.pid_")


def _is_junk_file(name: str) -> bool:
    # Lock files: FileLock targets never hold data. Inductor: <key>.lock (code,
    # PCH, fx graph locks), dynamo PGO <file>.lock, PersistentMemoizer dir.lock;
    # Halide runtime dir "lock"; Triton's FileCacheManager.lock_path "lock".
    if name.endswith(".lock") or name == "lock":
        return True
    # Temp files of atomic writes (write then rename), left behind only when
    # the writer died: Inductor write_atomic ".<pid>.<thread>.tmp"; dynamo PGO
    # "<file>.tmp"; CuTe DSL cache mkstemp "tmpXXXX.o.tmp"; cachesvc restore
    # ".cachesvc-XXXX.tmp" and "<file>.cachesvc-<pid>-<tid>.tmp".
    if name.endswith(".tmp"):
        return True
    # Triton < 3.0 wrote "<file>.tmp.pid_<pid>_<rnd>" beside the target.
    if ".tmp.pid_" in name:
        return True
    # Bytecode (see __pycache__ above).
    if name.endswith(".pyc"):
        return True
    return False


def is_junk(relpath: str) -> bool:
    """Whether a file at ``relpath`` (relative to a root, '/' or os.sep separated) must not be published."""
    parts = [p for p in relpath.replace(os.sep, "/").split("/") if p not in ("", ".")]
    if not parts:
        return True
    if any(_is_junk_dir(p) for p in parts[:-1]):
        return True
    return _is_junk_file(parts[-1])


# --------------------------------------------------------------------------
# Walk
# --------------------------------------------------------------------------


def walk(root_path: str, exclude: Sequence[str] = ()) -> Iterator[Tuple[str, str, int, int]]:
    """Yield ``(relpath, abspath, size, mode)`` for each regular file under ``root_path``.

    ``relpath`` uses '/' separators; ``mode`` is the permission bits
    (``stat.S_IMODE``). Symlinks (to files or folders) and special files are
    skipped, symlinked folders are not followed (the root itself may be a
    symlink), junk (``is_junk``) is skipped and junk folders are not entered,
    and so are the folders in ``exclude`` (absolute paths). Files that vanish
    during the walk are skipped. A missing root yields nothing. Order: sorted
    by relpath (code-point order), so two walks of the same tree agree.
    """
    root_abs = os.path.abspath(root_path)
    excluded = {os.path.normpath(os.path.abspath(p)) for p in exclude}
    found: List[Tuple[str, str, int, int]] = []
    stack: List[Tuple[str, str]] = [(root_abs, "")]
    while stack:
        dir_abs, dir_rel = stack.pop()
        try:
            entries = list(os.scandir(dir_abs))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            rel = f"{dir_rel}/{entry.name}" if dir_rel else entry.name
            try:
                if entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if not _is_junk_dir(entry.name) and os.path.normpath(entry.path) not in excluded:
                        stack.append((entry.path, rel))
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode) or _is_junk_file(entry.name):
                continue
            found.append((rel, entry.path, st.st_size, stat.S_IMODE(st.st_mode)))
    found.sort(key=lambda row: row[0])
    return iter(found)
