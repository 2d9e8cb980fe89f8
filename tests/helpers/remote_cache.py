"""Fixtures of the client's remote-cache tests (test_remote_cache_hook.py, test_remote_cache_verify.py), which
each imports by name, so they apply to those modules alone (pytest registers a fixture a module holds):
the service side on SQLite (``database_url``), and the hook taken out of Inductor after every test.
"""
from __future__ import annotations

import pytest

import cachesvc_client


@pytest.fixture
def database_url(sqlite_url):  # the service side is tested on every backend in tests/service
    return sqlite_url


@pytest.fixture(autouse=True)
def _undo_hook():
    yield
    cachesvc_client.disable_remote_cache()
