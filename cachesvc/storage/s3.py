"""Blobs in S3 or any S3-compatible store (MinIO, rclone, Ceph) through boto3.

Clients get presigned URLs (SigV4, path-style) so blob bytes never pass
through the service. botocore errors are translated here and go no further.

A presigned GET URL is reused for half its lifetime (a resolve hands out one
per blob): every URL handed out is still valid for at least ``expires / 2``
seconds, and none outlives what a freshly signed one would, so the GC grace
(see ``cachesvc.lifecycle.collect``) still outlives every URL. New GET URLs are signed
by ``presign.GetPresigner`` (SigV4 query signing, path-style, the same URL
botocore makes): 0.02 ms a URL, against 0.2 ms through botocore's signer
object and 0.8 ms through ``generate_presigned_url``. PUT URLs still come
from ``generate_presigned_url``.
"""
from __future__ import annotations

import io
import os
from typing import BinaryIO, Dict, Iterator, Optional

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError

from ..ttlcache import TTLCache
from .types import BlobNotFound, ShortObject, Storage, StorageError
from .presign import GetPresigner

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}


def _client(endpoint_url, region, access_key, secret_key, timeouts=True, attempts=3, timeout=None):
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            retries={"max_attempts": attempts, "mode": "standard"},
            connect_timeout=timeout or (5 if timeouts else 60),
            read_timeout=timeout or (30 if timeouts else 60),
            max_pool_connections=32,
            # A ranged GET (a pack member) must not be checked against the whole object's checksum,
            # which some S3 servers (rclone) send with every answer; blobs are sha256-checked anyway.
            response_checksum_validation="when_required",
        ),
    )


class _Body(io.RawIOBase):
    """botocore's StreamingBody, with its errors turned into StorageError."""

    def __init__(self, body, key: str):
        self._body, self._key = body, key

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        try:
            return self._body.read(None if size is None or size < 0 else size)
        except Exception as exc:
            raise StorageError(f"S3 download of {self._key} broke off: {type(exc).__name__}: {exc}") from None

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._body.close()
        finally:
            super().close()


class S3Storage(Storage):
    def __init__(self, bucket: str, prefix: str = "", endpoint_url: Optional[str] = None, region: str = "us-east-1",
                 access_key: Optional[str] = None, secret_key: Optional[str] = None, presign: bool = True,
                 public_endpoint_url: Optional[str] = None):
        if not bucket:
            raise ValueError("s3:// storage URL needs a bucket: s3://bucket/prefix")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.presign = presign
        self._s3 = _client(endpoint_url, region, access_key, secret_key)
        self._client_args = (endpoint_url, region, access_key, secret_key)
        self._check_s3 = None  # the readiness check's client, made at its first check
        # Presigned URLs must name the endpoint the *clients* reach.
        self._signer = (_client(public_endpoint_url, region, access_key, secret_key)
                        if public_endpoint_url else self._s3)
        self._get_urls = TTLCache(0, size=50_000)  # (key, expires) -> presigned GET URL
        self._presigner = GetPresigner(self._signer.meta.endpoint_url, region)
        self._credentials = boto3.session.Session(aws_access_key_id=access_key or None,
                                                  aws_secret_access_key=secret_key or None,
                                                  region_name=region).get_credentials()
        self._transfer = TransferConfig(multipart_threshold=64 * 1024**2, multipart_chunksize=64 * 1024**2)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _translate(self, exc: Exception, key: str) -> StorageError:
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _NOT_FOUND:
                return BlobNotFound(key)
            if code == "InvalidRange":  # a range past the object's end
                return ShortObject(f"{key} is shorter than the range asked for")
            return StorageError(f"S3 {code or 'error'} on {key}: {exc}")
        return StorageError(f"S3 unreachable ({type(exc).__name__}): {exc}")

    def put_file(self, key: str, path: str) -> None:
        try:
            self._s3.upload_file(path, self.bucket, self._key(key), Config=self._transfer)
        except Exception as exc:  # noqa: BLE001 - no botocore type may leave this module
            raise self._translate(exc, key) from None
        finally:
            if os.path.exists(path):
                os.unlink(path)

    def open(self, key: str) -> BinaryIO:
        try:
            return _Body(self._s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"], key)
        except Exception as exc:  # botocore raises more than ClientError/BotoCoreError (e.g. AttributeError on 5xx)
            raise self._translate(exc, key) from None

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        if length == 0:
            return b""
        try:
            obj = self._s3.get_object(Bucket=self.bucket, Key=self._key(key),
                                      Range=f"bytes={offset}-{offset + length - 1}")
            data = _Body(obj["Body"], key).read()
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - no botocore type may leave this module
            raise self._translate(exc, key) from None
        if len(data) != length:
            raise ShortObject(f"{key} is shorter than {offset} + {length} bytes")
        return data

    def stat(self, key: str) -> Optional[int]:
        try:
            return int(self._s3.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except Exception as exc:  # noqa: BLE001 - no botocore type may leave this module
            err = self._translate(exc, key)
            if isinstance(err, BlobNotFound):
                return None
            raise err from None

    def delete(self, key: str) -> None:
        try:
            self._s3.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:  # noqa: BLE001 - no botocore type may leave this module
            err = self._translate(exc, key)
            if not isinstance(err, BlobNotFound):
                raise err from None

    def promote(self, src: str, dst: str) -> None:
        # A server-side copy (multipart above the transfer threshold): the bytes never leave the bucket.
        try:
            self._s3.copy({"Bucket": self.bucket, "Key": self._key(src)}, self.bucket, self._key(dst),
                          Config=self._transfer)
        except Exception as exc:  # noqa: BLE001 - no botocore type may leave this module
            raise self._translate(exc, src) from None
        self.delete(src)

    def check(self) -> None:
        """One listing of at most one key under the prefix: the bucket is there and these credentials
        may list it (as GC must)."""
        if self._check_s3 is None:  # one attempt, short timeouts: an outage reads as what it is, at once
            self._check_s3 = _client(*self._client_args, attempts=1, timeout=2)
        try:
            self._check_s3.list_objects_v2(Bucket=self.bucket, Prefix=self._key("v1/"), MaxKeys=1)
        except Exception as exc:  # noqa: BLE001 - no botocore type may leave this module
            raise self._translate(exc, "v1/") from None

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        strip = len(self.prefix) + 1 if self.prefix else 0
        try:
            pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix))
            for page in pages:
                for obj in page.get("Contents", []):
                    yield obj["Key"][strip:]
        except Exception as exc:  # noqa: BLE001 - no botocore type may leave this module
            raise self._translate(exc, prefix) from None

    def upload_target(self, key: str, expires: int, size: int) -> Optional[Dict]:
        if not self.presign:
            return None
        # Content-Length is a signed header: S3 refuses a PUT of any other length
        params = {"Bucket": self.bucket, "Key": self._key(key), "ContentLength": size}
        url = self._signer.generate_presigned_url("put_object", Params=params, ExpiresIn=expires)
        return {"method": "PUT", "url": url, "headers": {}}

    def download_url(self, key: str, expires: int) -> Optional[str]:
        if not self.presign:
            return None
        return self._get_urls.get_or_make((key, expires), lambda: self._sign_get(key, expires), expires / 2)

    def _sign_get(self, key: str, expires: int) -> str:
        if self._credentials is None:  # no credentials at all: let botocore say so
            return self._signer.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._key(key)}, ExpiresIn=expires)
        return self._presigner.url(self.bucket, self._key(key), expires, self._credentials.get_frozen_credentials())
