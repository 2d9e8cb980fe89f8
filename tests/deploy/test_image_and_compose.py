"""The service image (Dockerfile, .dockerignore) and docker-compose.yml.

There is no container engine on this machine: the image's build and run steps are replayed instead
(tests/deploy/image.py: its pip install of the copied sources, its user, environment, entry point and
command), and its own commands run from that replay as the container would run them: `db upgrade` as a
separate step, `serve` that refuses an old schema instead of migrating, nginx in front, the HEALTHCHECK,
the access log on stdout. docker-compose.yml is checked by
`docker compose config` where the compose plugin is installed, else against the Compose
Specification's JSON schema (check-jsonschema's vendored copy), and for agreement between its
services with the values of .env.example."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import pytest
import requests
import yaml
from dockerfile_parse import DockerfileParser
from docker.utils.build import exclude_paths

from cachesvc import config
from cachesvc.storage import from_url
from cachesvc.storage.s3 import S3Storage
from tests.deploy.k8s import ROOT
from tests.deploy.image import Image, replay
from tests.deploy.processes import free_port



def dockerfile() -> DockerfileParser:
    return DockerfileParser(str(ROOT / "Dockerfile"))


def final_stage() -> list:
    """The instructions of the image's last stage."""
    structure = dockerfile().structure
    last_from = max(i for i, ins in enumerate(structure) if ins["instruction"] == "FROM")
    return structure[last_from:]


def instruction(name: str) -> str:
    found = [ins["value"] for ins in final_stage() if ins["instruction"] == name]
    assert len(found) == 1, (name, found)
    return found[0]


# ----------------------------------------------------------------------------- the image


def test_the_base_image_is_pinned_by_tag_and_digest():
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", dockerfile().baseimage)


def test_the_image_runs_as_its_own_unprivileged_user():
    user = instruction("USER")
    assert re.fullmatch(r"[1-9]\d{3,}:[1-9]\d{3,}", user), "numeric, so Kubernetes can check runAsNonRoot"
    run = " ".join(ins["value"] for ins in final_stage() if ins["instruction"] == "RUN")
    assert f"--uid {user.split(':')[0]}" in run


def test_the_image_starts_the_service_and_never_migrates_at_start():
    entrypoint, cmd = json.loads(instruction("ENTRYPOINT")), json.loads(instruction("CMD"))
    assert entrypoint == ["cachesvc"] and cmd[0] == "serve"
    assert "upgrade" not in cmd and "db" not in cmd
    assert "db upgrade" in (ROOT / "Dockerfile").read_text().split("FROM", 1)[0]  # the header says how


def test_the_build_context_holds_the_sources_and_nothing_secret_or_local():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    context = exclude_paths(str(ROOT), patterns)
    for needed in ("pyproject.toml", "README.md", "cachesvc/app.py", "client/client.py", "migrations/env.py"):
        assert needed in context, needed
    for copied in (ins["value"].split()[:-1] for ins in dockerfile().structure
                   if ins["instruction"] == "COPY" and "--from" not in ins["value"]):
        for src in copied:
            assert src in context, src
    for kept_out in (".env", ".venv", ".git", "tests", "bench", "docs", "deploy", "cachesvc-data"):
        assert not [p for p in context if p == kept_out or p.startswith(kept_out + "/")], kept_out
    assert not [p for p in context if "__pycache__" in p]


