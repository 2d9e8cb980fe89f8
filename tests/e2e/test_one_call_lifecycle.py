"""End to end on the CPU: the one call is never another model's answer, loses nothing at exit, and
says why it fell back (issue 25, items 4-6).

One cold container builds ``tiny`` (harness/models.py: a custom module whose code lives in
``$DEMO_MODEL_DIR/tinynet.py``, as a deploy's would), first at batch 4 and then at its declared batch
8, publishes through the one call and exits right after, without waiting for the publish.
Restarted containers then check:

- the publish was finished at exit (its log says so) and the next container hits the package;
- a call off the declared inputs waits for the snapshot restored in the background and compiles
  from Inductor's cache (fxgraph_cache_hit), and says which field was off, once;
- a hit is counted by the service's stats (hits, compile seconds saved);
- another ``forward`` (relu to tanh) or another setting (LeakyReLU's slope), same names and shapes,
  is another key: a miss that torch.compile serves, equal to eager;
- weights replaced after the first call (``load_state_dict(assign=True)``, ``.data =``, a new
  ``nn.Parameter``) are seen at the next call: the package is rebound and equals eager;
- ``verify=True`` checks the first call against eager; ``CACHESVC_REQUIRE_HIT=1`` makes a miss an error.
"""
from __future__ import annotations

import subprocess

import pytest
import requests

from cachesvc_client.one_call import support
from harness.containers import Container
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow
TOL = 1e-4
TINYNET = '''import os

import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.act = nn.LeakyReLU(float(os.environ.get("TINY_SLOPE", "0.01")))  # a setting read at start
        self.fc2 = nn.Linear(128, 16)

    def forward(self, x):
        return self.fc2(self.act(torch.{fn}(self.fc1(x)) - 0.5))
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A service, the two versions of the model's code, and the cold container's exit (its stderr)."""
    import torch  # noqa: F401 - support reads torch's API

    why = support.support()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("one-call-life")
    code = {}
    for fn in ("relu", "tanh"):
        (base / fn).mkdir()
        (base / fn / "tinynet.py").write_text(TINYNET.format(fn=fn))
        code[fn] = str(base / fn)
    with ServiceProcess(base / "svc") as svc:
        ctr = Container(base / "containers")
        args = ("--model", "tiny", "--one-call", "--publish", "--no-wait", "--warm-batch", "4")
        cold = subprocess.run(ctr._worker_cmd(args), env=ctr.env(**svc.client_env(), DEMO_MODEL_DIR=code["relu"]),
                              capture_output=True, text=True, timeout=900)
        assert cold.returncode == 0, cold.stderr[-3000:]
        ctr.restart()
        yield svc, ctr, code, cold


def run(built, *flags, code="relu", **env):
    svc, ctr, paths, _ = built
    return ctr.run_worker("--model", "tiny", "--one-call", *flags, **svc.client_env(), DEMO_MODEL_DIR=paths[code],
                          **env)


def test_a_process_that_exits_right_after_its_first_call_still_publishes(built):
    _, _, _, cold = built
    warm = run(built)  # the next container: the package the exited process built is there
    assert warm["compile"]["source"] == "artifact", (warm["compile"], cold.stderr[-3000:])
    assert warm["compile"]["calls"] == {"artifact": 1, "torch.compile": 0} and warm["max_abs_diff"] < TOL
    assert "the publish finished at exit" in cold.stderr, cold.stderr[-3000:]  # said once, with its seconds
    assert "cannot schedule new futures" not in cold.stderr


def test_a_call_off_the_declared_inputs_compiles_from_the_restored_snapshot(built):
    r = run(built, "--also-batch", "4")
    assert r["compile"]["source"] == "artifact" and r["compile"]["calls"] == {"artifact": 1, "torch.compile": 1}
    assert r["also_batch_max_abs_diff"] < TOL
    assert r["counters"].get("fxgraph_cache_hit", 0) >= 1, r["counters"]  # not a cold compile
    assert r["compile"]["why"] == "input 0: shape (4, 64), built for (8, 64)", r["compile"]
    assert r["compile"]["causes"] == [r["compile"]["why"]]
    assert any(r["compile"]["why"] in w for w in r["compile"]["report_warnings"]), r["compile"]


def test_package_hits_count_as_hits_in_the_stats(built):
    """A hit reports itself (a paid_off verdict, sent in the background and finished at exit): the
    stats count it as a hit and the compile seconds the package saved (its build minus the first call)."""
    svc = built[0]

    def totals():
        return requests.get(svc.url + "/api/v1/stats", headers={"Authorization": f"Bearer {svc.token}"},
                            timeout=10).json()

    before = totals()
    run(built)
    after = totals()
    assert after["hits"] == before["hits"] + 1 and after["verdicts"]["paid_off"] == before["verdicts"]["paid_off"] + 1
    assert after["compile_seconds_saved"] > before["compile_seconds_saved"] and after["hit_rate"], after


@pytest.mark.parametrize("flags, code, env, changed", [
    ((), "tanh", {}, "code"),                        # forward calls tanh, not relu: same names and shapes
    ((), "relu", {"TINY_SLOPE": "0.9"}, "config"),   # LeakyReLU(0.9), not LeakyReLU(0.01)
])
def test_another_forward_or_setting_is_another_key(built, flags, code, env, changed):
    r = run(built, *flags, code=code, **env)
    assert r["compile"]["source"] == "compiled", r["compile"]
    assert r["compile"]["calls"] == {"artifact": 0, "torch.compile": 1}
    assert r["max_abs_diff"] < TOL and r["counters_all"]["frames"]["ok"] >= 1
    assert r["compile"]["why"] == r["compile"]["miss_reason"] and r["compile"]["why"], r["compile"]


@pytest.mark.parametrize("how", ["assign", "data", "param"])
def test_replaced_weights_are_seen_at_the_next_call(built, how):
    r = run(built, "--replace-weights", how)
    assert r["compile"]["source"] == "artifact", r["compile"]
    assert r["replaced_max_abs_diff"] < TOL, r
    assert r["compile"]["calls"] == {"artifact": 2, "torch.compile": 0}  # rebound: still the package


def test_verify_checks_the_first_call_against_eager(built):
    r = run(built, "--verify-first")
    assert r["compile"]["source"] == "artifact" and r["compile"]["calls"] == {"artifact": 1, "torch.compile": 0}
    assert r["compile"]["verify_s"] is not None and r["max_abs_diff"] < TOL, r["compile"]


def test_require_hit_makes_a_miss_an_error_naming_why(built):
    with pytest.raises(Exception) as failed:
        run(built, code="tanh", CACHESVC_REQUIRE_HIT="1")
    assert "a hit is required" in str(failed.value) and "no entry has this key" in str(failed.value), failed.value
    assert run(built, CACHESVC_REQUIRE_HIT="yes")["compile"]["source"] == "artifact"  # a hit passes
