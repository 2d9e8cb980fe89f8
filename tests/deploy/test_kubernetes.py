"""deploy/kubernetes: every kustomization renders with `kubectl kustomize`, every object validates
against the Kubernetes schemas (kubernetes-validate, strict), and the objects say what
docs/kubernetes.md promises: non-root pods, probes on /healthz, one migration Job per release,
secrets only by reference, and inference pods that restore with a read token and the env file."""
from __future__ import annotations

import re
import shutil
import tomllib

import kubernetes_validate
import pytest
import yaml

from cachesvc import config
from cachesvc.api import health
from cachesvc.storage import from_url
from cachesvc.storage.s3 import S3Storage
from tests.deploy.k8s import (KUSTOMIZE_ROOT, ROOT, container, containers, environment, get, kustomizations, mounts,
                              pod_spec, render, render_dir, workloads)
from tests.deploy.processes import SQLITE_LOCAL

#: The oldest Kubernetes the manifests are written for, and the newest the validator knows.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
SERVICE_OVERLAYS = ("overlays/production", "overlays/minimal")
#: API groups of custom resources the overlays use (the Prometheus Operator's ServiceMonitor)
CRD_GROUPS = ("monitoring.coreos.com",)


def test_the_kustomizations_are_the_documented_ones():
    assert set(kustomizations()) == {"base", "overlays/production", "overlays/minimal", "examples/inference"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("kustomization", kustomizations())
def test_every_object_is_valid_against_the_kubernetes_schema(kustomization, version):
    objects = render(kustomization)
    assert objects
    for obj in objects:
        if obj["apiVersion"].split("/")[0] in CRD_GROUPS:  # not Kubernetes' own: test_kubernetes_platform.py
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{kustomization}: {obj['kind']}/{obj['metadata']['name']} is invalid for Kubernetes "
                        f"{version}: {exc.message} at {'.'.join(map(str, exc.path))}")


def test_the_validator_rejects_what_kubernetes_would():
    """The check above can fail: a misspelt field and a string for an integer are refused."""
    deployment = get(render("overlays/production"), "Deployment", "cachesvc")
    typo = {**deployment, "spec": {**deployment["spec"], "replica": 3}}
    wrong_type = {**deployment, "spec": {**deployment["spec"], "replicas": "three"}}
    for bad in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)


# --------------------------------------------------------------------------- every pod


@pytest.mark.parametrize("kustomization", kustomizations())
def test_every_pod_runs_as_non_root_on_a_read_only_root_with_no_privilege(kustomization):
    pods = [(w, pod_spec(w)) for w in workloads(render(kustomization))]
    assert pods
    for w, spec in pods:
        where = f"{kustomization}: {w['kind']}/{w['metadata']['name']}"
        pod = spec.get("securityContext", {})
        assert pod.get("runAsNonRoot") is True, where
        assert isinstance(pod.get("runAsUser"), int) and pod["runAsUser"] > 0, where
        assert pod.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        assert spec.get("automountServiceAccountToken") is False, where
        for c in containers(spec):
            sc = c.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, (where, c["name"])
            assert sc.get("readOnlyRootFilesystem") is True, (where, c["name"])
            assert sc.get("privileged", False) is False, (where, c["name"])
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], (where, c["name"])
            assert not sc.get("capabilities", {}).get("add"), (where, c["name"])
            assert "runAsUser" not in sc or sc["runAsUser"] > 0, (where, c["name"])
            assert c.get("resources", {}).get("requests", {}).get("memory"), (where, c["name"])
            assert c.get("resources", {}).get("limits", {}).get("memory"), (where, c["name"])


