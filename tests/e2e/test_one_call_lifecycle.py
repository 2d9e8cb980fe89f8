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
  is another key: a miss that torch.compile serves, equal to eager; so is a file of an installed library
  patched under the same version (the same key: the package's proof sees the lines it traced);
- weights replaced after the first call (``load_state_dict(assign=True)``, ``.data =``, a new
  ``nn.Parameter``) are seen at the next call: the package is rebound and equals eager;
- ``verify=True`` checks the first call against eager, and a package that differs from it (machine
  code that is not its proof's computation, as a damaged build or a bucket writer could publish) is set
  aside: torch.compile answers, and says why once;
- ``require_hit`` (the argument, or ``CACHESVC_REQUIRE_HIT=1``) makes a miss, or a hit that falls
  back on the declared inputs, raise HitRequired naming why;
- a builder that could make no package (its trace branches on a tensor's value) leaves the cause on its
  snapshot, and a restarted process that misses the package names it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest
import requests

from cachesvc_client import CacheClient
from cachesvc_client.one_call import support
from cachesvc_client.one_call.proof import container as proof_container
from cachesvc_client.publish.onefile import publish_file
from harness.containers import Container
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow
TOL = 1e-4
TINYNET = '''import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(1, os.path.join(os.path.dirname(__file__), "site-packages"))
from tinyhelp import offset  # noqa: E402 - a helper in another file of the deploy's code
from tinylib import scale  # noqa: E402 - an installed library's (site-packages): keyed by its version only


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.act = nn.LeakyReLU(float(os.environ.get("TINY_SLOPE", "0.01")))  # a setting read at start
        self.fc2 = nn.Linear(128, 16)

    def forward(self, x):
        h = torch.{fn}(self.fc1(x)) * scale() - offset(){branch}
        return self.fc2(self.act(h))
'''
#: the deploys' code (forward's function, the helper's constant, the global tensor, a branch): the built
#: one (relu), another forward (tanh), the helper in another file returning another constant (shifted:
#: the key follows it), a library file under site-packages patched under the same version (rescaled: the
#: key holds the library's version, not its code: the same key, and the proof refuses the package), and a
#: branch on a tensor's value (no package can be built for it)
CODE = {"relu": ("relu", 0.5, 1.0, ""), "tanh": ("tanh", 0.5, 1.0, ""), "shifted": ("relu", 1.5, 1.0, ""),
        "rescaled": ("relu", 0.5, 2.0, ""),
        "noexport": ("relu", 0.5, 1.0, "\n        if h.sum() > 0:\n            h = h * 2")}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A service, the two versions of the model's code, and the cold container's exit (its stderr)."""
    import torch  # noqa: F401 - support reads torch's API

    why = support.support()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("one-call-life")
    code = {}
    for name, (fn, offset, scale, branch) in CODE.items():
        (base / name).mkdir()
        (base / name / "tinynet.py").write_text(TINYNET.format(fn=fn, scale=scale, branch=branch))
        (base / name / "tinyhelp.py").write_text(f"def offset():\n    return {offset}\n")
        (base / name / "site-packages").mkdir()
        (base / name / "site-packages" / "tinylib.py").write_text(f"def scale():\n    return {scale}\n")
        code[name] = str(base / name)
    with ServiceProcess(base / "svc") as svc:
        ctr = Container(base / "containers")
        args = ("--model", "tiny", "--one-call", "--publish", "--no-wait", "--warm-batch", "4")
        cold = ctr.run(ctr._worker_cmd(args)[1:], env=ctr.env(**svc.client_env(), DEMO_MODEL_DIR=code["relu"]),
                       timeout=900)
        assert cold.returncode == 0, cold.stderr[-3000:]
        ctr.restart()
        yield svc, ctr, code, cold


def run(built, *flags, code="relu", **env):
    svc, ctr, paths, _ = built
    return ctr.run_worker("--model", "tiny", "--one-call", *flags, **svc.client_env(), DEMO_MODEL_DIR=paths[code],
                          **env)


def run_logged(built, *flags, code="relu", ctr=None, **env):
    """As ``run``, in ``ctr`` (default the restarted container); returns (RESULT dict, stderr), or
    (None, stderr) when the worker failed."""
    svc, restarted, paths, _ = built
    ctr = ctr or restarted
    done = ctr.run(ctr._worker_cmd(("--model", "tiny", "--one-call", *flags))[1:],
                   env=ctr.env(**svc.client_env(), DEMO_MODEL_DIR=paths[code], **env), timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return (json.loads(lines[-1][len("RESULT "):]) if done.returncode == 0 and lines else None), done.stderr


def test_a_process_that_exits_right_after_its_first_call_still_publishes(built):
    _, _, _, cold = built
    warm, said = run_logged(built)  # the next container: the package the exited process built is there
    assert warm is not None, said[-3000:]
    assert warm["compile"]["source"] == "artifact", (warm["compile"], cold.stderr[-3000:])
    # that hit exits right after its first output too, its background start (one_call/deferred.py) just begun
    # in a thread: the start finishes, and nothing of it is a warning
    noisy = [line for line in said.splitlines() if any(w in line for w in (
        "did not start", "not fetched", "failed", "a bug", "Traceback", "can't create new thread"))]
    assert not noisy, said[-3000:]
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
    ((), "shifted", {}, "code"),                     # the helper in tinyhelp.py returns 1.5, not 0.5
    ((), "rescaled", {}, "proof"),                   # tinylib.py returns 2.0 under the same version: the same key
])
def test_another_forward_or_setting_is_another_key_or_not_proven(built, flags, code, env, changed):
    r = run(built, *flags, code=code, **env)
    assert r["compile"]["source"] == "compiled", r["compile"]
    assert r["compile"]["calls"] == {"artifact": 0, "torch.compile": 1}
    assert r["max_abs_diff"] < TOL and r["counters_all"]["frames"]["ok"] >= 1
    assert r["compile"]["why"] == r["compile"]["miss_reason"] and r["compile"]["why"], r["compile"]
    if changed == "proof":  # the key found the package; the proof saw the library's lines differ
        assert r["compile"]["why"] == "not using the published artifact: tinylib lines 1-2 are not the ones the " \
                                      "package was built from", r["compile"]


@pytest.mark.parametrize("how", ["assign", "data", "param", "dict"])
def test_replaced_weights_are_seen_at_the_next_call(built, how):
    r = run(built, "--replace-weights", how)
    assert r["compile"]["source"] == "artifact", r["compile"]
    assert r["replaced_max_abs_diff"] < TOL, r
    assert r["compile"]["calls"] == {"artifact": 2, "torch.compile": 0}  # rebound: still the package
    # the proof's trees pinned every tensor (no walk of the slots per call) until one was replaced in its slot;
    # ``.data =`` keeps the objects, and the pointer check rebinds it
    assert r["walks_slots_before"] is False and r["walks_slots_after"] is (how != "data"), r


def test_verify_checks_the_first_call_against_eager(built):
    r = run(built, "--verify-first")
    assert r["compile"]["source"] == "artifact" and r["compile"]["calls"] == {"artifact": 1, "torch.compile": 0}
    assert r["compile"]["verify_s"] is not None and r["max_abs_diff"] < TOL, r["compile"]


@pytest.fixture(scope="module")
def tampered(built, tmp_path_factory):
    """A version whose machine code is not its proof's computation, as a damaged build or a bucket writer
    with a write token could publish: relu's package carrying the proof of the rescaled code (tinylib.py
    returns 2.0), under the name ``tiny-tampered`` and the key both codes share (the library is keyed by
    its version). The rescaled restart's proof holds; its package's answer is relu's."""
    svc, ctr, paths, _ = built
    base = tmp_path_factory.mktemp("tampered")
    warm = run(built)  # relu's key: its tags and shape
    key_args = (warm["compile"]["shape"], warm["compile"]["tags"])
    proof_file = base / "rescaled.proof"
    capture = ("import sys\nfrom harness.models import build_call\nfrom cachesvc_client.one_call import proof\n"
               "model, inputs, kwargs = build_call('tiny')\nbuilt = proof.capture(model, inputs, kwargs or {})\n"
               "with proof.environment_reads(built) as names:\n    model(*inputs)\n"
               "open(sys.argv[1], 'wb').write(built.with_environment(names).data)\n")
    done = subprocess.run([sys.executable, "-c", capture, str(proof_file)], capture_output=True, text=True,
                          env=Container(base, "capture").env(DEMO_MODEL_DIR=paths["rescaled"]), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    client = CacheClient(svc.url, token=svc.token, cache_dir=str(base / "cache"))
    relu = client.restore("tiny", *key_args, kind=support.KIND)
    assert relu.hit, relu.reason
    crafted = base / "model.pt2"
    with zipfile.ZipFile(relu.artifacts[0]) as good, zipfile.ZipFile(crafted, "w") as bad:
        for item in good.infolist():
            if item.filename != proof_container.ENTRY:
                bad.writestr(item, good.read(item))
        bad.writestr(proof_container.ENTRY, proof_file.read_bytes())
    publish_file(client.api, client.key("tiny-tampered", *key_args), support.KIND, path=str(crafted),
                 meta=relu.meta)
    return built


def test_verify_sends_a_package_that_differs_from_eager_to_torch_compile(tampered):
    """The fault: a hit whose package's machine code is not the computation its proof vouches for.
    verify=True's first call compares it with eager: the call returns torch.compile's answer, says why
    once, keeps it in calls."""
    r, err = run_logged(tampered, "--verify-first", "--steps", "2", "--name", "tiny-tampered", code="rescaled")
    assert r is not None, err[-3000:]
    c = r["compile"]
    assert c["calls"] == {"artifact": 0, "torch.compile": 3}, c  # the first call and both steps
    assert c["why"].startswith("the package's first output differs from eager's: output 0: "), c
    assert c["causes"] == [c["why"]] and any(c["why"] in w for w in c["report_warnings"]), c
    assert r["max_abs_diff"] < TOL, r  # the first output is torch.compile's, equal to eager
    assert err.count("differs from eager's") == 1, err[-3000:]


@pytest.mark.parametrize("how", [("--require-hit",), ()])
def test_require_hit_refuses_a_hit_that_falls_back_on_the_declared_inputs(tampered, how):
    env = {} if how else {"CACHESVC_REQUIRE_HIT": "1"}
    r, err = run_logged(tampered, "--verify-first", "--name", "tiny-tampered", *how, code="rescaled", **env)
    assert r is None, r
    assert "HitRequired: cachesvc compile tiny-tampered: a hit is required" in err, err[-3000:]
    assert "the package's first output differs from eager's" in err, err[-3000:]


def test_a_restarted_process_says_why_its_builder_published_no_package(built):
    """Two processes on one key: the builder's torch.export fails (a branch on a tensor's value); its
    snapshot carries the cause, and the restarted process, which misses the package, names it once."""
    svc, ctr, _, _ = built
    builder, err = run_logged(built, "--publish", code="noexport", ctr=Container(ctr.root.parent, "builder"))
    assert builder is not None, err[-3000:]
    failed = builder["publish"]["artifact"]["error"]
    assert failed.startswith("no proof the package computes this model: Dynamo could not trace the model in one "
                             "graph: "), builder["publish"]
    r, err = run_logged(built, code="noexport")
    assert r is not None, err[-3000:]
    c = r["compile"]
    assert c["source"] == "compiled" and c["calls"] == {"artifact": 0, "torch.compile": 1}, c
    assert c["why"].endswith(f"; the process that compiled it published no package: {failed}"), c
    assert c["causes"] == [c["why"]] and any(c["why"] in w for w in c["report_warnings"]), c
    assert err.count("published no package") == 1, err[-3000:]
    assert r["max_abs_diff"] < TOL
    # a restart that publishes by default (it has a write token) does not try the package again in its serving
    # thread: the failure is known for this key (same code, same torch); it says so, and the snapshot carries it on
    r, err = run_logged(built, "--auto-publish", code="noexport")
    assert r is not None, err[-3000:]
    assert "was not published" not in err and "Dynamo could not trace" not in err.replace(failed, ""), err[-3000:]


def test_require_hit_makes_a_miss_an_error_naming_why(built):
    r, err = run_logged(built, code="tanh", CACHESVC_REQUIRE_HIT="1")
    assert r is None, r
    assert "HitRequired: cachesvc compile tiny: a hit is required" in err and "no entry has this key" in err, err[-3000:]
    assert run(built, CACHESVC_REQUIRE_HIT="yes")["compile"]["source"] == "artifact"  # a hit passes
