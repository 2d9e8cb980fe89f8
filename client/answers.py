"""What the client accepts from the service: every JSON answer it reads, checked before use.

A cache must never hurt the process it serves, and an answer from the
network is untrusted (a wrong URL, a proxy, a broken or hostile service): a
missing field, a wrong type, a list where an object belongs, a lone
surrogate, an absurd size or offset is ``Malformed``, which the caller turns
into a miss with that reason, never a KeyError or TypeError out of
``restore()``. The checkers return fresh plain values holding only what they
checked, so code past them indexes without guarding.

    parse(body)                    bytes -> JSON value (deep nesting, huge numbers: Malformed)
    resolve(doc)                   GET /api/v1/resolve
    error_fields(doc)              {"error": {"code", "message", "details"}} of a 4xx/5xx
    json_object(doc, where)        any answer that must be an object (verdicts, create, commit)
    text / integer / boolean / items / digest / field   the primitives, for other answers

Stdlib only (with ``keys`` and ``rules``, also stdlib only): inference containers import it.
"""
from __future__ import annotations

import functools
import json
import math
import re
from typing import Any, Callable, Dict, Mapping, Optional
from urllib.parse import urlsplit

from .shared import keys
from .shared.rules import ENCODINGS

#: the most files (and blobs) one resolve answer may list; the service's own limit is far lower
MAX_FILES = 1_000_000
#: the most candidates a miss or fallback may name
MAX_CANDIDATES = 100
MAX_TEXT = 10_000
MAX_URL = 16_384
MAX_INT = 2**62
#: a pack is at most this large (the service's limit is 64 MiB)
MAX_PACK = 1 << 30
#: paths the fast check accepts: ASCII, no '.' or '..' part, parts of 1-255 characters (a subset of what
#: ``keys.check_relpath`` accepts; the rest go through it)
_PLAIN_PATH = re.compile(r"(?!\.\.?(?:/|$))[A-Za-z0-9_+=,@~-][A-Za-z0-9._+=,@~-]{0,254}"
                         r"(?:/(?!\.\.?(?:/|$))[A-Za-z0-9._+=,@~-]{1,255}){0,511}")
_SHA256 = re.compile(r"[0-9a-f]{64}")  # keys.check_digest's rule, for the fast paths
_MISSING = object()


class Malformed(ValueError):
    """An answer that breaks its shape; the message names the field (``files[3].size``) and the problem."""


def parse(body: bytes) -> Any:
    """``body`` as JSON. Raises Malformed for bytes that are not JSON, nest too deep or hold absurd numbers."""
    try:
        return json.loads(body)
    except RecursionError:
        raise Malformed("the JSON nests too deep") from None
    except ValueError as exc:  # not JSON, not UTF-8, an integer of thousands of digits
        raise Malformed(f"not JSON ({exc})") from None


