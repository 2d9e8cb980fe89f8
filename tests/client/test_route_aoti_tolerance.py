"""How close a package must be to eager before it is published (one_call/verify.py: close).

On the H200 the publish check's perturbed weights made ResNet-50's outputs
reach 5128; eager's own TF32 noise was 3.19 and the package 1.28 from eager.
A fixed absolute tolerance (0.05) refused every
correct package; the tolerance is a fraction of the output's scale, so a
package off by the output's scale (another model's weights) is still refused.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.one_call.verify import close  # noqa: E402


def logits(scale: float) -> torch.Tensor:
    out = torch.linspace(-scale, scale, 8000).reshape(8, 1000)
    out[3, 171] = 0.33  # an element near zero in a large output
    return out


def test_tf32_noise_on_a_large_output_passes_and_a_wrong_answer_does_not():
    want = logits(5128.0)
    got = want.clone()
    got[3, 171] += 1.28  # the H200's measured distance, on the element where the relative error is largest
    close(got, want, "cuda")
    with pytest.raises(AssertionError):
        close(want * 0.8, want, "cuda")  # other weights: off by a fraction of the scale


def test_full_float32_is_held_ten_times_tighter_than_tf32():
    want = logits(5128.0)
    got = want.clone()
    got[3, 171] += 10.0  # 2e-3 of the scale
    close(got, want, "cuda")
    with pytest.raises(AssertionError):
        close(got, want, "cpu")


def test_small_outputs_keep_the_absolute_floor():
    want = torch.full((4,), 0.2)
    close(want + 5e-4, want, "cpu")
    with pytest.raises(AssertionError):
        close(want + 5e-3, want, "cpu")


def test_bf16_rounding_within_eagers_own_error_passes_and_another_models_answer_does_not():
    """BERT-base bf16 on the H200: 0.024 from eager, past the fixed 0.02; eager itself is that far from
    a float32 copy of the same weights, so the package is within eager's own rounding."""
    reference = torch.linspace(-1, 1, 1536).reshape(2, 768)
    want = reference.to(torch.bfloat16)
    want[0, 5] += 0.02  # eager's own bf16 error over 12 layers
    got = want.clone()
    got[1, 0] += 0.0239  # an element near zero
    with pytest.raises(AssertionError):
        close(got, want, "cuda")  # the fixed tolerance alone refused a correct package
    close(got, want, "cuda", reference=reference)
    with pytest.raises(AssertionError):
        close(want.flip(1), want, "cuda", reference=reference)  # another model's answer


def test_the_first_call_check_holds_bf16_to_eagers_own_error_too():
    """verify=True's check (differs) and the publish check (compare) use close's rule with the reference."""
    from cachesvc_client.errors import LoadFailed
    from cachesvc_client.one_call.verify import compare, differs

    reference = torch.linspace(-1, 1, 1536).reshape(2, 768)
    want = reference.to(torch.bfloat16)
    want[0, 5] += 0.02
    got = want.clone()
    got[1, 0] += 0.0239
    assert "beyond 0.02 of eager" in differs((got,), (want,), "cuda")
    assert differs((got,), (want,), "cuda", reference=[reference]) is None
    assert differs((want.flip(1),), (want,), "cuda", reference=[reference]) is not None
    compare([got], [want], "cuda", reference=[reference])
    with pytest.raises(LoadFailed):
        compare([got], [want], "cuda")


def test_a_float32_reference_is_made_for_a_bf16_model_only():
    from cachesvc_client.one_call.verify import float32_reference

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    assert float32_reference(model, [((x,), {})]) is None  # float32 already: eager is the reference
    model = model.to(torch.bfloat16)
    wide, = float32_reference(model, [((x.bfloat16(),), {})])
    assert wide[0].dtype == torch.float32 and model[0].weight.dtype == torch.bfloat16  # a copy widened
    with torch.no_grad():
        eager = model(x.bfloat16()).float()
        exact = torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(
            x.bfloat16().float(), model[0].weight.float(), model[0].bias.float())), model[2].weight.float(),
            model[2].bias.float())
    torch.testing.assert_close(wide[0], exact)
    assert float((eager - exact).abs().max()) > 0  # bf16 eager rounds; the reference does not