def test_the_pods_user_is_the_images_user():
    """runAsUser 10001 is the user the Dockerfile creates and switches to."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--uid 10001" in dockerfile and re.search(r"^USER 10001:10001$", dockerfile, re.M)
    for w in workloads(render("overlays/production")):
        assert pod_spec(w)["securityContext"]["runAsUser"] == 10001, w["metadata"]["name"]


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_the_service_writes_only_to_its_empty_dirs_and_volumes(overlay):
    objects = render(overlay)
    spec = pod_spec(get(objects, "Deployment", "cachesvc"))
    c = container(spec, "cachesvc")
    mounted = mounts(spec, c)
    assert {"/tmp", "/var/lib/cachesvc"} <= set(mounted)
    assert environment(objects, c)["CACHESVC_DATA_DIR"] == "/var/lib/cachesvc"
    assert "emptyDir" in mounted["/tmp"]


# ----------------------------------------------------------------------- the service


@pytest.mark.parametrize("overlay,replicas", [("base", 2), ("overlays/production", None), ("overlays/minimal", 1)])
def test_replicas_service_and_disruption_budget_select_the_serving_pods(overlay, replicas):
    """Production leaves the count to its HPA (no `replicas`: an apply must not reset a scaled-up
    service) and has a disruption budget; minimal's single pod has none (it would protect nothing)."""
    objects = render(overlay)
    deployment = get(objects, "Deployment", "cachesvc")
    assert deployment["spec"].get("replicas") == replicas
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selects = lambda selector: all(labels.get(k) == v for k, v in selector.items())  # noqa: E731
    assert selects(deployment["spec"]["selector"]["matchLabels"])
    assert selects(get(objects, "Service", "cachesvc")["spec"]["selector"])
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert len(budgets) == (overlay == "overlays/production"), [b["metadata"]["name"] for b in budgets]
    for budget in budgets:
        assert selects(budget["spec"]["selector"]["matchLabels"])
    for other in workloads(objects):  # the migration and retention pods are never behind the Service
        if other is not deployment:
            other_labels = (other["spec"]["jobTemplate"]["spec"]["template"] if other["kind"] == "CronJob"
                            else other["spec"]["template"])["metadata"]["labels"]
            assert not all(other_labels.get(k) == v for k, v in get(objects, "Service", "cachesvc")["spec"]
                           ["selector"].items()), other["metadata"]["name"]


