"""Signed publishes: Ed25519 over a version's manifest and key, in OpenSSH's key formats.

    keygen(path, comment)            PATH (private, OpenSSH format, mode 0600) and PATH.pub (one OpenSSH line)
    Signer.from_file(path)           a builder's key ($CACHESVC_SIGNING_KEY); .sign(key, kind, files) -> record
    Trust.from_file(path)            a restoring fleet's trusted public keys ($CACHESVC_TRUSTED_KEYS)
    Trust.problem(key, kind, answer) why a resolve answer must not be placed ("" when it may)
    describe(record)                 the signer of a record: {"fingerprint", "comment"} (stdlib only)
    check_record(record)             a record's shape, as the service validates it (stdlib only)

What is signed (``manifest_bytes``): the text ``cachesvc-manifest-v1`` and
sorted-key JSON of the version's kind, its whole key (name, shape, tags and
the environment fields) and every file (root, path, size, sha256 and whether
it is executable: what the restore places), sorted. So a signed version can
be neither replayed under another key or kind nor given one file more, less
or different. A signature record is ``{"public_key": "ssh-ed25519 AAAA...
comment", "signature": base64}``; the service stores it and checks only its
shape (it holds no keys). The fingerprint is ssh-keygen -l's
(``SHA256:`` and the unpadded base64 of the key blob's sha256).

The cryptography is the ``cryptography`` package's (an optional extra:
``pip install 'cachesvc[signing]'``), imported only to make keys, sign or
verify; describing and shape checks are stdlib, so the service and a client
that trusts nobody need nothing more. A client told to trust keys without
``cryptography`` refuses every version (``Trust.problem`` says why): never
an unverified placement.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import struct
from typing import Any, Dict, Iterable, List, Mapping, Optional

SIGNING_KEY_VAR = "CACHESVC_SIGNING_KEY"
TRUSTED_KEYS_VAR = "CACHESVC_TRUSTED_KEYS"
FORMAT = "cachesvc-manifest-v1"
KEY_TYPE = "ssh-ed25519"
#: a public key line at most (type, 68 base64 characters, a comment of up to ~900)
MAX_PUBLIC_KEY = 1000
MAX_COMMENT = 200
MAX_SIGNATURE = 100  # an Ed25519 signature is 64 bytes: 88 base64 characters
#: a trusted-keys file at most (hundreds of keys)
MAX_TRUST_FILE = 1 << 20
_LINE = re.compile(r"ssh-ed25519 ([A-Za-z0-9+/]{68}(?:=|==)?)(?: ([^\x00-\x1f\x7f]{0,%d}))?" % MAX_COMMENT)


class SigningError(ValueError):
    """A key file, trusted-keys file or signature record that is not what it must be; the message says which."""


def _crypto():
    """``cryptography``'s serialization and Ed25519 modules; SigningError naming the extra when absent."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SigningError("signing and verifying need the cryptography package: pip install 'cachesvc[signing]'"
                           ) from None
    return serialization, ed25519


# -- stdlib: the formats -----------------------------------------------------------------------------

def parse_public_key(line: str) -> tuple:
    """(the raw 32-byte Ed25519 key, the key blob, the comment) of an OpenSSH ``ssh-ed25519`` line.
    Raises SigningError naming what is wrong."""
    if not isinstance(line, str) or len(line) > MAX_PUBLIC_KEY:
        raise SigningError(f"a public key must be one line of at most {MAX_PUBLIC_KEY} characters")
    m = _LINE.fullmatch(line.strip())
    if not m:
        raise SigningError(f"not an OpenSSH ssh-ed25519 public key line: {line.strip()[:40]!r}...")
    try:
        blob = base64.b64decode(m.group(1), validate=True)
    except binascii.Error:
        raise SigningError("the public key's base64 does not decode") from None
    want = struct.pack(">I", len(KEY_TYPE)) + KEY_TYPE.encode() + struct.pack(">I", 32)
    if len(blob) != len(want) + 32 or not blob.startswith(want):
        raise SigningError("the public key's blob is not an ssh-ed25519 key")
    return blob[len(want):], blob, (m.group(2) or "").strip()


def fingerprint(blob: bytes) -> str:
    """ssh-keygen -l's fingerprint of a key blob: ``SHA256:`` and the unpadded base64 of its sha256."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def check_record(record: Any) -> Dict[str, str]:
    """A signature record ``{"public_key", "signature"}`` checked for shape (not trusted): SigningError."""
    if not isinstance(record, Mapping) or set(record) != {"public_key", "signature"}:
        raise SigningError("a signature is {\"public_key\": \"ssh-ed25519 ...\", \"signature\": base64}")
    parse_public_key(record["public_key"])
    sig = record["signature"]
    try:
        ok = isinstance(sig, str) and len(sig) <= MAX_SIGNATURE and len(base64.b64decode(sig, validate=True)) == 64
    except binascii.Error:
        ok = False
    if not ok:
        raise SigningError("signature must be the base64 of a 64-byte Ed25519 signature")
    return {"public_key": record["public_key"].strip(), "signature": sig}


def describe(record: Optional[Mapping[str, str]]) -> Optional[Dict[str, str]]:
    """``{"fingerprint", "comment"}`` of a well-formed record's signer; None for none (or a malformed one)."""
    if not record:
        return None
    try:
        _raw, blob, comment = parse_public_key(record.get("public_key", ""))
    except SigningError:
        return None
    return {"fingerprint": fingerprint(blob), "comment": comment}


def _placed_mode(mode: int) -> int:
    return 0o755 if int(mode) & 0o111 else 0o644  # what the restore gives the file (restore.plan.targets)


