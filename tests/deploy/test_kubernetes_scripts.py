"""The programs the manifests run, taken from the rendered objects and run for real here: the
service's wait-for-migrations init container, the retention CronJob, the publisher sidecar and
the restoring init container. Paths the pods mount are mapped into tmp_path."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from cachesvc.models import Entry, Version
from tests.deploy.k8s import container, environment, get, pod_spec, render
from tests.deploy.processes import BIN, SQLITE_LOCAL, Program, base_env
from tests.helpers import key, publish



# ------------------------------------------------------------------ wait-for-migrations


def test_the_service_pod_waits_for_the_migration_job_then_starts(tmp_path):
    spec = pod_spec(get(render("overlays/production"), "Deployment", "cachesvc"))
    argv = [sys.executable if a == "python" else a for a in container(spec, "wait-for-migrations")["command"]]
    url = f"sqlite:///{tmp_path / 'cachesvc.db'}"
    env = base_env(tmp_path, CACHESVC_DATABASE_URL=url, CACHESVC_DATA_DIR=str(tmp_path / "data"))
    waiting = Program(argv, env)
    try:
        waiting.wait_for("waiting for the cachesvc-migrate Job: schema at none, this release needs")
        assert waiting.proc.poll() is None
        migrate = subprocess.run([str(BIN / "cachesvc"), "db", "upgrade"], env=env, capture_output=True,
                                 text=True, timeout=300)
        assert migrate.returncode == 0, migrate.stderr
        assert waiting.finish() == 0, waiting.lines
    finally:
        waiting.stop()


# --------------------------------------------------------------------------- retention


def retention(objects=None):
    cronjob = get(objects or render("overlays/production"), "CronJob", "cachesvc-retention")
    purge = pod_spec(cronjob)["containers"][0]
    argv = [sys.executable if a == "python" else a for a in purge["command"]]
    return argv, environment(render("overlays/production"), purge)


@SQLITE_LOCAL
def test_retention_purges_through_the_admin_api_with_its_token(live_server, client, tokens, tmp_path):
    argv, env = retention()
    for i in range(2):
        publish(client, {f"fx/{i}": b"graph %d" % i}, key("old-model"))
    run_env = base_env(tmp_path, CACHESVC_URL=live_server.url, CACHESVC_TOKEN=tokens["admin"],
                       RETENTION_CRITERIA=env["RETENTION_CRITERIA"])
    nightly = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=120)
    assert nightly.returncode == 0, nightly.stderr
    assert nightly.stdout.startswith("purged 0 version(s)")  # both were restored never, but made today

    run_env["RETENTION_CRITERIA"] = json.dumps({"older_than": 0, "keep_latest": 1})
    now = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=120)
    assert now.returncode == 0, now.stderr
    assert now.stdout.startswith("purged 1 version(s)")


@SQLITE_LOCAL
def test_retention_says_why_it_failed(live_server, tokens, tmp_path):
    argv, env = retention()
    run_env = base_env(tmp_path, CACHESVC_URL=live_server.url, CACHESVC_TOKEN=tokens["read"],
                       RETENTION_CRITERIA=env["RETENTION_CRITERIA"])
    refused = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr and "admin" in refused.stderr
    assert "Traceback" not in refused.stderr

    run_env.update(CACHESVC_URL="http://127.0.0.1:9", CACHESVC_TOKEN=tokens["admin"])
    down = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 1 and "is the cachesvc Service up?" in down.stderr
    assert "Traceback" not in down.stderr


# -------------------------------------------------------------- the inference pods


def pod_env(tmp_path: Path, c: dict, objects, **extra) -> dict:
    """``c``'s environment from the manifest, its absolute paths moved under tmp_path/<pod>."""
    env = base_env(tmp_path)
    for k, v in environment(objects, c).items():
        if isinstance(v, str):
            env[k] = str(tmp_path / v.lstrip("/")) if v.startswith("/") else v
    env.update(extra)
    for k in ("TORCHINDUCTOR_CACHE_DIR", "HOME", "TMPDIR"):
        Path(env[k]).mkdir(parents=True, exist_ok=True)
    return env


