"""cachesvc_client.settings: the CACHESVC_* variables read in one place, into one frozen object that follows
the environment (issue 40)."""
from __future__ import annotations

import dataclasses

import pytest

from cachesvc_client import settings


def test_settings_are_frozen_and_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("CACHESVC_URL", "http://cache.example:8080")
    monkeypatch.setenv("CACHESVC_TOKEN", "")
    monkeypatch.setenv("CACHESVC_REQUIRE_HIT", " Yes ")
    monkeypatch.setenv("CACHESVC_ENV_DEVICE", "H100")
    monkeypatch.setenv("CACHESVC_ENV_ARCH", "")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "")
    s = settings.current()
    assert (s.url, s.token, s.require_hit) == ("http://cache.example:8080", None, True)
    assert dict(s.env_overrides) == {"device": "H100"}  # an empty override is no override
    assert s.tool("TORCH_EXTENSIONS_DIR") == ""  # set, if empty: torch counts it
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.url = "elsewhere"  # type: ignore[misc]


def test_a_changed_environment_is_read_again_and_an_unchanged_one_is_not(monkeypatch):
    monkeypatch.setenv("CACHESVC_COMPILE_ROUTE", "torch")
    first = settings.current()
    assert settings.current() is first and first.compile_route == "torch"
    monkeypatch.setenv("CACHESVC_COMPILE_ROUTE", " aoti ")
    assert settings.current().compile_route == "aoti"
    monkeypatch.delenv("CACHESVC_COMPILE_ROUTE")
    assert settings.current().compile_route == ""
    assert settings.reload() == settings.current()


def test_read_takes_any_mapping():
    s = settings.read({"CACHESVC_TORCH_FIXES": "0", "CACHESVC_EXTRA_ROOTS": "flashinfer"})
    assert s.torch_fixes is False and s.extra_roots == "flashinfer" and s.url == ""
