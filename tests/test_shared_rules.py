"""The rules the service and the client share have one home, ``cachesvc_client.rules``, and the two
sides' error tables agree: every code the service answers is in it with the status the service sends,
and the client maps every one of them to an exception of the same kind."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge, UnprocessableEntity

from cachesvc import errors as service_errors
from cachesvc import schemas, storage
from cachesvc.storage import decoding as service_decoding
from cachesvc_client import answers, decoding as client_decoding, errors as client_errors, rules

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
                 409: client_errors.Conflict, 503: client_errors.ServiceUnavailable}
    for code, status in rules.ERROR_CODES.items():
        wanted = by_status.get(status, client_errors.InvalidRequest)
        assert issubclass(client_errors._BY_CODE[code], wanted), (code, status, client_errors._BY_CODE[code])


def test_both_sides_take_the_encodings_and_the_window_from_the_shared_rules():
    assert storage.ENCODINGS is rules.ENCODINGS and answers.ENCODINGS is rules.ENCODINGS
    assert service_decoding.MAX_WINDOW == client_decoding.MAX_WINDOW == rules.MAX_WINDOW
    assert "ENCODINGS" in vars(schemas)


def test_the_shared_rules_import_the_standard_library_only():
    tree = ast.parse((ROOT / "client" / "rules.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported <= {"__future__", "typing"}, imported
