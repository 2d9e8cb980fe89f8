"""The storage contract, run on every backend (local directory, rclone S3).

Then what only one backend has: presigned URLs, multipart uploads and
prefixes on S3, the copy fallback and temp files on local disk.
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from pathlib import Path

import boto3
import pytest
import requests
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

import cachesvc.storage
from cachesvc.storage import BlobNotFound, StorageError, blob_key, from_url
from cachesvc.storage.local import LocalStorage
from cachesvc.storage.s3 import S3Storage

pytestmark = pytest.mark.backends  # the storage contract: the backends are the subject

DIGEST = hashlib.sha256(b"some blob").hexdigest()


@pytest.fixture
def make_file(tmp_path):
    """Write bytes to a new file outside the storage root and return its path."""
    src = tmp_path / "src"
    src.mkdir()
    counter = iter(range(10**9))

    def make(data: bytes) -> Path:
        path = src / f"upload-{next(counter)}"
        path.write_bytes(data)
        return path

    return make


def read(storage, key: str) -> bytes:
    with storage.open(key) as stream:
        return stream.read()


def raw_keys(settings) -> list:
    """Object names as the backend itself stores them, prefix included."""
    url = settings["STORAGE_URL"]
    if url.startswith("file:"):
        root = Path(url[len("file://"):])
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    bucket = url[len("s3://"):].split("/", 1)[0]
    s3 = boto3.client("s3", endpoint_url=settings["S3_ENDPOINT_URL"], region_name=settings["S3_REGION"],
                      aws_access_key_id=settings["S3_ACCESS_KEY_ID"],
                      aws_secret_access_key=settings["S3_SECRET_ACCESS_KEY"],
                      config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


# ------------------------------------------------------------------ key layout


def test_blob_key_matches_documented_layout():
    documented = dict(
        (enc, template) for template, enc in
        re.findall(r"\[<prefix>/\](\S+)\s+(identity|zstd)", cachesvc.storage.__doc__)
    )
    assert set(documented) == set(cachesvc.storage.ENCODINGS)
    for encoding, template in documented.items():
        expected = template.replace("<sha256[:2]>", DIGEST[:2]).replace("<sha256>", DIGEST)
        assert blob_key(DIGEST, encoding) == expected
    assert blob_key(DIGEST, "identity") == f"v1/blobs/{DIGEST[:2]}/{DIGEST}"
    assert blob_key(DIGEST, "zstd") == f"v1/blobs/{DIGEST[:2]}/{DIGEST}.zst"


def test_blob_keys_land_where_documented(storage, storage_settings, make_file):
    storage.put_file(blob_key(DIGEST, "identity"), str(make_file(b"some blob")))
    storage.put_file(blob_key(DIGEST, "zstd"), str(make_file(b"compressed")))
    prefix = "some-prefix/" if storage_settings["STORAGE_URL"].startswith("s3:") else ""
    assert raw_keys(storage_settings) == [
        f"{prefix}v1/blobs/{DIGEST[:2]}/{DIGEST}",
        f"{prefix}v1/blobs/{DIGEST[:2]}/{DIGEST}.zst",
    ]


def test_unknown_storage_scheme_is_refused():
    with pytest.raises(ValueError, match="unsupported storage URL"):
        from_url("ftp://host/blobs")


# -------------------------------------------------------------------- contract


def test_put_file_consumes_source_and_reads_back(storage, make_file):
    data = os.urandom(100_000)
    src = make_file(data)
    storage.put_file("a/b/c", str(src))
    assert not src.exists()
    assert read(storage, "a/b/c") == data


def test_empty_object(storage, make_file):
    storage.put_file("empty", str(make_file(b"")))
    assert storage.stat("empty") == 0
    assert read(storage, "empty") == b""


def test_stat_is_size_or_none(storage, make_file):
    storage.put_file("sized", str(make_file(b"x" * 1234)))
    assert storage.stat("sized") == 1234
    assert storage.stat("missing") is None


def test_open_missing_raises_blob_not_found(storage):
    with pytest.raises(BlobNotFound):
        storage.open(blob_key(DIGEST, "identity"))
    assert issubclass(BlobNotFound, StorageError)  # callers may catch either


def test_delete_is_idempotent(storage, make_file):
    storage.put_file("doomed", str(make_file(b"bye")))
    storage.delete("doomed")
    assert storage.stat("doomed") is None
    with pytest.raises(BlobNotFound):
        storage.open("doomed")
    storage.delete("doomed")
    storage.delete("never-existed/at-all")


def test_iter_keys_filters_by_prefix(storage, make_file):
    keys = [blob_key("ab" + "0" * 62, "identity"), blob_key("ab" + "1" * 62, "zstd"),
            blob_key("cd" + "2" * 62, "identity"), "other/thing"]
    for key in keys:
        storage.put_file(key, str(make_file(key.encode())))
    assert sorted(storage.iter_keys()) == sorted(keys)
    assert sorted(storage.iter_keys("v1/blobs/")) == sorted(keys[:3])
    assert sorted(storage.iter_keys("v1/blobs/ab/")) == sorted(keys[:2])
    assert sorted(storage.iter_keys("v1/blobs/ab/ab1")) == [keys[1]]  # a prefix need not end at a '/'
    assert list(storage.iter_keys("nothing-here/")) == []


def test_overwrite_is_atomic(storage, storage_settings, make_file):
    """Readers racing a writer get the old or the new object, whole: never a mix, never a gap.

    rclone's GET is not isolated from an overwrite of the file behind it: it
    breaks such a response off (md5 mismatch, short body, a 5xx) rather than
    send mixed bytes. Real S3 does not, so on s3 a *failed* read is tolerated
    here; wrong bytes or a missing object never are.
    """
    size = 256 * 1024
    versions = [bytes([i]) * size for i in range(4)]
    storage.put_file("hot", str(make_file(versions[0])))
    sources = [make_file(versions[i % 4]) for i in range(1, 25)]
    tolerate_failed_reads = storage_settings["STORAGE_URL"].startswith("s3:")
    stop = threading.Event()
    good_reads, errors = [], []

    def reader():
        while not stop.is_set():
            try:
                data = read(storage, "hot")
            except BlobNotFound as exc:
                errors.append(AssertionError(f"the object vanished during an overwrite: {exc}"))
                return
            except Exception as exc:  # noqa: BLE001 - see the docstring
                if not tolerate_failed_reads:
                    errors.append(exc)
                    return
                continue
            if data not in versions:
                errors.append(AssertionError(f"torn read: {len(data)} bytes, first {data[:1]!r}"))
                return
            good_reads.append(data[0])

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        for src in sources:
            storage.put_file("hot", str(src))
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=30)
    assert not errors, errors[0]
    assert good_reads  # the readers did run
    assert read(storage, "hot") == versions[24 % 4]
    assert raw_keys(storage_settings) in (["hot"], ["some-prefix/hot"])  # no temp objects left behind


# ------------------------------------------------------------ S3: presigned URLs


@pytest.fixture
def s3_storage(s3_storage_settings) -> S3Storage:
    storage = from_url(s3_storage_settings["STORAGE_URL"], s3_storage_settings)
    assert isinstance(storage, S3Storage)
    return storage


def test_presigned_urls_are_none_for_local(local_storage_settings):
    storage = from_url(local_storage_settings["STORAGE_URL"], local_storage_settings)
    assert storage.upload_target("k", 60, 1) is None
    assert storage.download_url("k", 60) is None


def test_presigning_can_be_turned_off(s3_storage_settings):
    storage = from_url(s3_storage_settings["STORAGE_URL"], {**s3_storage_settings, "S3_PRESIGN": False})
    assert storage.upload_target("k", 60, 1) is None
    assert storage.download_url("k", 60) is None


@pytest.mark.s3
def test_presigned_put_then_get_with_plain_requests(s3_storage):
    key = blob_key(DIGEST, "identity")
    data = os.urandom(300_000)
    target = s3_storage.upload_target(key, 60, len(data))
    assert target["method"] == "PUT"
    for other in (data[:-1], data + b"x"):  # the length is signed: storage takes that one only
        assert requests.put(target["url"], data=other, timeout=30).status_code == 403
    resp = requests.request(target["method"], target["url"], data=data, headers=target["headers"], timeout=30)
    assert resp.status_code == 200, resp.text
    assert s3_storage.stat(key) == len(data)

    resp = requests.get(s3_storage.download_url(key, 60), timeout=30)
    assert resp.status_code == 200
    assert resp.content == data


@pytest.mark.s3
def test_tampered_presigned_urls_are_refused(s3_storage, make_file):
    s3_storage.put_file("secret", str(make_file(b"secret")))
    s3_storage.put_file("public", str(make_file(b"public")))

    url = s3_storage.download_url("public", 60)
    assert requests.get(url.replace("/public?", "/secret?"), timeout=30).status_code == 403
    forged = re.sub(r"X-Amz-Signature=[0-9a-f]{4}", "X-Amz-Signature=0000", url)
    assert forged != url
    assert requests.get(forged, timeout=30).status_code == 403

    put = s3_storage.upload_target("mine", 60, 1)["url"]
    assert requests.put(put.replace("/mine?", "/theirs?"), data=b"x", timeout=30).status_code == 403
    assert s3_storage.stat("theirs") is None


@pytest.mark.s3
def test_expired_presigned_url_is_refused(s3_storage, make_file):
    s3_storage.put_file("short-lived", str(make_file(b"x")))
    url = s3_storage.download_url("short-lived", 1)
    time.sleep(2.1)  # X-Amz-Date has one-second resolution
    resp = requests.get(url, timeout=30)
    assert resp.status_code in (400, 403)  # AWS says 403; rclone answers 400 AccessDenied
    assert b"AccessDenied" in resp.content


@pytest.mark.s3
def test_presigned_urls_name_the_public_endpoint(s3_server, s3_storage_settings):
    public = s3_server.endpoint_url.replace("127.0.0.1", "localhost")
    storage = from_url(s3_storage_settings["STORAGE_URL"],
                       {**s3_storage_settings, "S3_PUBLIC_ENDPOINT_URL": public})
    target = storage.upload_target("via-public", 60, 5)
    assert target["url"].startswith(public + "/")
    assert requests.put(target["url"], data=b"hello", timeout=30).status_code == 200
    url = storage.download_url("via-public", 60)
    assert url.startswith(public + "/")
    assert requests.get(url, timeout=30).content == b"hello"


# --------------------------------------------------------- S3: multipart, prefix


def _count_calls(storage: S3Storage, operation: str) -> list:
    calls = []
    storage._s3.meta.events.register(f"before-call.s3.{operation}", lambda **kw: calls.append(1))
    return calls


def _write_random(path: Path, mib: int) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        for _ in range(mib):
            chunk = os.urandom(1 << 20)
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _sha256_of(storage, key: str) -> str:
    digest = hashlib.sha256()
    with storage.open(key) as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.mark.s3
def test_large_upload_goes_multipart(s3_storage, tmp_path):
    """70 MiB crosses the backend's own 64 MiB threshold: two parts."""
    src = tmp_path / "big"
    expected = _write_random(src, 70)
    parts = _count_calls(s3_storage, "UploadPart")
    s3_storage.put_file("big", str(src))
    assert len(parts) == 2
    assert not src.exists()
    assert s3_storage.stat("big") == 70 << 20
    assert _sha256_of(s3_storage, "big") == expected


