"""The package keeps the model's NCHW layout where it has a depthwise convolution (client/one_call/build.py):
channels-last fp32 depthwise kernels are compiled by cuDNN at run time, at each new shape's first use,
which was a restarted efficientnet_b0's whole first call on the H200 (docs/benchmarks.md 1d)."""
from __future__ import annotations

import pytest

from cachesvc_client.one_call import build

torch = pytest.importorskip("torch")
nn = torch.nn


def _saved(model, tmp_path):
    """The program as the build child sees it: exported, saved and loaded again."""
    path = tmp_path / "program.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 4, 8, 8),)), str(path))
    return torch.export.load(str(path))


def test_a_depthwise_convolution_is_found(tmp_path):
    program = _saved(nn.Sequential(nn.Conv2d(4, 8, 1), nn.Conv2d(8, 8, 3, groups=8)), tmp_path)
    assert build.has_depthwise_conv(program)


@pytest.mark.parametrize("model", [nn.Sequential(nn.Conv2d(4, 8, 3), nn.Conv2d(8, 8, 1)),
                                   nn.Sequential(nn.Conv2d(4, 8, 3, groups=2)),  # two channels a group
                                   nn.Sequential(nn.Flatten(), nn.Linear(256, 8))],
                         ids=["plain", "grouped", "no-conv"])
def test_other_models_keep_the_layout_optimization(model, tmp_path):
    assert not build.has_depthwise_conv(_saved(model, tmp_path))
