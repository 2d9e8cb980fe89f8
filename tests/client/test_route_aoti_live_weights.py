"""A hit's package runs on the process's own weights, every one of them (client/one_call/runner.py).

A weightless package gets the live model's tensors through load_constants.
Inductor inlines small tensors into the kernels' code unless told not to: a
Linear(8, 4)'s bias then never reached the package, which ran on the
builder's bias in every process that loaded it. The build keeps every
tensor a constant, and the publish-time check runs on weights the package
was not built with, so a package that kept any builder value is refused.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.one_call import build, export, support, verify  # noqa: E402
from cachesvc_client.one_call.runner import Runner, live_constants  # noqa: E402
from tests.helpers import INDUCTOR_IN_PROCESS_MARKS, restore_recursion_limit  # noqa: E402,F401 - the fixture
from cachesvc_client.errors import LoadFailed  # noqa: E402

pytestmark = [*INDUCTOR_IN_PROCESS_MARKS, pytest.mark.usefixtures("restore_recursion_limit")]



def small(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()  # a 4-element bias: what Inductor inlines


@pytest.fixture(scope="module")
def x():
    return torch.randn(2, 8, generator=torch.Generator().manual_seed(1))


def test_a_package_runs_on_the_live_weights_small_bias_included(tmp_path, x):
    if support.support():
        pytest.skip(support.support())
    export.export(small(0), (x,), str(tmp_path / "exported.pt2"))
    phases = build.build(str(tmp_path / "exported.pt2"), str(tmp_path / "model.pt2"), mode=None)
    # where the build's seconds went, from the child: the whole and Inductor's timers inside it
    assert phases["imports"] > 0 and phases["package"] > 0
    # Inductor's timers are reported (rounded to ms: a tiny model's kernel codegen can round to 0.0)
    assert 0 <= phases["codegen"] <= phases["package"] and 0 < phases["wrapper_compile"] <= phases["package"]
    assert "precompiled_header" not in phases  # 16 s of a 40 s build, for two compiles: off
    other = small(7)
    runner = Runner(str(tmp_path / "model.pt2"), live_constants(other), "cpu")
    with torch.no_grad():
        torch.testing.assert_close(runner(x), other(x))
        other[0].bias.add_(1.0)  # an in-place update after loading is seen too
        torch.testing.assert_close(runner(x), other(x))
    verify.verify(str(tmp_path / "model.pt2"), small(0), (x,), "cpu")  # and it passes the check


def test_the_check_refuses_a_package_that_kept_the_builders_values(tmp_path, x):
    if support.support():
        pytest.skip(support.support())
    import torch._inductor.config as inductor_config

    model = small(0)
    with torch.no_grad(), inductor_config.patch({"aot_inductor.package_constants_in_so": False}):
        # what the build did before: the bias inlined into the kernel
        path = torch._inductor.aoti_compile_and_package(torch.export.export(model, (x,)),
                                                         package_path=str(tmp_path / "inlined.pt2"))
    with pytest.raises(LoadFailed, match="does not reproduce eager on weights it was not built with"):
        verify.verify(path, model, (x,), "cpu")


@pytest.mark.parametrize("stdout, phases", [
    ('{"build_phases": {"package": 12.34567, "codegen": 3}}\n', {"package": 12.346, "codegen": 3.0}),
    ('torch printed this\n{"build_phases": {"package": 1}}', {"package": 1.0}),
    ("", {}),
    ("not json", {}),
    ('{"build_phases": {"package": "soon"}}', {}),
    ('{"build_phases": []}', {}),
    ('["build_phases"]', {}),
    ('{"other": 1}\n', {}),
])
def test_the_build_phases_are_read_from_the_childs_last_line_or_left_out(stdout, phases):
    assert build._phases(stdout) == phases