@pytest.mark.s3
def test_multipart_with_many_concurrent_parts(s3_storage, tmp_path):
    """Parts uploaded concurrently reach the server out of order; the object is still whole."""
    s3_storage._transfer = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20,
                                          max_concurrency=8)
    src = tmp_path / "medium"
    expected = _write_random(src, 23)
    parts = _count_calls(s3_storage, "UploadPart")
    s3_storage.put_file("medium", str(src))
    assert len(parts) == 5
    assert s3_storage.stat("medium") == 23 << 20
    assert _sha256_of(s3_storage, "medium") == expected


@pytest.mark.s3
def test_prefixes_isolate_tenants_in_one_bucket(s3_server, make_file):
    bucket = s3_server.new_bucket()
    # "tenant" is a string prefix of "tenant-b": isolation must hold at the '/'.
    a = from_url(f"s3://{bucket}/tenant", s3_server.settings(bucket))
    b = from_url(f"s3://{bucket}/tenant-b", s3_server.settings(bucket))
    a.put_file("v1/blobs/ab/k", str(make_file(b"from a")))
    b.put_file("v1/blobs/ab/k", str(make_file(b"from b")))
    b.put_file("v1/blobs/cd/only-b", str(make_file(b"b only")))

    assert read(a, "v1/blobs/ab/k") == b"from a"
    assert read(b, "v1/blobs/ab/k") == b"from b"
    assert list(a.iter_keys()) == ["v1/blobs/ab/k"]
    assert sorted(b.iter_keys()) == ["v1/blobs/ab/k", "v1/blobs/cd/only-b"]
    assert a.stat("v1/blobs/cd/only-b") is None
    a.delete("v1/blobs/ab/k")
    assert read(b, "v1/blobs/ab/k") == b"from b"
    assert sorted(o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]) == [
        "tenant-b/v1/blobs/ab/k", "tenant-b/v1/blobs/cd/only-b"]


