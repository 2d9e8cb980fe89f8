"""The proof's slow-import hint (client/one_call/proof/bytecode.py): an image without torch's bytecode caches
compiles torch from source in every process (5.4-6.2 s for Dynamo's import on an H100 host, 1.2 s with the
caches); the proof says so once, naming the file and what to run, and stays quiet on a normal install."""
from __future__ import annotations

import importlib.util
import logging
import py_compile
import sys
import types

import pytest

from cachesvc_client.one_call.proof import bytecode


@pytest.fixture
def package(tmp_path):
    """A package folder shaped like torch's: ``__init__.py`` and ``_dynamo/guards.py``, no caches yet."""
    root = tmp_path / "fake_torch"
    (root / "_dynamo").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "_dynamo" / "guards.py").write_text("X = 1\n")
    return root


def test_a_module_without_its_bytecode_cache_is_named(package, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    why = bytecode.missing(str(package / "__init__.py"))
    assert why and "guards.py has no bytecode cache" in why and "PYTHONDONTWRITEBYTECODE" not in why


def test_the_cache_found_is_no_finding(package):
    source = package / "_dynamo" / "guards.py"
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
    assert bytecode.missing(str(package / "__init__.py")) is None


def test_pythondontwritebytecode_is_named_as_the_reason_none_is_written(package, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert "PYTHONDONTWRITEBYTECODE is set" in bytecode.missing(str(package / "__init__.py"))


def test_a_missing_source_is_no_finding(tmp_path):
    assert bytecode.missing(str(tmp_path / "nothing" / "__init__.py")) is None


def test_this_venvs_torch_has_its_caches():
    torch = pytest.importorskip("torch")
    assert bytecode.missing(torch.__file__) is None


def _fake_torch(monkeypatch, package):
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__file__=str(package / "__init__.py")))
    monkeypatch.setattr(bytecode, "_warned", False)


def test_a_slow_import_without_caches_logs_once_what_to_run(package, monkeypatch, caplog):
    _fake_torch(monkeypatch, package)
    with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
        bytecode.warn_if_slow(5.8)
        bytecode.warn_if_slow(6.1)
    lines = [r.getMessage() for r in caplog.records if r.name == "cachesvc_client"]
    assert len(lines) == 1
    assert "took 5.8 s" in lines[0] and "guards.py has no bytecode cache" in lines[0]
    assert "python -m compileall" in lines[0]


def test_a_fast_import_or_a_cached_torch_logs_nothing(package, monkeypatch, caplog):
    _fake_torch(monkeypatch, package)
    with caplog.at_level(logging.WARNING, logger="cachesvc_client"):
        bytecode.warn_if_slow(bytecode.SLOW_IMPORT_S - 0.1)  # fast: no look at the disk
        source = package / "_dynamo" / "guards.py"
        py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
        bytecode.warn_if_slow(9.0)  # slow, but the caches are there: something else; not this line
    assert not [r for r in caplog.records if r.name == "cachesvc_client"]
