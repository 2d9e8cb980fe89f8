"""The light install (`pip install cachesvc`, no server extras): its `cachesvc` says in one line what to
install for the server commands, and its admin commands work over HTTP with --url.

The install is the run's wheel, installed by pip with no extras in a fresh venv (tests/shipped.py): the
client's five dependencies and nothing else, so flask, sqlalchemy, gunicorn and the rest are absent as
they would be.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import shipped
from tests.helpers.backends import LOCAL, SQLITE


@pytest.fixture(scope="module")
def light_python(tmp_path_factory) -> Path:
    """The light venv's python, in a folder of its own (the programs' HOME and working folder)."""
    base = tmp_path_factory.mktemp("light")
    (base / "venv").symlink_to(shipped.venv("light").root)
    return base / "venv" / "bin" / "python"


def light(python: Path, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "cachesvc.cli", *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(python.parents[2]), "LANG": "C.UTF-8", **(env or {})},
                          cwd=python.parents[2])


def test_the_light_install_has_the_client_and_none_of_the_server(light_python):
    probe = "import importlib.util as u; print([m for m in %r if u.find_spec(m)])"
    got = subprocess.run([str(light_python), "-c", probe % (["requests", "zstandard", "filelock", "click", "tqdm",
                                                             "flask", "sqlalchemy", "gunicorn", "alembic", "boto3",
                                                             "marshmallow", "prometheus_client"],)],
                         capture_output=True, text=True, timeout=60)
    assert got.stdout.strip() == "['requests', 'zstandard', 'filelock', 'click', 'tqdm']", got


@pytest.mark.parametrize("args", [("serve",), ("db", "upgrade"), ("db", "current"), ("token", "list"),
                                  ("purge", "--name", "x"), ("gc",)])
def test_server_commands_say_in_one_line_what_to_install(light_python, args):
    done = light(light_python, *args)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done
    [line] = done.stderr.strip().splitlines()
    assert "pip install 'cachesvc[server]'" in line and "is not installed" in line
    assert ("--url" in line) == (args[0] in ("token", "purge", "gc"))
    assert not (light_python.parents[2] / "cachesvc-data").exists()


@SQLITE
@LOCAL
def test_admin_commands_work_over_http_from_the_light_install(light_python, live_server, tokens):
    env = {"CACHESVC_URL": live_server.url, "CACHESVC_TOKEN": tokens["admin"]}
    made = light(light_python, "token", "create", "--scope", "read", "--name", "from-light", env=env)
    assert made.returncode == 0 and made.stdout.splitlines()[-1].startswith("cs_"), made
    listed = light(light_python, "token", "list", env=env)
    assert listed.returncode == 0 and "from-light" in listed.stdout and "test-admin" in listed.stdout
    dry = light(light_python, "purge", "--not-restored-for", "30", "--dry-run", env=env)
    assert dry.returncode == 0 and "would purge 0 version(s)" in dry.stdout, dry
    bad = light(light_python, "purge", "--keep-latest", "-1", env=env)
    assert bad.returncode == 2 and "--keep-latest" in bad.stderr and "Traceback" not in bad.stderr
    assert light(light_python, "gc", env=env).stdout.startswith("gc: 0 blobs")
    assert light(light_python, "token", "revoke", "from-light", env=env).returncode == 0
    assert light(light_python, "--help").returncode == 0