def manifest_bytes(key: Mapping[str, Any], kind: str, files: Iterable[Mapping[str, Any]]) -> bytes:
    """The canonical bytes a signature covers (see the module docstring)."""
    rows = sorted([f["root"], f["path"], int(f["size"]), f["sha256"], _placed_mode(f.get("mode", 0o644))]
                  for f in files)
    doc = {"format": FORMAT, "kind": kind, "files": rows,
           "key": {"name": key["name"], "shape": key["shape"], "tags": dict(key["tags"]), "env": dict(key["env"])}}
    return FORMAT.encode() + b"\n" + json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


# -- cryptography: keys, signing, verifying ------------------------------------------------------------

def keygen(path: str, comment: str) -> str:
    """Write a new Ed25519 key pair: ``path`` (OpenSSH private key, mode 0600) and ``path.pub``; return the
    fingerprint. Refuses (FileExistsError) to overwrite either file."""
    serialization, ed25519 = _crypto()
    if len(comment) > MAX_COMMENT or not comment.isprintable():
        raise SigningError(f"the comment must be printable and at most {MAX_COMMENT} characters")
    for p in (path, path + ".pub"):
        if os.path.lexists(p):
            raise FileExistsError(f"{p} exists; keygen never overwrites a key (move it away or pick another path)")
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    line = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    line = line.decode() + (f" {comment}" if comment else "")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    with open(path + ".pub", "x") as f:
        f.write(line + "\n")
    return fingerprint(parse_public_key(line)[1])


class Signer:
    """A builder's private key and its public line (from ``PATH`` and ``PATH.pub``)."""

    def __init__(self, private: Any, public_line: str):
        self.private, self.public_line = private, public_line

    @classmethod
    def from_file(cls, path: str) -> "Signer":
        """The key pair keygen wrote at ``path``. Raises SigningError naming the file."""
        serialization, ed25519 = _crypto()
        try:
            with open(path, "rb") as f:
                private = serialization.load_ssh_private_key(f.read(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise SigningError(f"{SIGNING_KEY_VAR}={path}: cannot read an unencrypted OpenSSH private key "
                               f"({exc}); make one with `cachesvc-client keygen PATH`") from None
        if not isinstance(private, ed25519.Ed25519PrivateKey):
            raise SigningError(f"{SIGNING_KEY_VAR}={path}: not an Ed25519 key; make one with `cachesvc-client keygen`")
        line = private.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                 serialization.PublicFormat.OpenSSH).decode()
        try:
            with open(path + ".pub") as f:
                given = f.read(MAX_PUBLIC_KEY + 1).strip()
            raw, _blob, comment = parse_public_key(given)
            if raw == parse_public_key(line)[0] and comment:
                line += f" {comment}"
        except (OSError, SigningError):
            pass  # no (or another) .pub beside it: the line carries no comment
        return cls(private, line)

    def sign(self, key: Mapping[str, Any], kind: str, files: Iterable[Mapping[str, Any]]) -> Dict[str, str]:
        sig = self.private.sign(manifest_bytes(key, kind, files))
        return {"public_key": self.public_line, "signature": base64.b64encode(sig).decode()}


class Trust:
    """The public keys a restoring client accepts signatures from (several at once: key rotation).

    ``error``: why no key could be loaded (a bad file, no ``cryptography``): then every version is refused.
    """

    def __init__(self, keys: Dict[bytes, str], source: str, error: str = ""):
        self.keys, self.source, self.error = keys, source, error

    @classmethod
    def from_file(cls, path: str) -> "Trust":
        """One OpenSSH ``ssh-ed25519`` line per key (blank lines and ``#`` comments ignored). Never raises: a
        file that cannot be read or holds a bad line gives a Trust that refuses everything, saying why."""
        source = f"{TRUSTED_KEYS_VAR}={path}"
        try:
            _crypto()
            with open(path, encoding="utf-8") as f:
                text = f.read(MAX_TRUST_FILE + 1)
            if len(text) > MAX_TRUST_FILE:
                raise SigningError(f"the file is over {MAX_TRUST_FILE} bytes")
            keys: Dict[bytes, str] = {}
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip() and not line.lstrip().startswith("#"):
                    try:
                        raw, blob, _comment = parse_public_key(line)
                    except SigningError as exc:
                        raise SigningError(f"line {n}: {exc}") from None
                    keys[raw] = fingerprint(blob)
            if not keys:
                raise SigningError("it holds no public key")
        except (OSError, UnicodeDecodeError, SigningError) as exc:
            return cls({}, source, f"{source}: {exc}; refusing every version until it is fixed")
        return cls(keys, source)

    def fingerprints(self) -> List[str]:
        return sorted(self.keys.values())

    def problem(self, key: Mapping[str, Any], kind: str, files: List[Mapping[str, Any]],
                record: Optional[Mapping[str, str]]) -> str:
        """Why a version of ``key`` and ``kind`` listing ``files`` with signature ``record`` must not be
        placed; "" when one of the trusted keys signed exactly these files under exactly this key."""
        if self.error:
            return self.error
        if not record:
            return f"the version is unsigned and this client requires a signature ({self.source})"
        try:
            record = check_record(record)
            raw, blob, comment = parse_public_key(record["public_key"])
        except SigningError as exc:
            return f"the version's signature is malformed ({exc})"
        who = f"{fingerprint(blob)}{f' ({comment})' if comment else ''}"
        if raw not in self.keys:
            return f"the version is signed by {who}, which is not among the trusted keys ({self.source})"
        from cryptography.exceptions import InvalidSignature

        _serialization, ed25519 = _crypto()
        try:
            ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(base64.b64decode(record["signature"]),
                                                                  manifest_bytes(key, kind, files))
        except InvalidSignature:
            return (f"the signature by {who} does not match the files and key the service listed: the manifest "
                    "or key was changed after signing")
        return ""
