"""End to end on the CPU: transformers' models through the one call (issue 25), built from configs.

A tiny BERT (encoder) and GPT-2 (decoder, no KV cache), random weights, called as their users call
them: ``model(input_ids=..., attention_mask=...)`` with a padded sequence. A cold container
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

pytestmark = pytest.mark.slow
TOL = 1e-4
OUTPUTS = {"bert": "BaseModelOutputWithPoolingAndCrossAttentions", "gpt2": "CausalLMOutputWithCrossAttentions"}


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
    ctr = Container(tmp_path_factory.mktemp(f"one-call-{model}"))
    cold = ctr.run_worker("--model", model, "--one-call", "--publish", timeout=1200, **service.client_env())
    ctr.restart()
    return model, ctr, cold


def test_the_cold_container_compiles_and_publishes_the_package(published):
    model, _, cold = published
    assert cold["compile"]["source"] == "compiled" and cold["compile"]["route"] == "aoti", cold["compile"]
    artifact = cold["publish"]["artifact"]
    assert artifact.get("status") == "committed" and artifact["kind"] == "pt2-package", artifact
    assert cold["output_type"] == OUTPUTS[model] and cold["max_abs_diff"] < TOL


def test_the_restarted_container_is_served_by_the_package_and_gets_the_models_output(published, service):
    model, ctr, _ = published
    warm = ctr.run_worker("--model", model, "--one-call", "--scale-weights", "1.5", **service.client_env())
    assert warm["compile"]["source"] == "artifact", warm["compile"]
    assert warm["compile"]["calls"] == {"artifact": 1, "torch.compile": 0}
    assert "frames" not in warm["counters_all"] and "inductor" not in warm["counters_all"], warm["counters_all"]
    assert warm["output_type"] == OUTPUTS[model]  # the ModelOutput class, its fields rebuilt from the package
    assert warm["max_abs_diff"] < TOL  # on its own weights (scaled after publish): the package carries none