# ------------------------------------------------------------ S3: server down


@pytest.mark.s3
def test_s3_down_raises_storage_error_quickly(s3_server, s3_storage, make_file):
    s3_storage.put_file("kept", str(make_file(b"kept")))
    src = make_file(b"never stored")
    operations = {
        "stat": lambda: s3_storage.stat("kept"),
        "open": lambda: s3_storage.open("kept"),
        "delete": lambda: s3_storage.delete("kept"),
        "iter_keys": lambda: list(s3_storage.iter_keys()),
        "put_file": lambda: s3_storage.put_file("new", str(src)),
    }
    with s3_server.down():
        for name, call in operations.items():
            started = time.monotonic()
            with pytest.raises(StorageError) as info:
                call()
            assert type(info.value) is StorageError, name  # not BlobNotFound: down is not a miss
            assert time.monotonic() - started < 15, name
    assert not src.exists()  # put_file consumes its source even when it fails
    # The same storage object works again once the server is back.
    assert read(s3_storage, "kept") == b"kept"


@pytest.mark.s3
def test_s3_crash_mid_download_raises_storage_error(s3_server, s3_storage, tmp_path):
    src = tmp_path / "big"
    _write_random(src, 32)  # more than the loopback socket buffers hold
    s3_storage.put_file("big", str(src))
    stream = s3_storage.open("big")
    stream.read(1 << 20)
    with s3_server.down(crash=True):
        with pytest.raises(StorageError):
            while stream.read(1 << 20):
                pass


