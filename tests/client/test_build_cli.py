"""`cachesvc-client build` as a person and a nightly CronJob meet it, run as a real process.

TARGET's problems (no colon, no module, no file, not callable, a wrong return, a factory or an import that
raises) and bad flags exit 2 with one line naming the problem and what to do, never a traceback. Against a
real service (`cachesvc serve`), --dry-run --json prints one JSON document: the key family, the job's
settings (--option values parsed as Python literals), the plan and a status per package; no demand yet is
said and exits 0. A model torch.export refuses (the one compile here, torch.compile alone: no package is ever
built) has each of its packages reported failed with the cause, the job going on to the next, and exits 1.
The builds themselves are tests/e2e/test_build_job.py's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
import requests

from cachesvc_client import CacheClient
from harness.containers import inherited_env
from harness.service import ServiceProcess

FACTORY = '''
import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.proj(x).relu()


def build():
    torch.manual_seed(0)
    return Tiny().eval(), (torch.randn(8, 16),)


def wrong_return():
    return 3


def short():
    return (Tiny(),)


def not_a_module():
    return (lambda x: x), (torch.randn(2),)


def args_not_a_tuple():
    return Tiny(), torch.randn(8, 16)


def raises():
    raise RuntimeError("the weights are not there")


class Branchy(Tiny):
    def forward(self, x):
        if x.sum() > 0:  # a branch on the data: Dynamo cannot trace it in one graph, so no package can vouch for it
            return self.proj(x)
        return -self.proj(x)


def branchy():
    torch.manual_seed(0)
    return Branchy().eval(), (torch.randn(8, 16),)


NOT_CALLABLE = 5
'''


@pytest.fixture
def workdir(tmp_path) -> Path:
    """The folder the job runs in: the factory module, one that does not compile, one that needs a package."""
    (tmp_path / "factory.py").write_text(FACTORY)
    (tmp_path / "broken.py").write_text("def build(:\n")
    (tmp_path / "needs_dep.py").write_text("import not_installed_anywhere\n")
    for sub in ("home", "tmp", "cache"):
        (tmp_path / sub).mkdir()
    return tmp_path


def environment(workdir: Path, **extra: str) -> Dict[str, str]:
    env = inherited_env(("CACHESVC_", "TORCHINDUCTOR_", "TRITON_"))
    env.update(HOME=str(workdir / "home"), TMPDIR=str(workdir / "tmp"), TORCHINDUCTOR_CACHE_DIR=str(workdir / "cache"),
               **extra)
    return env


def build(workdir: Path, env: Dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "build", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)


def usage_error(out: subprocess.CompletedProcess) -> str:
    """The one line of a usage error (exit 2, nothing on stdout, no traceback), without its prefix and suffix."""
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr, (out.returncode, out.stderr)
    (line,) = out.stderr.splitlines()
    prefix, suffix = "cachesvc-client build: error: ", " (see cachesvc-client build -h)"
    assert line.startswith(prefix) and line.endswith(suffix), line
    return line[len(prefix):-len(suffix)]


NO_SERVICE = {"CACHESVC_URL": "http://127.0.0.1:9", "CACHESVC_TOKEN": "cs_never-sent"}  # TARGET fails first


@pytest.mark.parametrize("target, said", [
    ("factory", "TARGET 'factory' is not MODULE:FUNCTION or PATH.py:FUNCTION (e.g. app.model:build)"),
    ("factory:", "TARGET 'factory:' is not MODULE:FUNCTION or PATH.py:FUNCTION"),
    ("nomodule:build", "no module 'nomodule' here ({cwd}): run the build from the folder that holds it, or give "
                       "PATH.py:FUNCTION"),
    ("missing.py:build", "no file 'missing.py': give the path of the .py file that defines the function"),
    ("broken:build", "importing broken failed: SyntaxError: "),
    ("needs_dep:build", "importing needs_dep failed: ModuleNotFoundError: No module named 'not_installed_anywhere' "
                        "({cwd}/needs_dep.py:1): install what it needs"),
    ("factory:nope", "factory has no 'nope': define it there, or name another function after the colon"),
    ("factory:NOT_CALLABLE", "factory:NOT_CALLABLE is an int, not a function: name a function that returns "
                             "(model, args) or (model, args, kwargs)"),
    ("factory:wrong_return", "factory:wrong_return() returned an int; it must return (model, args) or "
                             "(model, args, kwargs)"),
    ("factory:short", "factory:short() returned a tuple of 1 items; it must return"),
    ("factory:not_a_module", "factory:not_a_module() returned a function as the model; it must be a torch.nn.Module"),
    ("factory:args_not_a_tuple", "factory:args_not_a_tuple() returned a Tensor as args; it must be a tuple"),
    ("factory:raises", "factory:raises() raised RuntimeError: the weights are not there ({cwd}/factory.py:"),
    ("factory.py:raises", "factory.py:raises() raised RuntimeError: the weights are not there ({cwd}/factory.py:"),
])
def test_a_target_that_gives_no_example_call_is_one_usage_line(workdir, target, said):
    line = usage_error(build(workdir, environment(workdir, **NO_SERVICE), target, "--name", "tiny"))
    assert line.startswith(said.format(cwd=workdir)), line


@pytest.mark.parametrize("args, said", [
    (["--option", "novalue"], "'--option': 'novalue' is not KEY=VALUE"),
    (["--option", "1x=2"], "'--option': '1x=2' is not KEY=VALUE"),
    (["--option", "mode=max-autotune"], "'--option': 'mode' is not a torch.compile option here: use --mode"),
    (["--option", "dynamic_shapes=None"], "'--option': 'dynamic_shapes' is not a torch.compile option here: the "
                                          "build sets it"),
    (["--option", "fullgraph=True", "--option", "fullgraph=False"], "'--option': 'fullgraph' is given twice"),
    (["--max-packages", "0"], "'--max-packages'"),
    (["--coverage", "0"], "'--coverage'"),
    (["--coverage", "1.5"], "'--coverage'"),
    (["--budget", "-1"], "'--budget'"),
    (["--name", ""], "'--name': name must not be empty"),
])
def test_bad_flags_are_one_usage_line(workdir, args, said):
    line = usage_error(build(workdir, environment(workdir, **NO_SERVICE), "factory:build", "--name", "tiny", *args))
    assert said in line, line


def test_no_url_and_no_write_token_are_usage_errors(workdir):
    assert usage_error(build(workdir, environment(workdir), "factory:build", "--name", "tiny")) == (
        "no service URL: pass --url or set CACHESVC_URL")
    no_token = environment(workdir, CACHESVC_URL="http://127.0.0.1:9")
    assert usage_error(build(workdir, no_token, "factory:build", "--name", "tiny")) == (
        "building publishes: pass --token or set CACHESVC_TOKEN (a write token), or plan only with --dry-run")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with ServiceProcess(tmp_path_factory.mktemp("build-cli") / "svc") as svc:
        yield svc


def dry_run(workdir: Path, svc: ServiceProcess, *args: str, target: str = "factory:build", name: str = "tiny") -> dict:
    out = build(workdir, environment(workdir, **svc.client_env()), target, "--name", name, "--dry-run", "--json", *args)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    return json.loads(out.stdout)  # one document: the progress and warnings are on stderr


def report_demand(svc: ServiceProcess, key: dict, calls: Dict[str, int], tmp_path: Path) -> None:
    """The fleet's reports, as the one call's reporter sends them; the name first gets an entry (the service keeps
    demand only for a name it has one for)."""
    (tmp_path / "root").mkdir(exist_ok=True)
    (tmp_path / "root" / "kernel.py").write_text("# a compiled kernel\n")
    client = CacheClient(svc.url, svc.token)
    client.publish(key["name"], "f32[1]", key["tags"], env=key["env"], roots={"inductor": str(tmp_path / "root")},
                   compile_seconds=1.0)
    shapes = [{"shape": s, "served": {"package": 0, "compile": n, "eager": 0}} for s, n in calls.items()]
    sent = requests.post(f"{svc.url}/api/v1/usage", json={"reports": [{"key": key, "shapes": shapes}]},
                         headers={"Authorization": f"Bearer {svc.token}"}, timeout=30)
    assert sent.status_code == 200 and not sent.json()["recorded"][0]["dropped"], sent.text


def test_dry_run_json_says_the_key_the_plan_and_each_packages_status(workdir, service, tmp_path):
    before = dry_run(workdir, service)  # no demand yet: said, exit 0, the example only
    assert before["plan"] is None and before["packages"] == [] and before["ok"] is True
    assert before["note"] == ("no demand recorded yet for tiny (this key family, this environment): nothing to build "
                              "but the example")
    assert before["example"]["shape"] == "f32[8,16]" and before["example"]["status"] == "planned"
    key = before["key"]
    assert key["name"] == "tiny" and key["tags"]["compile"] == "aoti" and set(key["env"]) >= {"torch", "device"}

    demand = {"f32[8,16]": 500, "f32[1,16]": 300, "f32[3,16]": 40, "f32[2,16]": 30, "f32[6,16]": 50,
              "i64[8,16]": 12}
    report_demand(service, key, demand, tmp_path)
    got = dry_run(workdir, service, "--max-packages", "3")
    assert got["key"] == key and got["ok"] is True and got["error"] == "" and got["dry_run"] is True
    assert got["job"] == {"mode": None, "options": {}, "tags": {}, "max_packages": 3, "coverage": 0.99,
                          "budget": 3600.0}
    plan = got["plan"]
    assert (plan["kind"], plan["calls"], plan["covered"], plan["other_shapes"], plan["other_calls"]) == (
        "ranges", 920, 920, 1, 12)
    assert plan["summary"] == ["ranges of batch: 3 packages cover 100% of 920 calls; exact shapes would need 5 for 99%",
                               "1 shape of another call structure not covered (12 calls)"]
    rows = [(p["shape"], p["ranges"], p["calls"], p["status"], p["example"]) for p in got["packages"]]
    assert rows == [("f32[8,16]", {}, 500, "planned", True),  # the example's shape: built first, its own bucket
                    ("f32[1,16]", {}, 300, "planned", False),  # 1 is never in a range: exact, a package of its own
                    ("f32[6,16]", {"batch": [2, 6]}, 120, "planned", False)], rows
    assert got["packages"][2]["key"] == "f32[6,16]|dynamic=(batch:2..6,16)"  # the key the one call will publish
    assert got["counts"] == {"built": 0, "already built": 0, "failed": 0, "not started": 0, "planned": 3}
    assert got["lines"][1] == "plan: " + plan["summary"][0] and got["lines"][-1].startswith(
        "dry run: 3 packages planned, 0 already built, 3 to build; nothing built")

    text = build(workdir, environment(workdir, **service.client_env()), "factory:build", "--name", "tiny", "--dry-run",
                 "--max-packages", "3")
    assert text.returncode == 0 and text.stdout.splitlines() == got["lines"][:-1] + [text.stdout.splitlines()[-1]]


def test_options_are_python_literals_and_part_of_the_key(workdir, service):
    got = dry_run(workdir, service, "--option", "fullgraph=True", "--option", "backend=inductor", "--option",
                  "options={'max_autotune': False}", "--mode", "default", "--tag", "team=search")
    assert got["job"]["options"] == {"fullgraph": True, "backend": "inductor", "options": {"max_autotune": False}}
    assert got["job"]["mode"] == "default" and got["key"]["tags"]["team"] == "search"
    plain = dry_run(workdir, service)
    assert got["key"]["tags"]["options"] != plain["key"]["tags"]["options"]  # another key family: its own demand
    assert got["plan"] is None and got["note"].startswith("no demand recorded yet")


def test_a_package_that_cannot_be_built_is_reported_with_its_cause_and_the_job_goes_on(workdir, service, tmp_path):
    key = dry_run(workdir, service, target="factory:branchy", name="branchy")["key"]
    report_demand(service, key, {"f32[8,16]": 100, "f32[2,16]": 50}, tmp_path)
    out = build(workdir, environment(workdir, **service.client_env()), "factory:branchy", "--name", "branchy", "--json")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    got = json.loads(out.stdout)
    cause = "no proof the package computes this model: Dynamo could not trace the model in one graph"
    assert got["example"]["status"] == "failed" and got["example"]["why"].startswith(cause), got["example"]
    assert [(p["shape"], p["status"]) for p in got["packages"]] == [("f32[8,16]", "failed"), ("f32[2,16]", "failed")]
    assert got["packages"][1]["why"].startswith(cause) and got["packages"][1]["seconds"] > 0  # tried, after the first
    assert got["ok"] is False and got["counts"]["failed"] == 2
    assert got["lines"][-1].endswith("some planned packages do not exist")
    assert [line.split() for line in got["lines"] if "f32[2,16]" in line][0][:5] == [
        "f32[2,16]", "50", "calls", "failed:", "no"], got["lines"]
