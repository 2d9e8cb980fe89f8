"""A model that calls a custom operator gets a package (client/one_call/export.py, ``op_modules``).

transformers 5's Mixtral routes its experts through ``torch.ops.transformers.grouped_mm_fallback``, an operator
``transformers.integrations.moe`` registers when it is imported. The build child had not imported it, so it
could not read the exported program back ("We failed to resolve torch.ops.transformers.grouped_mm_fallback
.default to an operator"), and Mixtral was never served by a package (2.23x eager on the bench CPU,
2026-12-07). The export now names the modules that register the custom operators its program calls, and the
child imports them with the output's pytree types. Here a small model calls an operator of tests/helpers.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.errors import LoadFailed  # noqa: E402
from cachesvc_client.one_call import build, export, support  # noqa: E402
from cachesvc_client.one_call.runner import Runner, live_constants  # noqa: E402
from tests.helpers import INDUCTOR_IN_PROCESS_MARKS, restore_recursion_limit  # noqa: E402,F401 - the fixture
from tests.helpers.custom_ops import CallsACustomOp  # noqa: E402 - registers cachesvc_test::scaled_add

pytestmark = [*INDUCTOR_IN_PROCESS_MARKS, pytest.mark.usefixtures("restore_recursion_limit")]
LIBRARY = "tests.helpers.custom_ops"


@pytest.fixture(scope="module")
def x():
    return torch.randn(2, 8, generator=torch.Generator().manual_seed(1))


def test_the_export_names_the_module_that_registers_each_custom_operator_and_no_other(tmp_path, x):
    made = export.export(CallsACustomOp(0), (x,), str(tmp_path / "exported.pt2"))
    assert LIBRARY in made.imports, made.imports
    program = torch.export.export(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), (x,))
    assert export.op_modules(program.graph) == []  # aten's operators: nothing to import


def test_a_package_that_calls_a_custom_operator_builds_with_its_module_imported_and_runs_on_live_weights(tmp_path, x):
    if support.support():
        pytest.skip(support.support())
    exported, package = str(tmp_path / "exported.pt2"), str(tmp_path / "model.pt2")
    made = export.export(CallsACustomOp(0), (x,), exported)
    with pytest.raises(LoadFailed, match="deserializing the saved file"):  # the child without the import
        build.build(exported, str(tmp_path / "without.pt2"), mode=None,
                    imports=[m for m in made.imports if m != LIBRARY])
    build.build(exported, package, mode=None, imports=made.imports)
    other = CallsACustomOp(7)
    runner = Runner(package, live_constants(other), "cpu")
    with torch.no_grad():
        torch.testing.assert_close(runner(x), other(x))
        other.skip.add_(1.0)  # the live weights, through the custom operator too
        torch.testing.assert_close(runner(x), other(x))
