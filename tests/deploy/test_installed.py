"""The wheel as users install it, run as they run it: installed by pip, not editable, in fresh venvs
outside the checkout (tests/shipped.py), every program started from an empty folder with an environment
in which nothing of the checkout can be imported (no PYTHONPATH, no folder of it on PATH).

The server, ``pip install 'cachesvc[server]'``: its console scripts run `cachesvc db upgrade`,
`token create`, `serve` (answering /healthz, /readyz and the pages, whose templates and assets are data
files of the wheel), `gc` and `purge --dry-run`; its client publishes a snapshot of plain files through
that service and restores it. The light client, ``pip install cachesvc`` (no extras, so no torch and no
server parts): `cachesvc-client env`, `check`, `restore` and `status` against the same service. The light
install's server commands (one line saying what to install) are tests/service/test_light_install.py's,
from the same wheel; the image's own steps are tests/deploy/test_image_and_compose.py's.
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator

import pytest
import requests

from tests import shipped
from tests.deploy.processes import Program, free_port
from tests.helpers import ENV

NAME, SHAPE = "plain", "f32[1]"
#: the key's environment, given as a container without torch gives it (CACHESVC_ENV_<FIELD>)
KEY_ENV = {f"CACHESVC_ENV_{k.upper()}": v for k, v in ENV.items()}
#: a snapshot of plain files: a large compressible one (sent alone, zstd) and small ones (sent in a pack)
FILES = {"fxgraph/ab/large.txt": b"a compiled kernel, or near enough\n" * 20000,
         "fxgraph/cd/small": b"small\n", "aotautograd/ef/entry": b"\x00\x01" * 100}


@dataclass
class Installed:
    url: str
    env: Dict[str, str]   # the service's container (its console scripts first on PATH)
    work: Path            # the empty folder every command runs from
    tokens: Dict[str, str]

    def run(self, *argv: str, env=None) -> subprocess.CompletedProcess:
        done = subprocess.run(list(argv), env=env or self.env, cwd=self.work, capture_output=True, text=True,
                              timeout=180)
        assert "Traceback" not in done.stderr, done.stderr
        return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Iterator[Installed]:
    """`cachesvc serve` of the server venv on a free port, its database made by `cachesvc db upgrade`."""
    server = shipped.venv("server")
    base = tmp_path_factory.mktemp("installed")
    work = base / "work"
    work.mkdir()
    env = shipped.bare_env(base / "service", server, CACHESVC_DATA_DIR=str(base / "data"))
    svc = Installed("", env, work, {})
    upgraded = svc.run("cachesvc", "db", "upgrade")
    assert upgraded.returncode == 0 and "head" in upgraded.stdout, upgraded.stderr
    for scope in ("write", "admin"):
        made = svc.run("cachesvc", "token", "create", "--scope", scope, "--name", f"installed-{scope}")
        assert made.returncode == 0, made.stderr
        svc.tokens[scope] = made.stdout.split()[-1]
    port = free_port()
    svc.url = f"http://127.0.0.1:{port}"
    program = Program(["cachesvc", "serve", "--port", str(port), "--workers", "1"], env, cwd=work)
    try:
        program.wait_for_answer(f"{svc.url}/healthz")
        yield svc
    finally:
        program.proc.terminate()
        program.finish(60)
        program.stop()


def container(base: Path, venv: shipped.Venv, svc: Installed, **extra: str) -> Dict[str, str]:
    """A fresh container of ``venv``'s client: its own HOME, TMPDIR and cache dir, the service's URL."""
    return shipped.bare_env(base, venv, TORCHINDUCTOR_CACHE_DIR=str(base / "cache"), CACHESVC_URL=svc.url,
                            **KEY_ENV, **extra)


@pytest.fixture(scope="module")
def published(installed, tmp_path_factory) -> dict:
    """The installed server's client publishes FILES (the publish report)."""
    env = container(tmp_path_factory.mktemp("publisher"), shipped.venv("server"), installed,
                    CACHESVC_TOKEN=installed.tokens["write"])
    for rel, data in FILES.items():
        path = Path(env["TORCHINDUCTOR_CACHE_DIR"], rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    done = installed.run("cachesvc-client", "publish", "--name", NAME, "--shape", SHAPE, "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_installed_programs_import_the_wheel_not_the_checkout(installed):
    venv = shipped.venv("server")
    site = shipped.purelib(venv)
    where = shipped.imported_from(venv, ["cachesvc", "cachesvc.content", "cachesvc.migrations", "cachesvc.cli",
                                         "cachesvc_client", "cachesvc_client.transport"], installed.env, installed.work)
    for module, path in where.items():
        assert Path(path).is_relative_to(site) and not Path(path).resolve().is_relative_to(shipped.ROOT), (module, path)
    for script in ("cachesvc", "cachesvc-client"):  # console scripts of the wheel's entry points, on this venv
        assert (venv.bin / script).read_text().splitlines()[0] == f"#!{venv.python}", script


def test_serve_answers_health_readiness_pages_and_docs(installed):
    for path in ("/healthz", "/readyz"):
        answer = requests.get(installed.url + path, timeout=10)
        assert answer.status_code == 200 and answer.json()["status"] == "ok", (path, answer.text)
    # the wheel's data files at work: the pages' templates and stylesheet, Swagger UI's page and script
    admin = {"Authorization": f"Bearer {installed.tokens['admin']}"}
    for path, said in (("/", "cachesvc"), ("/assets/cachesvc.css", "{"), ("/api/v1/docs", "swagger"),
                       ("/api/v1/docs/init.js", "SwaggerUIBundle"), ("/admin/tokens", "installed-write")):
        answer = requests.get(installed.url + path, headers=admin, timeout=10)
        assert answer.status_code == 200 and said in answer.text, (path, answer.status_code, answer.text[:300])


def test_the_admin_commands_work(installed):
    again = installed.run("cachesvc", "db", "upgrade")
    assert again.returncode == 0 and "at revision" in again.stdout, again
    current = installed.run("cachesvc", "db", "current")
    assert current.returncode == 0 and "head" in current.stdout, current
    listed = installed.run("cachesvc", "token", "list")
    assert listed.returncode == 0 and "installed-write" in listed.stdout, listed
    gc = installed.run("cachesvc", "gc")
    assert gc.returncode == 0 and gc.stdout.startswith("gc: "), gc
    purge = installed.run("cachesvc", "purge", "--not-restored-for", "30", "--dry-run")
    assert purge.returncode == 0 and "would purge 0 version(s)" in purge.stdout, purge
    over_http = installed.run("cachesvc", "gc", "--url", installed.url, "--token", installed.tokens["admin"])
    assert over_http.returncode == 0 and over_http.stdout.startswith("gc: "), over_http


def test_the_installed_client_publishes_and_restores_through_it(installed, published, tmp_path):
    assert published["status"] == "committed" and published["files"] == len(FILES), published
    assert published["uploaded_packs"] >= 1 and published["uploaded_blobs"] > published["uploaded_packs"], published
    env = container(tmp_path, shipped.venv("server"), installed)
    done = installed.run("cachesvc-client", "restore", "--name", NAME, "--shape", SHAPE, "--json", env=env)
    assert done.returncode == 0 and json.loads(done.stdout)["hit"], done.stdout + done.stderr
    for rel, data in FILES.items():
        assert Path(env["TORCHINDUCTOR_CACHE_DIR"], rel).read_bytes() == data, rel


def test_the_light_client_checks_restores_and_tells_its_status(installed, published, tmp_path):
    light = shipped.venv("light")
    env = container(tmp_path, light, installed)
    probe = installed.run("python", "-c", "import importlib.util as u; print([m for m in ('torch', 'flask', "
                          "'sqlalchemy', 'gunicorn', 'boto3') if u.find_spec(m)])", env=env)
    assert probe.stdout.strip() == "[]", probe
    made = installed.run("cachesvc-client", "env", "--json", env=env)
    assert made.returncode == 0 and json.loads(made.stdout) == ENV, made
    env_file = tmp_path / "env.json"
    env_file.write_text(made.stdout)
    key = ["--name", NAME, "--shape", SHAPE, "--env-file", str(env_file)]
    bare = {k: v for k, v in env.items() if k not in KEY_ENV}  # the env file alone gives the key
    check = installed.run("cachesvc-client", "check", *key, env=bare)
    assert check.returncode == 0 and "hit" in check.stdout, check
    done = installed.run("cachesvc-client", "restore", *key, "--json", env=bare)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["hit"] and report["files"] == len(FILES), done.stderr
    assert Path(env["TORCHINDUCTOR_CACHE_DIR"], "fxgraph/ab/large.txt").read_bytes() == FILES["fxgraph/ab/large.txt"]
    status = installed.run("cachesvc-client", "status", "--json", env=bare)
    s = json.loads(status.stdout)
    assert status.returncode == 0 and s["restored"] and s["files"]["in_place"] == len(FILES), status
