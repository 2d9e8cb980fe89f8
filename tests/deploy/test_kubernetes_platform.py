"""deploy/kubernetes, what a platform team expects (issue 27 items 4-6, issue 26 row 11): a second
`kubectl apply -k` after a ConfigMap change succeeds (the migration Job's immutable template does not
change under its name), the HPA owns the replica count, a startup probe, an Ingress with TLS, a
ServiceMonitor with a token for a private /metrics, common labels on every object, NetworkPolicies
for who may reach the service, the database and the bucket, and a production mode with a required key."""
from __future__ import annotations

import shutil

from tests.deploy.k8s import KUSTOMIZE_ROOT, container, environment, get, kustomizations, pod_spec, render, render_dir

PROD = "overlays/production"
COMMON = {"app.kubernetes.io/name": "cachesvc", "app.kubernetes.io/part-of": "cachesvc"}


def _render_changed(tmp_path, old: str, new: str):
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUSTOMIZE_ROOT, tree)
    path = tree / PROD / "kustomization.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return render_dir(tree / PROD)


def _job(objects) -> dict:
    return get(objects, "Job", "cachesvc-migrate-", prefix=True)


def test_a_configmap_change_reapplies_the_job_unchanged_and_a_new_release_names_a_new_one(tmp_path):
    """Kubernetes refuses a Job whose template changed under the same name: so across renders, the Job's
    name stays exactly when its template stays. A ConfigMap literal changes the Deployment (rolled) only."""
    before = render(PROD)
    literal = _render_changed(tmp_path / "a", "CACHESVC_LRU_BUDGET_BYTES=2000000000000",
                              "CACHESVC_LRU_BUDGET_BYTES=3000000000000")
    release = _render_changed(tmp_path / "b", "newTag: 0.1.0", "newTag: 0.2.0")
    for after in (literal, release):
        same_name = _job(after)["metadata"]["name"] == _job(before)["metadata"]["name"]
        assert same_name == (_job(after)["spec"] == _job(before)["spec"]), "a Job's template is immutable"
    assert _job(literal) == _job(before), "a ConfigMap change re-applies the same Job"
    assert _job(release)["metadata"]["name"] != _job(before)["metadata"]["name"]
    config = lambda objs: get(objs, "ConfigMap", "cachesvc-config-", prefix=True)["metadata"]["name"]  # noqa: E731
    assert config(literal) != config(before), "the Deployment still rolls: it names the new ConfigMap"
    served = container(pod_spec(get(literal, "Deployment", "cachesvc")), "cachesvc")["envFrom"]
    assert served == [{"configMapRef": {"name": config(literal)}}]


def test_every_object_carries_the_common_labels():
    for kustomization in kustomizations():
        if kustomization.startswith("examples/"):  # the inference pods: the app's own labels
            continue
        for obj in render(kustomization):
            labels = obj["metadata"].get("labels", {})
            assert COMMON.items() <= labels.items(), (kustomization, obj["kind"], obj["metadata"]["name"], labels)


def test_the_hpa_owns_the_replica_count():
    objects = render(PROD)
    for hpa in (o for o in objects if o["kind"] == "HorizontalPodAutoscaler"):
        target = get(objects, hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"])
        assert "replicas" not in target["spec"], "an apply would reset what the HPA scaled to"


def test_a_startup_probe_guards_the_first_minutes_and_liveness_waits_for_it():
    c = container(pod_spec(get(render(PROD), "Deployment", "cachesvc")), "cachesvc")
    start = c["startupProbe"]
    assert start["httpGet"] == {"path": "/healthz", "port": "http"}
    assert start["periodSeconds"] * start["failureThreshold"] >= 60 and "initialDelaySeconds" not in c["livenessProbe"]


def test_the_ingress_ends_tls_for_the_service_and_the_inference_example_uses_https():
    objects = render(PROD)
    ingress = get(objects, "Ingress", "cachesvc")
    (tls,) = ingress["spec"]["tls"]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] in tls["hosts"] and tls["secretName"]
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": "cachesvc", "port": {"name": "http"}}
    client = get(render("examples/inference"), "ConfigMap", "cachesvc-client-", prefix=True)["data"]
    assert client["CACHESVC_URL"] == f"https://{rule['host']}"


def test_metrics_are_private_and_prometheus_scrapes_them_with_a_token():
    objects = render(PROD)
    config = get(objects, "ConfigMap", "cachesvc-config-", prefix=True)["data"]
    assert config["CACHESVC_METRICS_PUBLIC"] == "false"
    monitor = get(objects, "ServiceMonitor", "cachesvc")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["port"] == "http"
    assert endpoint["authorization"]["credentials"]["name"] == "cachesvc-metrics"
    service = get(objects, "Service", "cachesvc")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in [p["name"] for p in service["spec"]["ports"]]


def _selected(policy: dict, labels: dict) -> bool:
    sel = policy["spec"]["podSelector"]
    if not all(labels.get(k) == v for k, v in sel.get("matchLabels", {}).items()):
        return False
    return all(labels.get(e["key"]) in e["values"] for e in sel.get("matchExpressions", []) if e["operator"] == "In")


def _pods(objects):
    for w in objects:
        if w["kind"] in ("Deployment", "Job", "CronJob"):
            template = w["spec"]["jobTemplate"]["spec"]["template"] if w["kind"] == "CronJob" else w["spec"]["template"]
            yield w["metadata"]["name"], template["metadata"]["labels"]


def _egress_ports(objects, labels) -> set:
    return {p["port"] for o in objects if o["kind"] == "NetworkPolicy" and _selected(o, labels)
            for rule in o["spec"].get("egress", []) for p in rule.get("ports", [])}


def test_network_policies_say_who_reaches_the_service_the_database_and_the_bucket():
    objects = render(PROD)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    deny = get(objects, "NetworkPolicy", "cachesvc-default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}, "all else is refused"
    for policy in policies:
        for rule in policy["spec"].get("ingress", []) + policy["spec"].get("egress", []):
            assert rule.get("from", rule.get("to")), f"{policy['metadata']['name']}: a rule open to everyone"
    pods = dict(_pods(objects))
    assert 5432 in _egress_ports(objects, pods["cachesvc"]) and 443 in _egress_ports(objects, pods["cachesvc"])
    assert _egress_ports(objects, pods["cachesvc-migrate-0.1.0"]) == {53, 5432}, "the Job: the database only"
    assert _egress_ports(objects, pods["cachesvc-retention"]) == {53, 8787}, "retention: the service only"
    (server_in,) = [p for p in policies if p["spec"].get("ingress")]
    assert _selected(server_in, pods["cachesvc"]) and not _selected(server_in, pods["cachesvc-retention"])
    (rule,) = server_in["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    namespaces = {f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for f in rule["from"]
                  if "namespaceSelector" in f}
    assert namespaces == {"ingress-nginx", "monitoring"}, "the Ingress (TLS) and Prometheus, nobody else"


def test_production_requires_the_secret_key_secure_cookies_and_says_it_is_production():
    objects = render(PROD)
    c = container(pod_spec(get(objects, "Deployment", "cachesvc")), "cachesvc")
    (key,) = [e for e in c["env"] if e["name"] == "CACHESVC_SECRET_KEY"]
    assert key["valueFrom"]["secretKeyRef"] == {"name": "cachesvc", "key": "secret-key"}, "required, not optional"
    env = environment(objects, c)
    assert env["CACHESVC_PRODUCTION"] == "true" and env["CACHESVC_COOKIE_SECURE"] == "true"
