"""cachesvc.storage.presign signs the URL botocore signs, byte for byte; a real S3 server takes it.

Fetching with a real server is in test_storage.py (presigned GET/PUT, tampered
and expired URLs, the public endpoint); here the URL is compared with
botocore's own query signer at one fixed instant, over keys, endpoints and
credentials that exercise the encoding rules.
"""
from __future__ import annotations

import datetime as dt

import botocore.auth
import pytest
import requests
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from urllib.parse import quote

from cachesvc.storage.presign import GetPresigner, canonical_host

NOW = dt.datetime(2026, 11, 29, 23, 59, 58)

KEYS = ["blobs/ab/abcdef.zst", "tenant a/blobs/ü/x+y=z&w.zst", "packs/~tilde/(paren)/*star*", "a//b/./c/../d"]
ENDPOINTS = ["http://127.0.0.1:9000", "https://s3.example.com", "https://s3.example.com:443/",
             "http://minio:80", "https://storage.example.com/s3-gateway"]
CREDS = [ReadOnlyCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None),
         ReadOnlyCredentials("ASIA/with+odd=chars", "secret", "session/token+with=odd&chars")]


def botocore_url(endpoint: str, region: str, bucket: str, key: str, expires: int, creds, monkeypatch,
                 when: dt.datetime = NOW) -> str:
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: when)
    request = AWSRequest(method="GET", url=f"{endpoint.rstrip('/')}/{bucket}/{quote(key, safe='/~')}")
    S3SigV4QueryAuth(creds, "s3", region, expires=expires).add_auth(request)
    return request.url


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("creds", CREDS, ids=["keys", "session-token"])
def test_url_equals_botocores(endpoint, key, creds, monkeypatch):
    signer = GetPresigner(endpoint, "eu-west-3", clock=lambda: NOW)
    for expires in (60, 604800):
        assert signer.url("my-bucket", key, expires, creds) == \
            botocore_url(endpoint, "eu-west-3", "my-bucket", key, expires, creds, monkeypatch)


def test_signing_key_follows_the_day_and_the_secret(monkeypatch):
    clock = [NOW]
    signer = GetPresigner("http://127.0.0.1:9000", "us-east-1", clock=lambda: clock[0])
    creds = CREDS[0]
    signer.url("b", "k", 60, creds)
    clock[0] = NOW + dt.timedelta(seconds=3)  # past midnight: a new day's key
    assert signer.url("b", "k", 60, creds) == botocore_url("http://127.0.0.1:9000", "us-east-1", "b", "k", 60,
                                                           creds, monkeypatch, clock[0])
    rotated = ReadOnlyCredentials("AKIDEXAMPLE", "rotated-secret", None)
    assert signer.url("b", "k", 60, rotated) == botocore_url("http://127.0.0.1:9000", "us-east-1", "b", "k", 60,
                                                             rotated, monkeypatch, clock[0])


def test_canonical_host_drops_default_ports_and_user_info():
    assert canonical_host("https://s3.example.com:443/x") == "s3.example.com"
    assert canonical_host("http://u:p@127.0.0.1:9000") == "127.0.0.1:9000"
    assert canonical_host("http://host:80") == "host"


def test_a_real_s3_server_serves_a_key_that_needs_encoding(s3_storage_settings, tmp_path):
    from cachesvc.storage import from_url

    storage = from_url(s3_storage_settings["STORAGE_URL"], s3_storage_settings)
    src = tmp_path / "blob"
    src.write_bytes(b"bytes behind an odd key")
    key = "blobs/odd key+plus=eq&amp/ü~.zst"
    storage.put_file(key, str(src))
    r = requests.get(storage.download_url(key, 300), timeout=10)
    assert r.status_code == 200 and r.content == b"bytes behind an odd key"
    tampered = storage.download_url(key, 300).replace("X-Amz-Expires=300", "X-Amz-Expires=301")
    assert requests.get(tampered, timeout=10).status_code == 403
