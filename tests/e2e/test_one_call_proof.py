"""The one call serves a package only where it can prove the package is this model's computation (issue 38).

Three packages are built through the one call in one container (harness/proof_rows.py build): a model that
reads every kind of state the issue's rows change (harness/rows_model.py), the same model built in train
mode, and a model whose ``squeeze()`` makes batch 1 another computation, built for a declared batch range.
One restarted container then runs every row: the deploy's files edited (a class constant, an enum value,
a module-level dataclass and partial, an lru_cache helper, a helper reached as ``pkg.sub.fn()``, a
TorchScript helper, attributes holding a dataclass, a callable object, a dict and a numpy scalar, hooks
given as a partial and as a stateful object), or the process changed before ``compile()`` (an
environment variable, a monkeypatched ``F.gelu``, the instance's ``forward`` replaced, a global hook, a
weight with transposed strides, ``channels_last``, train mode), or after the first served call (grad
mode, autocast, ``train()``, a hook, strided inputs, a swapped submodule, an untied weight). Each must
be a miss, a call the package does not serve, or the package on the live state equal to eager; never the
old package's answer. Calls after the first hit run with ``require_hit=True``: a call the package does
not serve raises HitRequired naming the guard, instead of compiling, so the rows stay cheap; one row lets
torch.compile serve for real and compares it with eager.

A property test draws random sets of edits against one proof (no package: the proof alone decides): a
restart the proof admits must compute what the build did.
"""
from __future__ import annotations

import pytest

from cachesvc_client.one_call import support
from harness.containers import Container
from harness.proof_rows import CALL_ROWS, CHANGE_ROWS, FILE_ROWS
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow
TOL = 1e-4
LOAD_ROWS = [*FILE_ROWS, *CHANGE_ROWS, "train_restart", "built_in_train"]
AFTER_HIT_ROWS = [r for r in CALL_ROWS if r != "swapped_submodule"]
ROWS = ["unchanged", *LOAD_ROWS, *CALL_ROWS, "grad_fallback", "squeeze_ends", "helper_chain", "attrdict_config"]
#: no .pyc: a row rewrites a file within the same second as the last, and a stale .pyc would answer for it
PLAIN = {"PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """The packages the rows restart against, and every row's result from one restarted container."""
    import torch  # noqa: F401 - support reads torch's API

    why = support.support()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("proof-rows")
    deploy = str(base / "deploy")
    with ServiceProcess(base / "svc") as svc:
        ctr = Container(base / "containers")
        built = ctr.run_script("proof_rows.py", "build", deploy, timeout=900, **svc.client_env(), **PLAIN)
        ctr.restart()
        restarted = ctr.run_script("proof_rows.py", "restart", deploy, *ROWS, timeout=900, **svc.client_env(),
                                   **PLAIN)
        yield built, restarted


def test_the_packages_the_rows_restart_against_were_published(rows):
    built, _ = rows
    for name in ("rows", "rows-train", "rows-squeeze"):
        assert built[name]["artifact"].get("status") == "committed", (name, built[name])
        assert built[name]["artifact"]["proof"]["guards"] > 0


def test_an_unchanged_restart_is_served_by_the_package_and_equals_eager(rows):
    row = rows[1]["unchanged"]
    assert row["source"] == "artifact" and row["calls"] == {"artifact": 1, "torch.compile": 0}, row
    assert row["diff"] < TOL


@pytest.mark.parametrize("row", LOAD_ROWS)
def test_a_restart_that_differs_is_not_served_by_the_old_package(rows, row):
    """A miss: where the key guessed the difference (the code or config it walks), another key; else the
    old package, whose proof refuses this model (the next test shows the proof refuses every row alone)."""
    result = rows[1][row]
    assert result["source"] == "compiled" and result["calls"]["artifact"] == 0, result
    assert result["why"] == "no entry has this key" or result["why"].startswith("not using the published artifact: "), \
        result


@pytest.fixture(scope="module")
def proof_alone(tmp_path_factory):
    base = tmp_path_factory.mktemp("proof-alone")
    return Container(base / "ctr").run_script("proof_rows.py", "proof", str(base / "deploy"), timeout=900, **PLAIN)


@pytest.mark.parametrize("row", [*FILE_ROWS, *CHANGE_ROWS, "train_restart"])
def test_the_proof_alone_refuses_every_row(proof_alone, row):
    """The key out of the way: the unedited model's proof, loaded against the row's model, does not hold."""
    assert proof_alone[row]["held"] is False and proof_alone[row]["why"], proof_alone[row]
    assert proof_alone["unchanged"] == {"held": True, "why": ""}, proof_alone["unchanged"]


@pytest.mark.parametrize("row", AFTER_HIT_ROWS)
def test_a_call_after_the_first_hit_in_another_state_is_not_served(rows, row):
    """The package served the first call only. A call its guards refuse raises HitRequired (require_hit: on the
    declared inputs); one off the declared inputs (train mode, other strides) is torch.compile's, equal to eager."""
    result = rows[1][row]
    assert result["source"] == "artifact" and result["calls"]["artifact"] == 1, result
    if "why" in result:
        assert "the package's guards fail for this call" in result["why"] and not result["calls"]["torch.compile"]
    else:
        assert result["calls"]["torch.compile"] == 1 and result["diff"] < TOL, result


def test_a_swapped_submodule_is_served_on_its_own_weights(rows):
    result = rows[1]["swapped_submodule"]
    assert result["calls"] == {"artifact": 2, "torch.compile": 0} and result["diff"] < TOL, result


def test_a_call_the_guards_refuse_runs_torch_compile_and_equals_eager(rows):
    result = rows[1]["grad_fallback"]
    assert result["calls"] == {"artifact": 1, "torch.compile": 1} and result["diff"] < TOL, result


def test_a_declared_range_serves_where_the_package_is_eager_and_not_where_squeeze_differs(rows):
    result = rows[1]["squeeze_ends"]
    for size in ("4", "8", "2"):
        assert result[size].get("diff", 1) < TOL and result[size]["shape"] == result[size]["eager_shape"], result
    assert "why" in result["1"], result  # batch 1: eager's squeeze() drops the dim, the package does not


@pytest.mark.parametrize("row", ["helper_chain", "attrdict_config"])
def test_compile_does_not_raise_for_what_the_key_cannot_read(rows, row):
    result = rows[1][row]
    assert "raised" not in result and result["source"] == "compiled", result


def test_random_edits_are_refused_or_compute_what_the_build_did(tmp_path):
    stats = Container(tmp_path / "ctr").run_script("proof_rows.py", "property", str(tmp_path / "deploy"), "40",
                                                   timeout=900, **PLAIN)
    assert stats["violations"] == [], stats
    assert stats["served"] > 0 and stats["refused"] > 0, stats  # neither side vacuous
