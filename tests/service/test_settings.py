"""Issue 29, item 3: one frozen settings object that refuses what names no setting.

A typo in an override or a ``CACHESVC_*`` variable is an error at start that names the key and the
nearest setting, never a default silently kept; the variables other parts read from the same
environment (the client's, the scripts') are let be; tests change a copy (``replace``), never the
object the app holds.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import cachesvc
from cachesvc import config
from tests.helpers.commands import assert_one_line, cli, settings_env

ROOT = Path(__file__).resolve().parents[2]


def test_an_override_that_names_no_setting_is_refused_with_the_nearest_one(tmp_path):
    with pytest.raises(SystemExit, match=r"DATABSE_URL is not a setting \(did you mean DATABASE_URL\?\)"):
        config.load({"DATABSE_URL": "sqlite://"}, environ={})
    with pytest.raises(SystemExit, match=r"MAX_BLOB_BYTE is not a setting \(did you mean MAX_BLOB_BYTES\?\)"):
        cachesvc.create_app({"TESTING": True, "DATA_DIR": str(tmp_path), "MAX_BLOB_BYTE": 100})


def test_a_cachesvc_variable_that_names_no_setting_is_refused_with_the_nearest_one():
    with pytest.raises(SystemExit, match=r"CACHESVC_STORAGE_ULR is set but names no setting "
                                         r"\(did you mean CACHESVC_STORAGE_URL\?\)"):
        config.load({}, environ={"CACHESVC_STORAGE_ULR": "file:///tmp/x"})


def test_the_command_says_the_misspelt_variable_in_one_line():
    code, _out, err = cli(settings_env(CACHESVC_DATA_DIRR="/tmp/x"), "db", "current")
    assert code == 1
    assert_one_line(err, "CACHESVC_DATA_DIRR", "did you mean CACHESVC_DATA_DIR?")


def test_the_variables_other_parts_read_are_let_be():
    """The client's variables (docs/settings.md's client table, which tests/test_project.py ties to the
    client's code) and the scripts' share the environment of a service in one pod or shell."""
    page = (ROOT / "docs" / "settings.md").read_text()
    client = re.findall(r"^\| `(CACHESVC_[A-Z0-9_]+)`", page[page.index("## Client side"):], re.M)
    assert "CACHESVC_URL" in client and "CACHESVC_TRUSTED_KEYS" in client
    others = {name: "1" for name in client}
    others.update(CACHESVC_ENV_DEVICE="H100", CACHESVC_TEST_PG="skip", CACHESVC_TORCH="cpu", CACHESVC_PORT="8787")
    settings = config.load({}, environ={**others, "CACHESVC_MAX_FILES": "7"})
    assert settings.MAX_FILES == 7


def test_the_settings_are_frozen_typed_and_changed_by_replace():
    settings = config.load({"PRESIGN_EXPIRES": "60", "SESSION_HOURS": 2, "MAX_BLOB_BYTES": "1KiB"}, environ={})
    assert (settings.PRESIGN_EXPIRES, settings.SESSION_HOURS, settings.MAX_BLOB_BYTES) == (60, 2.0, 1024)
    assert isinstance(settings.SESSION_HOURS, float) and settings.GC_GRACE_SECONDS == 60 + 3600
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.MAX_FILES = 3
    with pytest.raises(TypeError):
        settings["MAX_FILES"]  # no dict path left
    changed = settings.replace(MAX_FILES=3, ANONYMOUS_READ="off")
    assert (changed.MAX_FILES, changed.ANONYMOUS_READ, settings.MAX_FILES) == (3, False, 100_000)
    with pytest.raises(SystemExit, match=r"MAX_FILE is not a setting \(did you mean MAX_FILES\?\)"):
        settings.replace(MAX_FILE=3)
    with pytest.raises(SystemExit, match="setting MAX_FILES: expected int, got float"):
        settings.replace(MAX_FILES=3.5)
    with pytest.raises(SystemExit, match="setting COOKIE_SECURE: expected a boolean"):
        config.load({"COOKIE_SECURE": "maybe"}, environ={})


def test_the_app_holds_one_settings_object_and_a_test_changes_a_copy(app):
    from tests.helpers import set_settings

    before = app.extensions["cachesvc"].settings
    assert isinstance(before, config.Settings) and before.TESTING is True
    after = set_settings(app, ANONYMOUS_READ=False)
    assert app.extensions["cachesvc"].settings is after and after.ANONYMOUS_READ is False
    assert before.ANONYMOUS_READ is True  # SQLite's default, on the object anything else still holds


def test_every_cachesvc_variable_the_project_names_is_a_setting_or_let_be():
    """What the scripts, manifests, harness and client set in a service's environment must not stop it:
    a new variable elsewhere goes into config.ELSEWHERE (or is a setting)."""
    named = set()
    for folder in ("client", "scripts", "deploy", "demo", "bench", "tests", ".ci"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".sh", ".yaml", ".yml", "") and "__pycache__" not in path.parts:
                named.update(re.findall(r"\bCACHESVC_([A-Z0-9_]*[A-Z0-9])\b(?!_)", path.read_text(errors="replace")))
    for name in ("docker-compose.yml", "Dockerfile", ".env.example"):
        named.update(re.findall(r"\bCACHESVC_([A-Z0-9_]*[A-Z0-9])\b(?!_)", (ROOT / name).read_text()))
    named -= {"STORAGE_ULR", "DATA_DIRR"}  # this module's own typos
    refused = {n for n in named if n not in config.SETTINGS and n not in config.ELSEWHERE
               and not n.startswith(config.ELSEWHERE_PREFIXES)}
    assert not refused, sorted(refused)
