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
