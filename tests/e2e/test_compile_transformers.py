"""End to end on the CPU: transformers' models through the one call (issue 25), built from configs.

A tiny BERT (encoder) and GPT-2 (decoder, no KV cache), random weights, called as their users call
them: ``model(input_ids=..., attention_mask=...)`` with a padded sequence; and, on transformers 4.57 (the
last 4.x, in a folder of its own made once per run: tests/shipped.py), a Llama-family decoder, whose
mask 4.x builds with ``torch.vmap``: non-strict export leaves a ``flat_apply`` node that cannot be saved,
so its program is lowered to ATen before it is saved (export.py; torch 2.11 refused even strict export's). A cold container
compiles through the one call on a miss and publishes the package; a restarted container (same
paths, empty HOME, TMPDIR and cache dir: a subprocess) is served by the package on weights of its
own: Dynamo traces no frame, Inductor does not run, ``calls`` counts the artifact, and the output
equals eager's and is still the model's ``ModelOutput`` class. Before issue 25 the package build
failed ("We ran into an error when deserializing the saved file": the build child had not imported
the ModelOutput classes the program's output spec names) and the restart compiled.
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from cachesvc_client.one_call import support  # noqa: E402
from harness.containers import Container  # noqa: E402
from harness.service import ServiceProcess  # noqa: E402
from tests import shipped  # noqa: E402

pytestmark = pytest.mark.slow
TOL = 1e-4
OUTPUTS = {"bert": "BaseModelOutputWithPoolingAndCrossAttentions", "gpt2": "CausalLMOutputWithCrossAttentions",
           "llama@4": "CausalLMOutputWithPast"}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    import torch  # noqa: F401 - support reads torch's API

    if support.support():
        pytest.skip(support.support())
    with ServiceProcess(tmp_path_factory.mktemp("svc")) as svc:
        yield svc


@pytest.fixture(scope="module", params=sorted(OUTPUTS))
def published(request, service, tmp_path_factory):
    """A container that compiled ``model`` through the one call and published it, then restarted."""
    model = request.param
    ctr = Container(tmp_path_factory.mktemp(f"one-call-{model.replace('@', '-')}"))
    cold = run(ctr, model, "--publish", timeout=1200, **service.client_env())
    ctr.restart()
    return model, ctr, cold


def run(ctr, model, *flags, **env):
    """The worker through the one call; ``name@4``: on transformers 4.57 (its folder first on the path)."""
    name, _, major = model.partition("@")
    if major:
        env["PYTHONPATH"] = f"{shipped.transformers_4()}:{ctr.harness}"
    return ctr.run_worker("--model", name, "--one-call", *flags, **env)


def test_the_cold_container_compiles_and_publishes_the_package(published):
    model, _, cold = published
    assert cold["compile"]["source"] == "compiled" and cold["compile"]["route"] == "aoti", cold["compile"]
    artifact = cold["publish"]["artifact"]
    assert artifact.get("status") == "committed" and artifact["kind"] == "pt2-package", artifact
    assert cold["output_type"] == OUTPUTS[model] and cold["max_abs_diff"] < TOL
    assert cold["transformers"].startswith("4.") == model.endswith("@4"), cold["transformers"]
    if model.endswith("@4"):  # transformers 4's vmap mask: its non-strict program cannot be saved as traced
        assert artifact["exported"] == "non-strict, lowered to ATen", artifact
    else:
        assert artifact["exported"] == "non-strict", artifact


def test_the_restarted_container_is_served_by_the_package_and_gets_the_models_output(published, service):
    model, ctr, _ = published
    warm = run(ctr, model, "--scale-weights", "1.5", **service.client_env())
    assert warm["compile"]["source"] == "artifact", warm["compile"]
    assert warm["compile"]["calls"] == {"artifact": 1, "torch.compile": 0}
    assert "frames" not in warm["counters_all"] and "inductor" not in warm["counters_all"], warm["counters_all"]
    assert warm["output_type"] == OUTPUTS[model]  # the ModelOutput class, its fields rebuilt from the package
    assert warm["max_abs_diff"] < TOL  # on its own weights (scaled after publish): the package carries none
