"""The backends a test runs on, narrowed: the ``storage_settings`` and ``database_url`` fixtures
(tests/conftest.py) parametrized to the local store and SQLite, for tests whose subject does not depend
on them."""
from __future__ import annotations

import pytest

LOCAL = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

ONE_BACKEND = [LOCAL, SQLITE]


def one_backend(fn):
    for mark in ONE_BACKEND:
        fn = mark(fn)
    return fn
