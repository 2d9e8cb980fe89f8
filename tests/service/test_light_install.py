"""The light install (`pip install cachesvc`, no server extras): its `cachesvc` says in one line what to
install for the server commands, and its admin commands work over HTTP with --url.

The venv is made here with no network: `python -m venv --without-pip`, and a .pth that points at a
folder of links to this checkout's two packages and to the client's dependencies only (the closure
of the distribution's requirements without extras, read from the installed metadata), so flask,
sqlalchemy, gunicorn and the rest are absent as they would be.
"""
from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Set

import pytest
from packaging.requirements import Requirement

from tests.service.test_purge_gc import LOCAL, SQLITE

ROOT = Path(__file__).resolve().parents[2]


def client_closure() -> Set[str]:
    """Distributions `pip install cachesvc` brings: its requirements without extras, recursively."""
    seen: Set[str] = set()
    todo = ["cachesvc"]
    while todo:
        name = todo.pop()
        for line in md.requires(name) or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if req.name.lower() not in seen:
                seen.add(req.name.lower())
                todo.append(req.name)
    return seen


@pytest.fixture(scope="module")
def light_python(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("light")
    links = base / "site"
    links.mkdir()
    (links / "cachesvc").symlink_to(ROOT / "cachesvc")
    (links / "cachesvc_client").symlink_to(ROOT / "client")
    for name in client_closure():
        dist = md.distribution(name)
        for top in {f.parts[0] for f in dist.files or () if ".." not in f.parts and not f.parts[0].endswith(".pth")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (links / top).exists() and top != "__pycache__":
                (links / top).symlink_to(source)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True, timeout=120)
    python = base / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "client-deps.pth").write_text(f"{links}\n")
    assert sysconfig.get_paths()["purelib"] != purelib
    return python


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
