"""CACHESVC_PRODUCTION (issue 26 row 11): a service for a fleet refuses to start without a real, shared
SECRET_KEY (unset, a placeholder copied from secret.example.yaml, or short) or with COOKIE_SECURE off;
the embedded dev server (the setting's default, off) still starts with a random key."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

import cachesvc
from cachesvc import config
from tests.deploy.k8s import KUSTOMIZE_ROOT

GOOD = "3f" * 32


def _example_secret_key() -> str:
    docs = yaml.safe_load_all((KUSTOMIZE_ROOT / "overlays/production/secret.example.yaml").read_text())
    return next(d for d in docs if d["metadata"]["name"] == "cachesvc")["stringData"]["secret-key"]


@pytest.mark.parametrize("key,cookie_secure,says", [
    (None, True, "CACHESVC_SECRET_KEY is unset"),
    ("CHANGE-ME", True, "placeholder"),
    ("the-example", True, "placeholder"),
    ("abc123", True, "fewer than 32"),
    (GOOD, False, "CACHESVC_COOKIE_SECURE is off"),
])
def test_production_refuses_to_start_without_a_real_key_and_secure_cookies(tmp_path, key, cookie_secure, says):
    with pytest.raises(SystemExit) as refused:
        cachesvc.create_app({"DATA_DIR": str(tmp_path), "PRODUCTION": True, "SECRET_KEY": key,
                             "COOKIE_SECURE": cookie_secure, "TESTING": True})
    assert says in str(refused.value) and "secrets.token_hex(32)" in str(refused.value)


def test_the_examples_secret_key_is_refused():
    with pytest.raises(SystemExit, match="placeholder"):
        config.check_production(config.load({"PRODUCTION": True, "SECRET_KEY": _example_secret_key(),
                                             "COOKIE_SECURE": True}, environ={}))


def test_production_starts_with_a_real_key_and_dev_without_any(tmp_path):
    from cachesvc import db

    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        db.upgrade(f"sqlite:///{tmp_path / sub / 'cachesvc.db'}")
    fleet = cachesvc.create_app({"DATA_DIR": str(tmp_path / "a"), "PRODUCTION": True, "SECRET_KEY": GOOD,
                                 "COOKIE_SECURE": True, "TESTING": True})
    assert fleet.config["SECRET_KEY"] == GOOD and fleet.config["SESSION_COOKIE_SECURE"]
    dev = cachesvc.create_app({"DATA_DIR": str(tmp_path / "b"), "TESTING": True})
    assert dev.config["SECRET_KEY"] and not config.load({"DATA_DIR": str(tmp_path)}).PRODUCTION


def test_serve_in_production_without_a_key_exits_with_one_line_before_it_listens(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESVC_")}
    env.update(CACHESVC_PRODUCTION="true", CACHESVC_DATA_DIR=str(tmp_path), CACHESVC_COOKIE_SECURE="true")
    out = subprocess.run([sys.executable, "-m", "cachesvc.cli", "serve", "--port", "1"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "CACHESVC_SECRET_KEY is unset" in out.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "cachesvc.db").exists(), "refused before migrating"
