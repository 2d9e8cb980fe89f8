"""Rendering deploy/kubernetes with the real `kubectl kustomize`, and walking what it renders."""
from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE_ROOT = ROOT / "deploy" / "kubernetes"


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed: these tests render deploy/kubernetes with `kubectl kustomize` "
                    "(Debian: apt-get install kubectl)")
    return path


def kustomizations() -> List[str]:
    """Every kustomization under deploy/kubernetes, as paths relative to it."""
    return sorted(str(p.parent.relative_to(KUSTOMIZE_ROOT)) for p in KUSTOMIZE_ROOT.rglob("kustomization.yaml"))


def render_dir(directory: Path) -> Tuple[dict, ...]:
    proc = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


@functools.lru_cache(maxsize=None)
def render(relpath: str) -> Tuple[dict, ...]:
    """The objects `kubectl kustomize deploy/kubernetes/<relpath>` prints."""
    return render_dir(KUSTOMIZE_ROOT / relpath)


def get(objects, kind: str, name: Optional[str] = None, *, prefix: bool = False) -> dict:
    """The one object of ``kind`` (named ``name``, or starting with it when ``prefix``)."""
    found = [o for o in objects if o["kind"] == kind and (
        name is None or (o["metadata"]["name"].startswith(name) if prefix else o["metadata"]["name"] == name))]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def pod_spec(obj: dict) -> dict:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def workloads(objects) -> Iterator[dict]:
    return (o for o in objects if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"))


def containers(spec: dict) -> List[dict]:
    """Init containers first, then the containers."""
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def container(spec: dict, name: str) -> dict:
    found = [c for c in containers(spec) if c["name"] == name]
    assert len(found) == 1, f"no container {name!r} in {[c['name'] for c in containers(spec)]}"
    return found[0]


def environment(objects, c: dict) -> Dict[str, object]:
    """A container's environment as the kubelet builds it: envFrom ConfigMaps first, then env.

    Values are strings, or ``("secret", name, key)`` for a secretKeyRef."""
    env: Dict[str, object] = {}
    for source in c.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref:
            env.update(get(objects, "ConfigMap", ref["name"])["data"])
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in var.get("valueFrom", {}):
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = ("secret", ref["name"], ref["key"])
        else:
            env[var["name"]] = ("other", var["valueFrom"])
    return env


def mounts(spec: dict, c: dict) -> Dict[str, dict]:
    """mountPath -> the volume mounted there, for container ``c`` of pod ``spec``."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    return {m["mountPath"]: volumes[m["name"]] for m in c.get("volumeMounts", [])}