def test_production_scales_between_three_and_more_and_spreads_over_zones():
    objects = render("overlays/production")
    hpa = get(objects, "HorizontalPodAutoscaler", "cachesvc")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "cachesvc"}
    assert hpa["spec"]["minReplicas"] == 3 < hpa["spec"]["maxReplicas"]
    keys = [t["topologyKey"] for t in pod_spec(get(objects, "Deployment", "cachesvc"))["topologySpreadConstraints"]]
    assert sorted(keys) == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_readiness_asks_readyz_and_liveness_healthz_on_the_port_the_service_listens_on(overlay):
    spec = pod_spec(get(render(overlay), "Deployment", "cachesvc"))
    c = container(spec, "cachesvc")
    (port,) = [p for p in c["ports"] if p["name"] == "http"]
    args = c["args"]
    assert args[0] == "serve" and args[args.index("--port") + 1] == str(port["containerPort"]) == "8787"
    assert args[args.index("--host") + 1] == "0.0.0.0"
    for probe in ("startupProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    # Readiness asks the storage too, within its timeout (api/health.STORAGE_DEADLINE); liveness stays
    # the database's SELECT 1.
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert health.STORAGE_DEADLINE < c["readinessProbe"]["timeoutSeconds"]
    # Liveness gives up later than readiness: a database blip takes pods out of the Service but
    # does not restart them all.
    live, ready = c["livenessProbe"], c["readinessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > 4 * ready["periodSeconds"] * ready["failureThreshold"]


@SQLITE_LOCAL
def test_healthz_is_open_and_answers_200(app):
    """What the probes ask: no token, 200 while the database answers."""
    resp = app.test_client().get("/healthz")
    assert resp.status_code == 200 and resp.json["status"] == "ok"


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_settings_are_cachesvc_settings_and_secrets_come_from_secrets(overlay):
    objects = render(overlay)
    for w in workloads(objects):
        for c in containers(pod_spec(w)):
            env = environment(objects, c)
            unknown = {k for k in env if k.startswith("CACHESVC_") and k[len("CACHESVC_"):] not in config.SETTINGS
                       and k not in ("CACHESVC_URL", "CACHESVC_TOKEN")}
            assert not unknown, (w["metadata"]["name"], c["name"], unknown)
            for name in ("CACHESVC_DATABASE_URL", "CACHESVC_S3_ACCESS_KEY_ID", "CACHESVC_S3_SECRET_ACCESS_KEY",
                         "CACHESVC_TOKEN"):
                if name in env:
                    assert env[name][0] == "secret", (w["metadata"]["name"], c["name"], name)


def test_production_commits_no_secret_and_reads_postgres_and_s3_settings():
    objects = render("overlays/production")
    assert not [o for o in objects if o["kind"] == "Secret"]
    c = container(pod_spec(get(objects, "Deployment", "cachesvc")), "cachesvc")
    env = environment(objects, c)
    assert env["CACHESVC_DATABASE_URL"] == ("secret", "cachesvc", "database-url")
    plain = {k[len("CACHESVC_"):]: v for k, v in env.items() if isinstance(v, str) and k.startswith("CACHESVC_")}
    settings = config.load({}, environ={f"CACHESVC_{k}": v for k, v in plain.items()} | {
        "CACHESVC_DATABASE_URL": "postgresql+psycopg://cachesvc@db/cachesvc"})
    assert settings.AUTO_MIGRATE is False and settings.ANONYMOUS_READ is False
    assert settings.GC_INTERVAL_SECONDS > 0 and settings.LRU_BUDGET_BYTES > 0
    assert isinstance(from_url(settings.STORAGE_URL, config.s3_options(settings)), S3Storage)


# ----------------------------------------------------------------- migrations and GC


def test_migrations_run_in_one_job_per_release_and_never_in_a_serving_container():
    objects = render("overlays/production")
    deployment = get(objects, "Deployment", "cachesvc")
    image = container(pod_spec(deployment), "cachesvc")["image"]
    job = get(objects, "Job", "cachesvc-migrate-", prefix=True)
    assert job["metadata"]["name"] == f"cachesvc-migrate-{image.rsplit(':', 1)[1]}"
    (migrate,) = pod_spec(job)["containers"]
    assert migrate["args"] == ["db", "upgrade"] and migrate["image"] == image  # ENTRYPOINT is `cachesvc`
    assert re.search(r'^ENTRYPOINT \["cachesvc"\]$', (ROOT / "Dockerfile").read_text(), re.M)
    for c in containers(pod_spec(deployment)):
        assert "upgrade" not in c.get("args", []) + c.get("command", []), c["name"]
    wait = container(pod_spec(deployment), "wait-for-migrations")
    assert "schema_status" in wait["command"][-1]  # it only waits (tests/deploy/test_kubernetes_scripts.py)


def test_a_new_release_tag_names_a_new_migration_job(tmp_path):
    """`kubectl apply -k` of the next release creates a Job: the tag is copied into its name."""
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUSTOMIZE_ROOT, tree)
    copy = tree / "overlays" / "production"
    text = (copy / "kustomization.yaml").read_text()
    assert "newTag: 0.1.0" in text
    (copy / "kustomization.yaml").write_text(text.replace("newTag: 0.1.0", "newTag: 0.2.3"))
    objects = render_dir(copy)
    assert get(objects, "Job", "cachesvc-migrate-", prefix=True)["metadata"]["name"] == "cachesvc-migrate-0.2.3"
    assert {c["image"] for w in workloads(objects) for c in containers(pod_spec(w))} == {
        "registry.example.com/platform/cachesvc:0.2.3"}


def test_minimal_migrates_in_its_single_pods_init_container():
    objects = render("overlays/minimal")
    assert not [o for o in objects if o["kind"] == "Job"]
    deployment = get(objects, "Deployment", "cachesvc")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    spec = pod_spec(deployment)
    assert container(spec, "migrate")["command"] == ["cachesvc", "db", "upgrade"]
    for c in (container(spec, "migrate"), container(spec, "cachesvc")):
        assert mounts(spec, c)["/var/lib/cachesvc"] == {"name": "data",
                                                         "persistentVolumeClaim": {"claimName": "cachesvc-data"}}
    env = environment(objects, container(spec, "cachesvc"))
    assert get(objects, "Secret", env["CACHESVC_DATABASE_URL"][1])["data"]["database-url"]


def test_gc_is_the_services_scheduler_and_retention_holds_only_an_admin_token():
    """docs/kubernetes.md chooses the in-service scheduler: no workload runs `cachesvc gc`."""
    objects = render("overlays/production")
    for w in workloads(objects):
        for c in containers(pod_spec(w)):
            assert "gc" not in c.get("args", []) + c.get("command", [])[:2], (w["metadata"]["name"], c["name"])
    retention = get(objects, "CronJob", "cachesvc-retention")
    assert retention["spec"]["concurrencyPolicy"] == "Forbid"
    (purge,) = pod_spec(retention)["containers"]
    env = environment(objects, purge)
    assert env["CACHESVC_TOKEN"] == ("secret", "cachesvc-admin", "token")
    assert not [k for k in env if k in ("CACHESVC_DATABASE_URL", "CACHESVC_S3_SECRET_ACCESS_KEY")]
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    assert "CACHESVC_GC_INTERVAL_SECONDS" in doc and "advisory lock" in doc


# --------------------------------------------------------------- the inference examples

NAME_SHAPE = ["--name", "resnet50", "--shape", "f32[8,3,224,224]"]


def _cache_paths(env: dict) -> dict:
    return {k: env[k] for k in ("TORCHINDUCTOR_CACHE_DIR", "HOME", "TMPDIR")}


@pytest.mark.parametrize("deployment", ["model-server", "model-warmup"])
def test_the_init_container_restores_with_the_read_token_and_the_env_file(deployment):
    objects = render("examples/inference")
    spec = pod_spec(get(objects, "Deployment", deployment))
    init = container(spec, "restore-compile-cache")
    cmd = init["command"]
    assert cmd[:2] == ["cachesvc-client", "restore"]
    assert cmd[cmd.index("--env-file") + 1] == "/etc/cachesvc/env.json"
    assert cmd[cmd.index("--name"):cmd.index("--name") + 4] == NAME_SHAPE
    assert "--strict" not in cmd  # a miss or a dead service must not keep the pod in Init
    env = environment(objects, init)
    assert env["CACHESVC_TOKEN"] == ("secret", "cachesvc-read-token", "token")
    assert env["CACHESVC_URL"].startswith("https://"), "TLS to the service (the Ingress)"
    app = container(spec, "app")
    assert init["image"] == app["image"]  # the app's image holds the env file it wrote at build
    assert "CACHESVC_TOKEN" not in environment(objects, app)


@pytest.mark.parametrize("deployment", ["model-server", "model-warmup"])
def test_init_and_app_share_the_cache_dir_home_and_tmpdir_through_empty_dirs(deployment):
    objects = render("examples/inference")
    spec = pod_spec(get(objects, "Deployment", deployment))
    init, app = container(spec, "restore-compile-cache"), container(spec, "app")
    paths = _cache_paths(environment(objects, init))
    assert paths == _cache_paths(environment(objects, app))
    assert len(set(paths.values())) == 3
    for path in paths.values():
        volume = mounts(spec, init)[path]
        assert "emptyDir" in volume and mounts(spec, app)[path] == volume, path


def test_the_publisher_sidecar_waits_for_warm_up_and_publishes_with_the_write_token():
    objects = render("examples/inference")
    spec = pod_spec(get(objects, "Deployment", "model-warmup"))
    app, sidecar = container(spec, "app"), container(spec, "publish-compile-cache")
    script = sidecar["command"][-1]
    assert "cachesvc-client publish --name resnet50 --shape 'f32[8,3,224,224]'" in script
    env, app_env = environment(objects, sidecar), environment(objects, app)
    assert env["CACHESVC_TOKEN"] == ("secret", "cachesvc-write-token", "token")
    assert env["CACHESVC_ENV_FILE"] == "/etc/cachesvc/env.json"  # the key the restorers compute
    assert env["WARMUP_DONE_FILE"] == app_env["WARMUP_DONE_FILE"]
    assert _cache_paths(env) == _cache_paths(app_env)
    signal_dir = env["WARMUP_DONE_FILE"].rsplit("/", 1)[0]
    for path in list(_cache_paths(env).values()) + [signal_dir]:
        assert mounts(spec, sidecar)[path] == mounts(spec, app)[path], path
    assert not [c for c in containers(get(objects, "Deployment", "model-server")["spec"]["template"]["spec"])
                if "cachesvc-write-token" in str(c)]


def test_the_build_job_runs_nightly_in_the_app_image_with_the_write_token():
    objects = render("examples/inference")
    cron = get(objects, "CronJob", "model-build")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"  # a night's build never overlaps the last one's
    spec = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    build = container(spec, "build")
    app = container(pod_spec(get(objects, "Deployment", "model-server")), "app")
    assert build["command"][:3] == ["cachesvc-client", "build", "app.model:build"] and build["image"] == app["image"]
    assert build["command"][build["command"].index("--name") + 1] == "resnet50"
    env = environment(objects, build)
    assert env["CACHESVC_TOKEN"] == ("secret", "cachesvc-write-token", "token")
    assert env["CACHESVC_ENV_FILE"] == "/etc/cachesvc/env.json" and env["CACHESVC_URL"].startswith("https://")
    for path in _cache_paths(env).values():
        assert "emptyDir" in mounts(spec, build)[path], path


def test_the_image_tag_everywhere_is_the_package_version():
    """A release bumps pyproject.toml's version; the manifests and compose must name that image."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for overlay in ("base",) + SERVICE_OVERLAYS:
        images = {c["image"] for w in workloads(render(overlay)) for c in containers(pod_spec(w))}
        assert {i.rsplit(":", 1)[1] for i in images} == {version}, (overlay, images)
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert services["cachesvc"]["image"] == services["migrate"]["image"] == f"cachesvc:{version}"