# --------------------------------------------------------------- local specifics


def test_local_copy_fallback_across_filesystems(local_storage_settings, make_file, monkeypatch):
    """When the source is on another filesystem the blob is copied beside its destination, then renamed."""
    storage = from_url(local_storage_settings["STORAGE_URL"])
    storage.put_file("k", str(make_file(b"old")))
    real_replace = os.replace
    src = make_file(b"new")

    def replace(a, b, **dir_fds):
        if os.fspath(a) == str(src):
            raise OSError(18, "Invalid cross-device link")  # EXDEV, as from another mount
        return real_replace(a, b, **dir_fds)

    monkeypatch.setattr("cachesvc.storage.local.os.replace", replace)
    storage.put_file("k", str(src))
    assert not src.exists()
    assert read(storage, "k") == b"new"
    assert raw_keys(local_storage_settings) == ["k"]  # the temp copy was renamed, nothing left over


def test_local_incoming_dir_is_not_listed(local_storage_settings, make_file):
    storage = from_url(local_storage_settings["STORAGE_URL"])
    assert isinstance(storage, LocalStorage)
    (Path(storage.temp_dir()) / "half-uploaded").write_bytes(b"partial")
    storage.put_file("real", str(make_file(b"real")))
    assert list(storage.iter_keys()) == ["real"]
    assert storage.local_path("real") == str(storage.root / "real")


def test_local_refuses_keys_outside_root(local_storage_settings):
    storage = from_url(local_storage_settings["STORAGE_URL"])
    for key in ("../escape", "/etc/passwd", "a/../../b"):
        with pytest.raises(StorageError):
            storage.stat(key)


@pytest.mark.parametrize("operation", ["stat-below-object", "open-folder"])
def test_local_odd_keys_raise_only_storage_errors(local_storage_settings, make_file, operation):
    storage = from_url(local_storage_settings["STORAGE_URL"])
    storage.put_file("a/b", str(make_file(b"x")))
    if operation == "stat-below-object":
        assert storage.stat("a/b/c") is None
    else:
        with pytest.raises(BlobNotFound):
            storage.open("a")