def env_file(env: dict) -> None:
    """What the app image's build step writes (`cachesvc-client env --json > $CACHESVC_ENV_FILE`)."""
    path = Path(env["CACHESVC_ENV_FILE"])
    path.parent.mkdir(parents=True, exist_ok=True)
    for argv in (["cachesvc-client", "env", "--json"], ["cachesvc-client", "env"]):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode == 0:
            path.write_text(proc.stdout)
            return
    pytest.fail(f"cachesvc-client env failed: {proc.stderr}")


def compiled_files(env: dict) -> dict:
    """Files where a warmed-up process leaves them: Inductor's cache dir and the PCH under TMPDIR."""
    cache, tmp = Path(env["TORCHINDUCTOR_CACHE_DIR"]), Path(env["TMPDIR"])
    files = {cache / "fxgraph/ab/fabc/entry": b"fx graph", cache / "xy/cxy.main.so": b"\x7fELF kernel",
             tmp / "torchinductor_app/precompiled_headers/cgd6.h.gch": b"pch" * 100}
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


@SQLITE_LOCAL
def test_the_sidecar_publishes_once_the_app_has_written_the_warm_up_file(app, live_server, tokens, tmp_path):
    objects = render("examples/inference")
    spec = pod_spec(get(objects, "Deployment", "model-warmup"))
    sidecar = container(spec, "publish-compile-cache")
    env = pod_env(tmp_path / "pod", sidecar, objects, CACHESVC_URL=live_server.url, CACHESVC_TOKEN=tokens["write"])
    env_file(env)
    files = compiled_files(env)
    warm = Path(env["WARMUP_DONE_FILE"])
    warm.parent.mkdir(parents=True, exist_ok=True)
    program = Program(sidecar["command"], env)
    try:
        program.wait_for("waiting for")
        time.sleep(6)  # a round of its poll: nothing may go out before the app says so
        with app.extensions["cachesvc"].db.session() as s:
            assert s.scalars(select(Version)).all() == []
        warm.write_text("12.5\n")  # the app: warm-up done, its compiles took 12.5 s
        program.wait_for("published; idling", timeout=300)
        assert program.proc.poll() is None  # it idles: the pod stays Running
    finally:
        program.stop()
    with app.extensions["cachesvc"].db.session() as s:
        (version,) = s.scalars(select(Version)).all()
        entry = s.get(Entry, version.entry_id)
        assert (entry.name, entry.shape, version.compile_seconds) == ("resnet50", "f32[8,3,224,224]", 12.5)
        assert version.file_count == len(files)


def restore_supports_env_file() -> bool:
    proc = subprocess.run([str(BIN / "cachesvc-client"), "restore", "--help"], capture_output=True, text=True,
                          timeout=60)
    return "--env-file" in proc.stdout


@SQLITE_LOCAL
def test_the_init_container_restores_what_the_sidecar_published(live_server, tokens, tmp_path):
    if not restore_supports_env_file():
        pytest.skip("this cachesvc-client has no `restore --env-file` yet (issue 16, item 2)")
    objects = render("examples/inference")
    warm_spec = pod_spec(get(objects, "Deployment", "model-warmup"))
    publisher = pod_env(tmp_path / "warm", container(warm_spec, "publish-compile-cache"), objects,
                        CACHESVC_URL=live_server.url, CACHESVC_TOKEN=tokens["write"])
    env_file(publisher)
    files = compiled_files(publisher)
    published = subprocess.run(["cachesvc-client", "publish", "--name", "resnet50", "--shape", "f32[8,3,224,224]"],
                               env=publisher, capture_output=True, text=True, timeout=300)  # as the sidecar does
    assert published.returncode == 0, published.stderr

    init = container(pod_spec(get(objects, "Deployment", "model-server")), "restore-compile-cache")
    env = pod_env(tmp_path / "serve", init, objects, CACHESVC_URL=live_server.url, CACHESVC_TOKEN=tokens["read"])
    Path(env["CACHESVC_ENV_FILE"]).parent.mkdir(parents=True, exist_ok=True)
    Path(env["CACHESVC_ENV_FILE"]).write_text(Path(publisher["CACHESVC_ENV_FILE"]).read_text())
    argv = [str(tmp_path / "serve" / a.lstrip("/")) if a.startswith("/etc/") else a for a in init["command"]]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for path, data in files.items():
        moved = tmp_path / "serve" / path.relative_to(tmp_path / "warm")
        assert moved.read_bytes() == data, moved
