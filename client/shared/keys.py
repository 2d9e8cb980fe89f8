"""Key and path rules shared by the client and the service.

One module so both sides agree on what a valid key, role, path and digest
are: the client checks before it sends, the service checks what it
receives, and restore checks what the service hands back.

A cache *key* is the environment fingerprint (``ENV_FIELDS``), the caller's
``name`` and ``shape`` signature, and optional string ``tags``. Its canonical
form is sorted-key JSON; ``key_digest`` is the sha256 of that text. A key
without its shape is a key *family*; ``family_digest`` names one.

Stdlib only: this module is imported by inference containers.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Dict, Iterable, Mapping, Tuple

#: Environment fields, in display order. Every one must match for a restore.
ENV_FIELDS: Tuple[str, ...] = ("torch", "triton", "cuda", "python", "device", "arch")

#: Version kinds: what a version of an entry holds (see cachesvc_client.onefile).
#: ``inductor-dir`` a snapshot of the compile caches' folders; ``mega-cache`` one
#: torch.compiler.save_cache_artifacts() blob; ``aot-function`` a function saved by
#: ``torch.compile(fn, fullgraph=True).aot_compile(...)``; ``pt2-package`` an AOTInductor package.
KINDS: Tuple[str, ...] = ("inductor-dir", "mega-cache", "aot-function", "pt2-package")
DEFAULT_KIND = "inductor-dir"

MAX_NAME = 200
MAX_SHAPE = 2000
MAX_ENV_VALUE = 200
MAX_TAGS = 32
MAX_TAG_KEY = 64
MAX_TAG_VALUE = 200
MAX_PATH = 1024  # characters
#: A path's UTF-8 bytes: PostgreSQL's btree (the version_files key: version, root, path) holds at most
#: 2,704 bytes a row, which 1,024 characters of 3- or 4-byte UTF-8 exceed; one limit on every database.
MAX_PATH_BYTES = 2048
MAX_COMPONENT = 255  # UTF-8 bytes (NAME_MAX)
MAX_FILE_SIZE = 64 * 1024**3

_ROLE_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_TAG_KEY_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class InvalidKey(ValueError):
    """A key, path or digest breaks the rules. The message names the field."""


def _check_text(field: str, value: Any, max_len: int) -> str:
    if not isinstance(value, str):
        raise InvalidKey(f"{field} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidKey(f"{field} must not be empty")
    if len(value) > max_len:
        raise InvalidKey(f"{field} is {len(value)} characters long; the limit is {max_len}")
    if not value.isprintable():
        raise InvalidKey(f"{field} contains control characters")
    return value


def check_name(name: Any) -> str:
    return _check_text("name", name, MAX_NAME)


def check_shape(shape: Any) -> str:
    return _check_text("shape", shape, MAX_SHAPE)


def check_env(env: Mapping[str, Any]) -> Dict[str, str]:
    if not isinstance(env, Mapping):
        raise InvalidKey("env must be an object")
    unknown = set(env) - set(ENV_FIELDS)
    if unknown:
        raise InvalidKey(f"unknown env field(s): {', '.join(sorted(unknown))}; known: {', '.join(ENV_FIELDS)}")
    missing = [f for f in ENV_FIELDS if f not in env]
    if missing:
        raise InvalidKey(f"env is missing field(s): {', '.join(missing)}")
    return {f: _check_text(f"env.{f}", env[f], MAX_ENV_VALUE) for f in ENV_FIELDS}


def check_tags(tags: Any) -> Dict[str, str]:
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise InvalidKey("tags must be an object of strings")
    if len(tags) > MAX_TAGS:
        raise InvalidKey(f"{len(tags)} tags given; the limit is {MAX_TAGS}")
    out = {}
    for k, v in tags.items():
        if not isinstance(k, str) or not _TAG_KEY_RE.match(k):
            raise InvalidKey(f"tag key {k!r} must be 1-64 characters of letters, digits and _.:-")
        out[k] = _check_text(f"tags.{k}", v, MAX_TAG_VALUE)
    return dict(sorted(out.items()))


def canonical_tags(tags: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(tags.items())), separators=(",", ":"), ensure_ascii=False)


def key_digest(name: str, shape: str, tags: Mapping[str, str], env: Mapping[str, str]) -> str:
    """sha256 of the canonical key: what makes two keys the same entry."""
    doc = {"name": name, "shape": shape, "tags": dict(sorted(tags.items())),
           "env": {f: env[f] for f in ENV_FIELDS}}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def family_digest(name: str, tags: Mapping[str, str], env: Mapping[str, str]) -> str:
    """sha256 of a key *family*: the key without its shape (name, tags, environment), under which the
    service keeps the fleet's shape demand (``POST /api/v1/usage``, ``GET /api/v1/demand``).

    Canonical as ``key_digest`` is, but the text hashed starts with ``family:`` where a key's starts with
    ``{``, so no family digest is ever a key digest (two different texts; sha256 collisions aside).
    """
    doc = {"name": name, "tags": dict(sorted(tags.items())), "env": {f: env[f] for f in ENV_FIELDS}}
    text = "family:" + json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_kind(kind: Any) -> str:
    if kind not in KINDS:
        raise InvalidKey(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind


def check_role(role: Any) -> str:
    if not isinstance(role, str) or not _ROLE_RE.match(role):
        raise InvalidKey(f"root role {role!r} must match {_ROLE_RE.pattern}")
    return role


def check_digest(digest: Any) -> str:
    if not isinstance(digest, str) or not _SHA256_RE.match(digest):
        raise InvalidKey(f"sha256 {digest!r} must be 64 lowercase hex characters")
    return digest


def check_size(size: Any) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise InvalidKey(f"size must be an integer, got {type(size).__name__}")
    if size < 0 or size > MAX_FILE_SIZE:
        raise InvalidKey(f"size {size} is outside 0..{MAX_FILE_SIZE}")
    return size


#: the client's state folder in the inductor root (restore.lock, restored.json); no manifest path is in it
STATE_DIR = ".cachesvc"


def check_relpath(path: Any) -> str:
    """A manifest path: relative, '/'-separated, no '.', '..' or empty parts.

    Returns the path unchanged. Raises InvalidKey naming the problem. This is
    the first of two guards; restore also checks the resolved location on
    disk (symlinks) before it writes.
    """
    if not isinstance(path, str):
        raise InvalidKey(f"path must be a string, got {type(path).__name__}")
    if not path:
        raise InvalidKey("path must not be empty")
    if len(path) > MAX_PATH:
        raise InvalidKey(f"path is {len(path)} characters long; the limit is {MAX_PATH}")
    if "\x00" in path or "\\" in path:
        raise InvalidKey(f"path {path!r} contains a NUL or backslash")
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        raise InvalidKey(f"path {path!r} is absolute; manifest paths are relative to their root")
    if path.split("/", 1)[0] == STATE_DIR:
        raise InvalidKey(f"path {path!r} is in {STATE_DIR}/, the client's own restore state, which no manifest "
                         "may write (and publish never sends)")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise InvalidKey(f"path {path!r} has an empty, '.' or '..' component")
        if not part.isprintable():  # before the byte counts: a lone surrogate has no UTF-8
            raise InvalidKey(f"path {path!r} contains control characters or invalid unicode (a lone surrogate)")
        if len(part.encode("utf-8")) > MAX_COMPONENT:
            raise InvalidKey(f"path {path!r} has a component longer than {MAX_COMPONENT} bytes")
    encoded = len(path.encode("utf-8"))
    if encoded > MAX_PATH_BYTES:
        raise InvalidKey(f"path is {encoded} bytes long in UTF-8; the limit is {MAX_PATH_BYTES}")
    return path


def manifest_digest(files: Iterable[Mapping[str, Any]]) -> str:
    """sha256 over the sorted (root, path, sha256, mode) rows of a manifest.

    Two versions with the same manifest digest hold the same content, so a
    publish whose digest equals the newest version's creates nothing.
    """
    h = hashlib.sha256()
    for row in sorted((f["root"], f["path"], f["sha256"], int(f.get("mode", 0o644)) & 0o777) for f in files):
        h.update(("%s\0%s\0%s\0%o\n" % row).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


# -- Inductor's live remote cache (cachesvc_client.remote_cache, cachesvc.remote_cache) ----------

MAX_REMOTE_KEY = 512
#: the caches cachesvc_client.remote_cache hooks; the service accepts any valid name but labels its metrics by these
REMOTE_CACHES = ("fx-graph", "aot-autograd", "autotune", "bundled-autotune")
_CACHE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_REMOTE_KEY_RE = re.compile(r"^[A-Za-z0-9._:=+-]{1,%d}$" % MAX_REMOTE_KEY)


def check_cache_name(name: Any) -> str:
    """A remote cache's name (``fx-graph``, ``autotune``): 1-64 of a-z, 0-9 and ``._-``."""
    if not isinstance(name, str) or not _CACHE_NAME_RE.match(name):
        raise InvalidKey(f"cache name {name!r} must be 1-64 characters of a-z, 0-9 and ._- (starting with a "
                         f"letter or digit)")
    return name


def check_remote_key(key: Any) -> str:
    """A remote-cache key: 1-512 characters of letters, digits and ``._:=+-`` (Inductor's keys fit)."""
    if not isinstance(key, str) or not _REMOTE_KEY_RE.match(key):
        shown = key[:80] + "..." if isinstance(key, str) and len(key) > 80 else key
        raise InvalidKey(f"remote-cache key {shown!r} must be 1-{MAX_REMOTE_KEY} characters of letters, digits "
                         f"and ._:=+-")
    return key


def env_digest(env: Mapping[str, str]) -> str:
    """sha256 of the canonical environment fingerprint: the namespace of remote-cache items."""
    text = json.dumps({f: env[f] for f in ENV_FIELDS}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
