"""The rules the service and the client share have one home, ``cachesvc_client.shared.rules``, and the two
sides' error tables agree: every code the service answers is in it with the status the service sends,
and the client maps every one of them to an exception of the same kind."""
from __future__ import annotations

import ast
import io
import struct
from pathlib import Path

import pytest
import zstandard
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge, UnprocessableEntity

from cachesvc import errors as service_errors
from cachesvc import schemas, storage
from cachesvc.storage import decoding as service_decoding
from cachesvc_client import answers, errors as client_errors
from cachesvc_client.codec import decoding as client_decoding
from cachesvc_client.shared import rules

ROOT = Path(__file__).resolve().parents[1]


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_error_the_service_raises_has_the_shared_tables_status():
    raised = {cls.code: cls.status for cls in _subclasses(service_errors.CacheError)}
    assert raised, "no CacheError subclasses found"
    assert {code: rules.ERROR_CODES[code] for code in raised} == raised
    assert set(raised) <= set(rules.ERROR_CODES)


@pytest.mark.parametrize("exc", [BadRequest(), RequestEntityTooLarge(), UnprocessableEntity()])
def test_the_http_errors_the_service_answers_by_name_are_in_the_table(exc):
    code, _, status, _ = service_errors.describe(exc)
    assert rules.ERROR_CODES[code] == status


def test_the_client_maps_every_code_in_the_table_to_an_exception_of_its_kind():
    assert set(client_errors._BY_CODE) == set(rules.ERROR_CODES)
    by_status = {401: client_errors.Unauthorized, 403: client_errors.Forbidden, 404: client_errors.NotFound,
                 409: client_errors.Conflict, 429: client_errors.RateLimited, 503: client_errors.ServiceUnavailable}
    for code, status in rules.ERROR_CODES.items():
        wanted = by_status.get(status, client_errors.InvalidRequest)
        assert issubclass(client_errors._BY_CODE[code], wanted), (code, status, client_errors._BY_CODE[code])


def test_both_sides_take_the_encodings_and_the_window_from_the_shared_rules():
    assert storage.ENCODINGS is rules.ENCODINGS and answers.ENCODINGS is rules.ENCODINGS
    assert service_decoding.MAX_WINDOW == client_decoding.MAX_WINDOW == rules.MAX_WINDOW
    assert service_decoding.stored_limit is client_decoding.stored_limit is rules.stored_limit


def _zstd_of_length(data: bytes, length: int) -> bytes:
    """``data`` as one zstd frame, padded to exactly ``length`` stored bytes by a skippable frame (which
    decodes to nothing: what a stream fed for ever would hold)."""
    frame = zstandard.ZstdCompressor(level=3).compress(data)
    pad = length - len(frame) - 8
    assert pad >= 0
    return frame + struct.pack("<II", 0x184D2A50, pad) + bytes(pad)


def _service_decodes(stored: bytes, encoding: str, size: int) -> int:
    return len(service_decoding.decode_all(stored, encoding, size))


def _client_decodes(stored: bytes, encoding: str, size: int) -> int:
    """What a restore does with a download (restore/download.py): the stored bytes bounded, then decoded."""
    src = client_decoding.Limited(io.BytesIO(stored), client_decoding.stored_limit(encoding, size), "blob")
    out = []
    client_decoding.decode_into(src, encoding, size, what="blob", emit=lambda view, release: (out.append(len(view)),
                                                                                             release()),
                                buffers=client_decoding.single_buffer(size))
    return sum(out)


@pytest.mark.parametrize("size", [1000, 3 << 20])
def test_both_decoders_refuse_at_the_same_stored_length(size):
    """A blob the service accepted is one every client restores, and what the client refuses the service
    refused first: both read up to the shared bound, and neither one byte more."""
    data = bytes(size)
    bound = rules.stored_limit("zstd", size)
    assert _service_decodes(_zstd_of_length(data, bound), "zstd", size) == size
    assert _client_decodes(_zstd_of_length(data, bound), "zstd", size) == size
    with pytest.raises(service_decoding.BadBlob, match=f"run past {bound}"):
        _service_decodes(_zstd_of_length(data, bound + 1), "zstd", size)
    with pytest.raises(client_decoding.Oversize, match="more stored bytes"):
        _client_decodes(_zstd_of_length(data, bound + 1), "zstd", size)
    assert rules.stored_limit("identity", size) == size  # identity: the stored bytes are the decoded ones
    assert _service_decodes(data, "identity", size) == _client_decodes(data, "identity", size) == size
    with pytest.raises(service_decoding.BadBlob):
        _service_decodes(data + b"x", "identity", size)
    with pytest.raises(client_decoding.Oversize):
        _client_decodes(data + b"x", "identity", size)
    assert "ENCODINGS" in vars(schemas)


def test_the_shared_rules_import_the_standard_library_only():
    tree = ast.parse((ROOT / "client" / "shared" / "rules.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported <= {"__future__", "typing"}, imported
