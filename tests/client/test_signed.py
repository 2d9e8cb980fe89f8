"""Signed publishes (issue 28, item 1): a fleet with CACHESVC_TRUSTED_KEYS places only versions one of its
keys signed, over exactly the files and key the service lists; everything else is a miss that says why,
before any byte is placed."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select, update

from cachesvc.models import Version, VersionFile
from cachesvc_client import CacheClient, CacheClientError, HitRequired
from cachesvc_client.publish.onefile import publish_file
from cachesvc_client.shared import signing
from tests.helpers import ENV

NAME, SHAPE = "signed", "f32[4,4]"
local_only = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]


def keygen(tmp_path: Path, name: str, comment: str = "") -> Path:
    path = tmp_path / "keys" / name
    path.parent.mkdir(exist_ok=True)
    out = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "keygen", str(path),
                          "--comment", comment or f"{name}@build"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return path


def fingerprint(key: Path) -> str:
    return signing.fingerprint(signing.parse_public_key(Path(f"{key}.pub").read_text())[1])


def trust_file(tmp_path: Path, *keys: Path) -> Path:
    path = tmp_path / ("trusted_keys-" + "-".join(k.name for k in keys))
    path.write_text("# the fleet's builders\n" + "".join(Path(f"{k}.pub").read_text() for k in keys))
    return path


def publish(url: str, src: Path, monkeypatch, key: Path = None, name: str = NAME) -> int:
    """Publish ``src`` as the inductor root, signed by ``key`` (None: unsigned); the version id."""
    if key is None:
        monkeypatch.delenv(signing.SIGNING_KEY_VAR, raising=False)
    else:
        monkeypatch.setenv(signing.SIGNING_KEY_VAR, str(key))
    report = CacheClient(url, timeout=10).publish(name, SHAPE, env=ENV, roots={"inductor": str(src)})
    monkeypatch.delenv(signing.SIGNING_KEY_VAR, raising=False)
    assert report.status in ("committed", "linked"), report
    return report.version_id


def source(tmp_path: Path, tag: bytes = b"") -> Path:
    src = tmp_path / f"src{tag.decode()}"
    (src / "fxgraph/ab").mkdir(parents=True)
    (src / "fxgraph/ab/entry").write_bytes(b"graph" * 100 + tag)
    (src / "kernel.so").write_bytes(b"\x7fELF" + b"k" * 500 + tag)
    (src / "kernel.so").chmod(0o755)
    return src


def restore(url: str, dest: Path, trusted: Path = None, **kw):
    client = CacheClient(url, cache_dir=str(dest), timeout=10, trusted_keys=str(trusted) if trusted else None)
    return client.restore(NAME, SHAPE, env=ENV, **kw)


def placed(dest: Path) -> list:
    return sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file() and ".cachesvc" not in p.parts)


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path):
    key = keygen(tmp_path, "ci", "ci@build")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    line = Path(f"{key}.pub").read_text().strip()
    assert line.startswith("ssh-ed25519 ") and line.endswith(" ci@build")
    again = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "keygen", str(key)],
                           capture_output=True, text=True)
    assert again.returncode == 1 and "exists" in again.stderr and "Traceback" not in again.stderr
    assert Path(f"{key}.pub").read_text().strip() == line


@local_only[0]
@local_only[1]
def test_a_trusted_signature_restores_and_shows_who_signed(live_server, app, tmp_path, monkeypatch):
    ci, old = keygen(tmp_path, "ci"), keygen(tmp_path, "old")
    vid = publish(live_server.url, source(tmp_path), monkeypatch, key=ci)
    dest = tmp_path / "dest"
    got = restore(live_server.url, dest, trust_file(tmp_path, old, ci))  # rotation: either key is trusted
    fp = fingerprint(ci)
    assert got.hit and got.version_id == vid and got.signed_by == {"fingerprint": fp, "comment": "ci@build"}
    assert placed(dest) == ["fxgraph/ab/entry", "kernel.so"]
    listing = CacheClient(live_server.url).api.entries(name=NAME)
    detail = CacheClient(live_server.url).api.call("GET", f"/api/v1/entries/{listing['entries'][0]['id']}")
    assert detail["versions"][0]["signed_by"] == {"fingerprint": fp, "comment": "ci@build"}
    ls = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "ls", "-v", "--json", "--url", live_server.url],
                        capture_output=True, text=True)
    assert json.loads(ls.stdout)["entries"][0]["versions_detail"][0]["signed_by"]["fingerprint"] == fp
    ls = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "ls", "-v", "--url", live_server.url],
                        capture_output=True, text=True)
    assert "SIGNED BY" in ls.stdout and fp[:20] in ls.stdout, ls.stdout + ls.stderr
    page = app.test_client().get(f"/entries/{listing['entries'][0]['id']}",
                                 headers={"Authorization": f"Bearer {app.config['TOKENS']['read']}"})
    assert fp in page.get_data(as_text=True), page.status_code


@local_only[0]
@local_only[1]
def test_unsigned_and_untrusted_versions_are_a_miss_that_places_nothing(live_server, tmp_path, monkeypatch):
    ci, rogue = keygen(tmp_path, "ci"), keygen(tmp_path, "rogue")
    trusted = trust_file(tmp_path, ci)
    publish(live_server.url, source(tmp_path), monkeypatch)  # a write token alone, no signing key
    dest = tmp_path / "dest"
    got = restore(live_server.url, dest, trusted)
    assert not got.hit and got.refused and "unsigned" in got.reason and placed(dest) == []
    publish(live_server.url, source(tmp_path, b"2"), monkeypatch, key=rogue)
    got = restore(live_server.url, dest, trusted)
    assert not got.hit and got.refused and "not among the trusted keys" in got.reason, got.reason
    assert fingerprint(rogue) in got.reason
    assert placed(dest) == []
    with pytest.raises(HitRequired, match="not among the trusted keys"):
        restore(live_server.url, dest, trusted, require_hit=True)
    assert restore(live_server.url, tmp_path / "plain").hit  # a client that requires nothing: as before


@local_only[0]
@local_only[1]
def test_a_manifest_changed_after_signing_or_replayed_under_another_key_is_refused(live_server, app, tmp_path,
                                                                                    monkeypatch):
    ci = keygen(tmp_path, "ci")
    trusted = trust_file(tmp_path, ci)
    vid = publish(live_server.url, source(tmp_path), monkeypatch, key=ci)
    other = publish(live_server.url, source(tmp_path, b"x"), monkeypatch, name="other")  # its blobs are stored
    db = app.extensions["cachesvc"].db
    with db.session() as s:  # a service (or its database) that swaps in another stored blob
        swap = s.scalars(select(VersionFile).where(VersionFile.version_id == other,
                                                   VersionFile.path == "kernel.so")).one()
        s.execute(update(VersionFile).where(VersionFile.version_id == vid, VersionFile.path == "kernel.so")
                  .values(digest=swap.digest, size=swap.size))
    dest = tmp_path / "dest"
    got = restore(live_server.url, dest, trusted)
    assert not got.hit and "does not match the files and key" in got.reason and placed(dest) == []
    with db.session() as s:  # the signed version's signature copied onto another key's version
        signed = s.get(Version, vid)
        s.execute(update(Version).where(Version.id == other)
                  .values(signer_key=signed.signer_key, signature=signed.signature))
    got = CacheClient(live_server.url, cache_dir=str(dest), timeout=10,
                      trusted_keys=str(trusted)).restore("other", SHAPE, env=ENV)
    assert not got.hit and "does not match the files and key" in got.reason and placed(dest) == []


@local_only[0]
@local_only[1]
def test_a_bad_trust_file_or_no_cryptography_refuses_rather_than_accepting(live_server, tmp_path, monkeypatch):
    ci = keygen(tmp_path, "ci")
    publish(live_server.url, source(tmp_path), monkeypatch, key=ci)
    source(tmp_path, b"2")
    bad = tmp_path / "bad_keys"
    bad.write_text("ssh-rsa AAAAB3NzaC1yc2E= someone\n")
    got = restore(live_server.url, tmp_path / "d1", bad)
    assert not got.hit and "line 1" in got.reason and placed(tmp_path / "d1") == []
    got = restore(live_server.url, tmp_path / "d2", tmp_path / "missing")
    assert not got.hit and "missing" in got.reason
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives", None)  # as if not installed
    got = restore(live_server.url, tmp_path / "d3", trust_file(tmp_path, ci))
    assert not got.hit and "cachesvc[signing]" in got.reason and placed(tmp_path / "d3") == []
    monkeypatch.setenv(signing.SIGNING_KEY_VAR, str(ci))  # a builder told to sign cannot: nothing goes out unsigned
    with pytest.raises(CacheClientError, match=r"cachesvc\[signing\]"):
        CacheClient(live_server.url, timeout=10).publish(NAME, SHAPE, env=ENV,
                                                         roots={"inductor": str(tmp_path / "src2")})


@local_only[0]
@local_only[1]
def test_artifact_kinds_are_checked_by_the_same_restore_path(live_server, tmp_path, monkeypatch):
    """The one call fetches a pt2-package through CacheClient.restore -> restore.onefile.fetch: the same check."""
    ci = keygen(tmp_path, "ci")
    trusted = trust_file(tmp_path, ci)
    blob = tmp_path / "model.pt2"
    blob.write_bytes(b"PK" + os.urandom(2000))
    client = CacheClient(live_server.url, timeout=10)
    key = client.key(NAME, SHAPE, env=ENV)
    publish_file(client.api, key, "pt2-package", path=str(blob), meta={"torch": "2.13.0"})
    dest = tmp_path / "dest"
    got = restore(live_server.url, dest, trusted, kind="pt2-package")
    assert not got.hit and "unsigned" in got.reason and placed(dest) == []
    monkeypatch.setenv(signing.SIGNING_KEY_VAR, str(ci))
    publish_file(client.api, key, "pt2-package", path=str(blob), meta={"torch": "2.13.0"})
    got = restore(live_server.url, dest, trusted, kind="pt2-package")
    assert got.hit and Path(got.artifacts[0]).read_bytes() == blob.read_bytes() and got.signed_by


@local_only[0]
@local_only[1]
def test_signed_publish_of_content_an_unsigned_version_holds_makes_a_signed_version(live_server, tmp_path,
                                                                                     monkeypatch):
    ci = keygen(tmp_path, "ci")
    src = source(tmp_path)
    first = publish(live_server.url, src, monkeypatch)
    second = publish(live_server.url, src, monkeypatch, key=ci)
    assert second != first  # not "unchanged": restores that require the signature must find it
    assert restore(live_server.url, tmp_path / "dest", trust_file(tmp_path, ci)).hit


@local_only[0]
@local_only[1]
def test_the_service_refuses_a_malformed_signature(client):
    from tests.helpers import ENV as env

    body = {"key": {"name": NAME, "shape": SHAPE, "tags": {}, "env": env}, "roots": {"inductor": "/c"},
            "files": [{"root": "inductor", "path": "a", "sha256": "0" * 64, "size": 1}],
            "signature": {"public_key": "ssh-ed25519 AAAA" + "x" * 2000, "signature": "nope"}}
    r = client.post("/api/v1/versions", json=body)
    assert r.status_code == 422 and "signature" in r.get_data(as_text=True)


@local_only[0]
@local_only[1]
def test_with_trusted_keys_a_large_blob_is_checked_by_its_signed_digest_not_the_services_word(
        live_server, app, tmp_path, monkeypatch):
    """A compromised service (its database) that vouches for other stored bytes (``stored_sha256``, the
    large-blob shortcut) gets them placed by a client that trusts it, never by one that requires signatures."""
    import hashlib

    from cachesvc.models import Blob
    from cachesvc.storage import blob_key
    from cachesvc_client.codec import frames
    from tests.helpers.client import blob_bytes

    ci = keygen(tmp_path, "ci")
    src = tmp_path / "src"
    data = blob_bytes(frames.FRAMED_MIN + (8 << 20) + 777)
    (src / "sj").mkdir(parents=True)
    (src / "sj/prefix.h.gch").write_bytes(data)
    (src / "sj/small.cpp").write_bytes(b"int x;" * 100)
    publish(live_server.url, src, monkeypatch, key=ci)
    digest = hashlib.sha256(data).hexdigest()
    evil = bytearray(data)
    evil[len(evil) // 2] ^= 0xFF
    body = b"".join(frames.compress_framed([bytes(evil)[i:i + frames.FRAME_SIZE]
                                            for i in range(0, len(evil), frames.FRAME_SIZE)], 3))
    (tmp_path / "evil").write_bytes(body)
    svc = app.extensions["cachesvc"]
    svc.storage.put_file(blob_key(digest, "zstd"), str(tmp_path / "evil"))
    with svc.db.session() as s:
        s.execute(update(Blob).where(Blob.digest == digest).values(stored_sha256=hashlib.sha256(body).hexdigest()))
    trusting = restore(live_server.url, tmp_path / "trusting")  # the service is its trust root: it is fooled
    assert trusting.hit and (tmp_path / "trusting/sj/prefix.h.gch").read_bytes() == bytes(evil)
    dest = tmp_path / "requiring"
    got = restore(live_server.url, dest, trust_file(tmp_path, ci))
    assert len(got.failed) == 1 and "prefix.h.gch" in got.failed[0], got.failed
    assert placed(dest) == ["sj/small.cpp"]
