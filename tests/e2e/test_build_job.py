"""End to end with real torch.compile on the CPU: `cachesvc-client build` builds what the fleet serves (issue 41,
item 2).

A real service (`cachesvc serve`); the harness's mlp (harness/models.py) behind a factory module, its
example call batch 4; each run of the job in a fresh container (empty HOME, TMPDIR and cache dir), as a
nightly pod is. The first run finds no demand: it builds the example's package and says so (exit 0). The
fleet then reports its calls (POST /api/v1/usage): batch 4 busiest, 1 next, a few of 2, 3 and 5. Four
exact packages cannot reach 99%, so with --max-packages 4 the plan is ranges of batch: [4] (the example's
own, built), [1] (exact: a size 1 is never in a range, torch.export specializes it), [2..3] (a range, its
example 3), [5] (exact). A run with no time left starts none of the three it lacks (exit 1); the next builds
them and names the plan; the one after builds nothing. Processes of the fleet that compile batch 5, batch 1,
and batch 2 declared in 2..3 through the one call are then each served by their package.
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest
import requests

from cachesvc_client import CacheClient
from cachesvc_client.one_call import support
from harness.containers import Container
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow
NAME = "mlp-fleet"
FACTORY = '''
from harness.models import build as harness_model


def build():
    model, (x,) = harness_model("mlp")
    return model, (x[:4].clone(),)
'''
#: a process of the fleet, after the builds: batch 5 and batch 1 through the one call, batch 2 declared in 2..3
SERVE = '''
import json, sys

import torch
from torch.export import Dim

import cachesvc_client
from cachesvc_client.one_call import shapes
from harness.models import build

model, (x,) = build("mlp")
example = (x[:4].clone(),)


def served(compiled, call):
    with torch.no_grad():
        diff = float((compiled(*call) - model(*call)).abs().max())
    return {"source": compiled.source, "calls": dict(compiled.calls), "miss": compiled.miss_reason, "diff": diff}


five = shapes.resized(example, {}, "f32[5,256]")[0]
three, two, one = (shapes.resized(example, {}, f"f32[{b},256]")[0] for b in (3, 2, 1))
ranged = cachesvc_client.compile(model, three, name=sys.argv[1], dynamic_shapes=({0: Dim("batch", min=2, max=3)},))
print("RESULT " + json.dumps({"exact": served(cachesvc_client.compile(model, five, name=sys.argv[1]), five),
                              "one": served(cachesvc_client.compile(model, one, name=sys.argv[1]), one),
                              "range": served(ranged, two)}), flush=True)
'''
DEMAND = {"f32[4,256]": 600, "f32[1,256]": 300, "f32[3,256]": 40, "f32[2,256]": 30, "f32[5,256]": 30}
PLAN = "plan: ranges of batch: 4 packages cover 100% of 1,000 calls; exact shapes would need 5 for 99%"
PACKAGES = {"f32[4,256]", "f32[1,256]", "f32[3,256]|dynamic=(batch:2..3,256)", "f32[5,256]"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    import torch  # noqa: F401 - support reads torch's API

    why = support.support()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("build-job")
    (base / "app").mkdir()
    (base / "app" / "mlp_factory.py").write_text(FACTORY)
    (base / "serve.py").write_text(SERVE)
    with ServiceProcess(base / "svc") as svc:
        yield svc, Container(base / "containers"), base


def build(fleet, *args: str) -> subprocess.CompletedProcess:
    """`cachesvc-client build` in a fresh container, run from the app's folder; how long it took in ``.seconds``."""
    svc, ctr, base = fleet
    ctr.restart()
    started = time.monotonic()
    out = ctr.run(["-m", "cachesvc_client.cli", "build", "mlp_factory:build", "--name", NAME, "--max-packages", "4",
                   *args], ctr.env(**svc.client_env()), timeout=900, cwd=base / "app")
    out.seconds = time.monotonic() - started
    print(f"\n`cachesvc-client build {' '.join(args)}`: exit {out.returncode} in {out.seconds:.1f} s")
    assert "Traceback" not in out.stderr, out.stderr[-4000:]
    return out


def test_the_build_job_builds_the_packages_that_cover_the_fleets_demand(fleet):
    svc, ctr, base = fleet
    first = build(fleet, "--json")  # no demand yet: the example only
    assert first.returncode == 0, first.stderr[-4000:]
    got = json.loads(first.stdout)
    assert got["example"]["status"] == "built" and got["plan"] is None and got["note"].startswith(
        "no demand recorded yet for mlp-fleet")
    key = got["key"]
    client = CacheClient(svc.url, svc.token)
    assert client.packages(NAME, key["tags"], env=key["env"]) == ["f32[4,256]"]

    shapes = [{"shape": s, "served": {"package": 0, "compile": n, "eager": 0}} for s, n in DEMAND.items()]
    sent = requests.post(f"{svc.url}/api/v1/usage", json={"reports": [{"key": key, "shapes": shapes}]},
                         headers={"Authorization": f"Bearer {svc.token}"}, timeout=30)
    assert sent.status_code == 200 and not sent.json()["recorded"][0]["dropped"], sent.text

    late = build(fleet, "--budget", "0")  # no time left: nothing new starts
    assert late.returncode == 1 and PLAN in late.stdout.splitlines(), late.stdout
    assert late.stdout.count("not started: over the 0 s budget") == 3 and "already built (the example)" in late.stdout

    second = build(fleet)
    lines = second.stdout.splitlines()
    assert second.returncode == 0, second.stdout + second.stderr[-4000:]
    assert lines[0] == "build mlp-fleet: example f32[4,256]: already built" and lines[1] == PLAN
    built = {line.split()[0]: line for line in lines[2:6]}
    assert "600 calls  already built (the example)" in built["f32[4,256]"]
    assert "300 calls  built in" in built["f32[1,256]"] and "with batch" not in built["f32[1,256]"]
    assert "with batch 2..3" in built["f32[3,256]"] and "70 calls  built in" in built["f32[3,256]"]
    assert "30 calls  built in" in built["f32[5,256]"]
    assert lines[6].startswith("3 built, 1 already built, 0 failed, 0 not started in ")
    assert set(client.packages(NAME, key["tags"], env=key["env"])) == PACKAGES

    again = build(fleet, "--json")  # idempotent: a second run builds nothing
    done = json.loads(again.stdout)
    assert again.returncode == 0 and done["ok"] is True
    assert [(p["key"], p["status"]) for p in done["packages"]] == [
        ("f32[4,256]", "already built"), ("f32[1,256]", "already built"),
        ("f32[3,256]|dynamic=(batch:2..3,256)", "already built"), ("f32[5,256]", "already built")]
    assert done["counts"]["built"] == 0 and done["example"]["status"] == "already built"

    started = time.monotonic()
    served = serve(fleet)  # a process of the fleet: its shapes are served by the packages, nothing compiled
    print(f"serve.py: {time.monotonic() - started:.1f} s")
    for what in ("exact", "one", "range"):
        assert served[what]["source"] == "artifact", served[what]["miss"]
        assert served[what]["calls"] == {"artifact": 1, "torch.compile": 0} and served[what]["diff"] < 1e-4, served


def serve(fleet) -> dict:
    """serve.py's RESULT, in a fresh container."""
    svc, ctr, base = fleet
    ctr.restart()
    proc = ctr.run([str(base / "serve.py"), NAME], ctr.env(**svc.client_env()), timeout=600)
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and results, proc.stdout[-3000:] + proc.stderr[-4000:]
    return json.loads(results[-1][len("RESULT "):])