@pytest.fixture(scope="module")
def image() -> Iterator[Image]:
    """The image's build and run steps replayed here (tests/deploy/image.py says what differs from the real
    image: there is no container engine on this machine)."""
    root = Path(tempfile.mkdtemp(prefix="cachesvc-image-"))
    try:
        root.chmod(0o755)  # as an image's / is: its user reaches /opt/cachesvc (pytest's own folders are 0700)
        yield replay(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_images_commands_migrate_apart_then_serve_behind_nginx_with_access_log_and_healthcheck(image):
    """The image's steps as compose and Kubernetes run them: `db upgrade` apart (serve refuses an old schema
    rather than migrate), then the bare image (its CMD) serving through nginx, as the image's user, with the
    access log on stdout and its HEALTHCHECK passing."""
    port = free_port()
    data = Path(image.env["CACHESVC_DATA_DIR"])  # the image's /var/lib/cachesvc
    env = dict(image.env, CACHESVC_DATABASE_URL=f"sqlite:///{data / 'index.db'}",
               CACHESVC_AUTO_MIGRATE="false")  # as compose and Kubernetes set it
    refused = image.run(image.cmd, env)
    assert refused.returncode != 0 and "run `cachesvc db upgrade`" in refused.stderr + refused.stdout

    migrate = image.run(["db", "upgrade"], env)
    assert migrate.returncode == 0, migrate.stderr
    # the log file is closed on every way out: left open by a failed assert, its ResourceWarning was
    # raised in the next test's setup, an error there for this test's failure
    with open(image.root / "stdout.log", "w+") as log:
        access, served = _serve_and_check_health(image, env, port, log)
    assert re.search(r'"GET /healthz HTTP/1\.1" 200', access), access[-2000:]
    assert served.headers["Server"].startswith("nginx"), "CACHESVC_SERVE_PROXY: nginx answers in front"
    if image.user is not None:  # what the service wrote is its user's: it wrote nothing anywhere else
        assert {(p.stat().st_uid, p.stat().st_gid) for p in data.rglob("*")} == {image.user}


def _serve_and_check_health(image: Image, env: dict, port: int, log) -> tuple:
    """Run the image's CMD with stdout to ``log`` until /healthz and the HEALTHCHECK pass: (the log, the
    /healthz answer)."""
    proc = subprocess.Popen(image.argv(image.cmd, port), env=env, cwd=image.workdir, stdout=log, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                served = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
                if served.status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the service did not answer /healthz in 120 s"
            time.sleep(0.3)
        assert image.healthcheck[0] == "python"
        healthy = subprocess.run(image.as_user(image.healthcheck, port), env=env, cwd=image.workdir,
                                 capture_output=True, text=True, timeout=60)
        assert healthy.returncode == 0, healthy.stderr
    finally:
        proc.terminate()
        proc.wait(60)
        proc.stderr.close()
    log.seek(0)
    return log.read(), served


# ---------------------------------------------------------------------------- compose


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def env_example() -> dict:
    pairs = (line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def interpolate(value, variables: dict):
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} (the forms docker-compose.yml uses), and $$."""
    if isinstance(value, dict):
        return {k: interpolate(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, variables) for v in value]
    if not isinstance(value, str):
        return value

    def one(m):
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if variables.get(name):
            return variables[name]
        if op == ":-":
            return arg
        raise AssertionError(f"${{{name}}} is unset: {arg}")

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, value.replace("$$", "\0")).replace("\0", "$")


def check_jsonschema(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                           str(path)], capture_output=True, text=True, timeout=120)


def test_compose_file_is_valid(tmp_path):
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    shutil.copy(ROOT / "docker-compose.yml", tmp_path / "docker-compose.yml")
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        done = subprocess.run([docker, "compose", "config", "--quiet"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    valid = check_jsonschema(tmp_path / "docker-compose.yml")
    assert valid.returncode == 0, valid.stdout + valid.stderr
    broken = compose()
    broken["services"]["cachesvc"]["depends_on"]["migrate"]["condition"] = "service_finished"
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(broken))
    assert check_jsonschema(tmp_path / "broken.yml").returncode != 0  # the schema check can fail


def test_compose_images_are_pinned_and_long_running_services_restart():
    services = compose()["services"]
    for name, svc in services.items():
        image = svc["image"]
        assert ":" in image and not image.endswith((":latest", ":16")), (name, image)
    assert "@sha256:" in services["postgres"]["image"]
    for name in ("postgres", "minio", "cachesvc"):
        assert services[name]["restart"] == "unless-stopped", name
    for name in ("minio-bucket", "migrate"):
        assert services[name]["restart"] == "no", name


def test_compose_migrates_once_in_its_own_service_before_the_service_starts():
    services = compose()["services"]
    migrate, svc = services["migrate"], services["cachesvc"]
    assert migrate["command"] == ["db", "upgrade"] and migrate["image"] == svc["image"]
    assert "command" not in svc  # the image's CMD: serve
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert svc["depends_on"] == {"migrate": {"condition": "service_completed_successfully"},
                                 "minio-bucket": {"condition": "service_completed_successfully"}}
    assert services["minio-bucket"]["depends_on"]["minio"]["condition"] == "service_healthy"


def test_compose_credentials_come_from_the_env_file_that_git_ignores():
    text = (ROOT / "docker-compose.yml").read_text()
    defined = env_example()
    for name in set(re.findall(r"\$\{(\w+)", text)):
        assert name in defined, f"${{{name}}} is used by docker-compose.yml but not in .env.example"
    for svc in compose()["services"].values():
        for k, v in (svc.get("environment") or {}).items():
            if re.search(r"PASSWORD|SECRET|ACCESS_KEY|DATABASE_URL", k):
                assert "${" in str(v), (k, "must come from .env")
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT)
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", ".env.example"], cwd=ROOT, capture_output=True)
    assert ignored.returncode == 0 and tracked.returncode == 0


def test_compose_services_agree_with_each_other_with_the_example_values():
    services = interpolate(compose()["services"], env_example())
    env = services["cachesvc"]["environment"]
    assert env == services["migrate"]["environment"]
    names = {k[len("CACHESVC_"):] for k in env if k.startswith("CACHESVC_")}
    assert names <= set(config.SETTINGS), names - set(config.SETTINGS)
    db = urlparse(env["CACHESVC_DATABASE_URL"])
    pg = services["postgres"]["environment"]
    assert (db.username, db.password, db.hostname, db.path.lstrip("/")) == (
        pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], "postgres", pg["POSTGRES_DB"])
    minio = services["minio"]["environment"]
    assert (env["CACHESVC_S3_ACCESS_KEY_ID"], env["CACHESVC_S3_SECRET_ACCESS_KEY"]) == (
        minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])
    assert urlparse(env["CACHESVC_S3_ENDPOINT_URL"]).hostname == "minio"
    assert services["minio-bucket"]["environment"]["BUCKET"] == urlparse(env["CACHESVC_STORAGE_URL"]).netloc
    assert '"local/$BUCKET"' in services["minio-bucket"]["entrypoint"][-1]
    settings = config.load({}, environ=env)
    assert settings.AUTO_MIGRATE is False and settings.GC_INTERVAL_SECONDS > 0
    assert isinstance(from_url(settings.STORAGE_URL, config.s3_options(settings)), S3Storage)
    with pytest.raises(AssertionError, match="copy .env.example to .env"):  # no .env: compose stops, says why
        interpolate(compose()["services"], {})