def _where(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def json_object(value: Any, where: str = "answer") -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise Malformed(f"{where} must be a JSON object, got {_kind(value)}")
    return value


def field(doc: Mapping[str, Any], name: str, check: Callable[..., Any], where: str, default: Any = _MISSING,
          **limits: Any) -> Any:
    """``check(doc[name], where.name, **limits)``; ``default`` when the field is absent (else Malformed)."""
    if name not in doc:
        if default is _MISSING:
            raise Malformed(f"{_where(where, name)} is missing")
        return default
    return check(doc[name], _where(where, name), **limits)


def text(value: Any, where: str, *, max_len: int = MAX_TEXT, empty: bool = True) -> str:
    """A string that prints and encodes anywhere (valid UTF-8: no lone surrogates)."""
    if not isinstance(value, str):
        raise Malformed(f"{where} must be a string, got {_kind(value)}")
    if len(value) > max_len:
        raise Malformed(f"{where} is {len(value)} characters long; at most {max_len} are expected")
    if not value and not empty:
        raise Malformed(f"{where} must not be empty")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise Malformed(f"{where} holds a lone surrogate (not valid UTF-8)") from None
    return value


def integer(value: Any, where: str, *, lo: int = 0, hi: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"{where} must be an integer, got {_kind(value)}")
    if not lo <= value <= hi:
        raise Malformed(f"{where} is {_short(value)}; expected {lo}..{hi}")
    return value


def boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise Malformed(f"{where} must be true or false, got {_kind(value)}")
    return value


def items(value: Any, where: str, *, max_items: int = MAX_FILES) -> list:
    if not isinstance(value, list):
        raise Malformed(f"{where} must be a list, got {_kind(value)}")
    if len(value) > max_items:
        raise Malformed(f"{where} has {len(value)} items; at most {max_items} are expected")
    return value


def digest(value: Any, where: str) -> str:
    return _rule(keys.check_digest, value, where)


def url(value: Any, where: str) -> str:
    """A blob or pack URL: a path on the service (``/api/...``) or an absolute http(s) URL."""
    value = text(value, where, max_len=MAX_URL, empty=False)
    if value.startswith("/") and not value.startswith("//"):
        return value
    slash = value.find("/", value.find("://") + 3) if "://" in value else -1
    problem = _origin_problem(value[:slash] if slash > 0 else value)  # one parse per origin, not per URL
    if problem:
        raise Malformed(f"{where} {problem}, got {_short(value)}")
    return value


@functools.lru_cache(maxsize=64)
def _origin_problem(origin: str) -> str:
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be a /path or an http(s) URL"
    return ""


def error_fields(doc: Any) -> tuple:
    """(code, message, details) of the service's error body ``{"error": {...}}``; Malformed when it is not one."""
    err = field(json_object(doc, "error answer"), "error", json_object, "")
    code = field(err, "code", text, "error", default="error", max_len=100)
    message = field(err, "message", text, "error", default="")
    return code, message, err.get("details")


# -- resolve ---------------------------------------------------------------------------------------

def resolve(doc: Any) -> Dict[str, Any]:
    """A checked resolve answer (see ``cachesvc.resolve.resolver.resolve``). A miss: ``{"hit": False, "reason",
    "nearest"}``. A hit: ``{"hit": True, "files", "blobs", "version": {"id", "meta", "signature"}, "entry": {"id"},
    "reason", "fallback"}`` (``fallback``: None, or ``{"step", "versions", "entries"}``).

    Every file row passes the manifest rules of ``keys`` (path, role, digest, size); every blob has a
    known encoding, sizes in range and, in a pack, a slice inside it; a file's size equals its blob's.
    """
    doc = json_object(doc, "the resolve answer")
    hit = field(doc, "hit", boolean, "")
    reason = field(doc, "reason", text, "", default="" if hit else "no match")
    if not hit:
        nearest = field(doc, "nearest", items, "", default=[], max_items=MAX_CANDIDATES)
        return {"hit": False, "reason": reason,
                "nearest": [candidate(c, f"nearest[{i}]") for i, c in enumerate(nearest)]}
    raw_blobs = field(doc, "blobs", json_object, "")
    if len(raw_blobs) > MAX_FILES:
        raise Malformed(f"blobs has {len(raw_blobs)} entries; at most {MAX_FILES} are expected")
    blobs, packs = {}, set()
    for d, b in raw_blobs.items():
        blobs[d] = _fast_blob(b, packs) or blob_entry(b, f"blobs[{d[:12]}]")
        if not _SHA256.fullmatch(d):
            digest(d, f"blobs key {_short(d)}")
    try:
        files = [_fast_file(f, blobs) or file_row(f, f"files[{i}]")
                 for i, f in enumerate(field(doc, "files", items, ""))]
    except Malformed as exc:
        raise Malformed(f"its manifest breaks the path rules ({exc}); nothing was restored") from None
    for i, f in enumerate(files):
        b = blobs.get(f["sha256"])
        if b is not None and b["size"] != f["size"]:
            raise Malformed(f"files[{i}].size is {f['size']} but its blob's size is {b['size']}")
    version = field(doc, "version", json_object, "")
    fallback = field(doc, "fallback", _fallback, "", default=None)
    return {"hit": True, "reason": reason, "files": files, "blobs": blobs,
            "version": {"id": field(version, "id", integer, "version", lo=1),
                        "meta": field(version, "meta", meta, "version", default={}),
                        "signature": field(version, "signature", _optional(_strings), "version", default=None)},
            "entry": {"id": field(field(doc, "entry", json_object, ""), "id", integer, "entry", lo=1)},
            "fallback": fallback}


def _fast_file(value: Any, blobs: Dict[str, dict]) -> Optional[Dict[str, Any]]:
    """The common manifest row (a plain ASCII path, its blob among the checked ``blobs``) checked in a few
    microseconds, a resolve lists up to ``MAX_FILES`` of them; None for any other row (``file_row`` then
    says exactly what is wrong, if anything)."""
    try:
        path, digest_, size, mode = value["path"], value["sha256"], value["size"], value.get("mode", 0o644)
        if (type(path) is str and len(path) <= keys.MAX_PATH and _PLAIN_PATH.fullmatch(path)
                and type(mode) is int and 0 <= mode <= 0o7777 and type(size) is int and 0 <= size <= keys.MAX_FILE_SIZE
                and (digest_ in blobs or type(digest_) is str and _SHA256.fullmatch(digest_))):
            return {"root": keys.check_role(value["root"]), "path": path, "sha256": digest_, "size": size,
                    "mode": mode}
    except (KeyError, TypeError, AttributeError, keys.InvalidKey):
        pass
    return None


def file_row(value: Any, where: str) -> Dict[str, Any]:
    """A manifest row, checked field by field (Malformed names the first problem)."""
    row = json_object(value, where)
    return {"root": field(row, "root", _rule_of(keys.check_role), where),
            "path": field(row, "path", _rule_of(keys.check_relpath), where),
            "sha256": field(row, "sha256", digest, where),
            "size": field(row, "size", _rule_of(keys.check_size), where),
            "mode": field(row, "mode", integer, where, default=0o644, hi=0o7777)}


def _fast_blob(value: Any, packs: set) -> Optional[Dict[str, Any]]:
    """The common blob entry checked quickly (``packs``: pack digests checked already); None for any other
    (``blob_entry`` then says exactly what is wrong, if anything)."""
    try:
        encoding, size, stored = value["encoding"], value["size"], value["stored_size"]
        if not (type(size) is int and type(stored) is int and 0 <= size <= keys.MAX_FILE_SIZE
                and 0 <= stored <= keys.MAX_FILE_SIZE
                and (encoding == "zstd" or encoding == "identity" and stored == size)):
            return None
        out = {"url": url(value["url"], ""), "encoding": encoding, "size": size, "stored_size": stored}
        if value.get("stored_sha256") is not None:
            out["stored_sha256"] = keys.check_digest(value["stored_sha256"])
        if value.get("pack") is None:
            return out
        pack_size, offset, pack_sha = value.get("pack_size"), value["offset"], value["pack_sha256"]
        if (type(offset) is int and offset >= 0
                and (pack_size is None or type(pack_size) is int and pack_size <= MAX_PACK)
                and offset + stored <= (MAX_PACK if pack_size is None else pack_size)
                and (pack_sha in packs or type(pack_sha) is str and _SHA256.fullmatch(pack_sha))):
            packs.add(pack_sha)
            out.update(pack=url(value["pack"], ""), pack_sha256=pack_sha, pack_size=pack_size, offset=offset)
            return out
    except (KeyError, TypeError, AttributeError, keys.InvalidKey, Malformed):
        pass
    return None


def blob_entry(value: Any, where: str) -> Dict[str, Any]:
    """A resolve answer's blob entry, checked field by field (Malformed names the first problem)."""
    b = json_object(value, where)
    encoding = field(b, "encoding", text, where, max_len=32)
    if encoding not in ENCODINGS:
        raise Malformed(f"{where}.encoding is {_short(encoding)}; known: {', '.join(ENCODINGS)}")
    out = {"url": field(b, "url", url, where), "encoding": encoding,
           "size": field(b, "size", _rule_of(keys.check_size), where),
           "stored_size": field(b, "stored_size", _rule_of(keys.check_size), where)}
    if encoding == "identity" and out["stored_size"] != out["size"]:
        raise Malformed(f"{where}: an identity blob's stored_size {out['stored_size']} differs from its size "
                        f"{out['size']}")
    stored = field(b, "stored_sha256", _optional(digest), where, default=None)
    if stored is not None:
        out["stored_sha256"] = stored
    if b.get("pack") is not None:
        out.update(pack=field(b, "pack", url, where), pack_sha256=field(b, "pack_sha256", digest, where),
                   pack_size=field(b, "pack_size", _optional(integer), where, default=None, hi=MAX_PACK),
                   offset=field(b, "offset", integer, where, hi=MAX_PACK))
        end = out["offset"] + out["stored_size"]
        if end > (out["pack_size"] if out["pack_size"] is not None else MAX_PACK):
            raise Malformed(f"{where}: its slice [{out['offset']}, {end}) lies outside its pack "
                            f"({out['pack_size']} bytes)")
    return out


def meta(value: Any, where: str) -> Dict[str, str]:
    """A version's metadata: string keys, scalar values (as strings; the client reads ``torch``, ``device``...)."""
    doc = json_object(value, where)
    if len(doc) > 1000:
        raise Malformed(f"{where} has {len(doc)} entries")
    out = {}
    for k, v in doc.items():
        k = text(k, f"{where} key", max_len=200)
        if v is None:
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise Malformed(f"{where}.{k} is {v}")
        if not isinstance(v, (str, int, float, bool)):
            raise Malformed(f"{where}.{k} must be a string, got {_kind(v)}")
        out[k] = text(v, f"{where}.{k}") if isinstance(v, str) else json.dumps(v)
    return out


def candidate(value: Any, where: str) -> Dict[str, Any]:
    """A ``nearest`` or ``fallback.entries`` row: ``{"entry": {"id", "name", "shape", "tags", "env"},
    "version_id", "differs": [{"field", "wanted", "have"}], "env_differs"}``."""
    row = json_object(value, where)
    e = field(row, "entry", json_object, where)
    ew = _where(where, "entry")
    entry = {"id": field(e, "id", integer, ew, lo=1), "name": field(e, "name", text, ew),
             "shape": field(e, "shape", text, ew),
             "tags": field(e, "tags", _strings, ew, default={}), "env": field(e, "env", _strings, ew, default={})}
    differs = []
    for i, d in enumerate(field(row, "differs", items, where, default=[], max_items=100)):
        dw = f"{where}.differs[{i}]"
        d = json_object(d, dw)
        differs.append({k: field(d, k, text, dw) for k in ("field", "wanted", "have")})
    return {"entry": entry, "version_id": field(row, "version_id", _optional(integer), where, default=None),
            "differs": differs,
            "env_differs": field(row, "env_differs", boolean, where,
                                 default=any(d["field"] in keys.ENV_FIELDS for d in differs))}


def _fallback(value: Any, where: str) -> Optional[Dict[str, Any]]:
    if value is None:
        return None
    fb = json_object(value, where)
    versions = [integer(v, f"{where}.versions[{i}]", lo=1)
                for i, v in enumerate(field(fb, "versions", items, where, max_items=MAX_CANDIDATES))]
    if not versions:
        raise Malformed(f"{where}.versions is empty")
    entries = field(fb, "entries", items, where, default=[], max_items=MAX_CANDIDATES)
    return {"step": field(fb, "step", text, where, max_len=32, empty=False), "versions": versions,
            "entries": [candidate(c, f"{where}.entries[{i}]") for i, c in enumerate(entries)]}


# -- helpers ---------------------------------------------------------------------------------------

def _strings(value: Any, where: str) -> Dict[str, str]:
    doc = json_object(value, where)
    if len(doc) > 100:
        raise Malformed(f"{where} has {len(doc)} entries")
    return {text(k, f"{where} key", max_len=200): text(v, f"{where}.{k}") for k, v in doc.items()}


def _optional(check: Callable[..., Any]) -> Callable[..., Any]:
    def checked(value: Any, where: str, **limits: Any) -> Any:
        return None if value is None else check(value, where, **limits)
    return checked


def _rule(rule: Callable[[Any], Any], value: Any, where: str) -> Any:
    if isinstance(value, str):
        text(value, where, max_len=MAX_URL)  # the rules say "control characters" for a lone surrogate; be exact
    try:
        return rule(value)
    except keys.InvalidKey as exc:
        raise Malformed(f"{where}: {exc}") from None


def _rule_of(rule: Callable[[Any], Any]) -> Callable[[Any, str], Any]:
    return lambda value, where: _rule(rule, value, where)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
