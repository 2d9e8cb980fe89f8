"""A plain tensor attribute of the model is the model's own: the package reads the live one, by its path.

transformers 4.57's GPT-J keeps its sinusoidal table and its attention scale as plain attributes of each
attention module (``self.embed_positions = create_sinusoidal_positions(...)``), not as buffers. torch.export
lifted them as constants, AOTInductor asked the loader for them as ``_tensor_constant1..3``, and the model
never got a package (restart 2.25x eager on the CPU). Now the proof records such attributes by path
(proof/capture.py), export makes them non-persistent buffers of the program (export.bind_attributes), and a
hit binds the live tensors there, checked before each call like the weights (binding.py, proof/pins.py).
Here a small model holds a table and a 0-dim scale the same way; the package runs on another model's values.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.one_call import build, export, proof, support, verify  # noqa: E402
from cachesvc_client.one_call.binding import Binding  # noqa: E402
from cachesvc_client.one_call.proof.guards import INPUT, attribute_fqn  # noqa: E402
from cachesvc_client.one_call.runner import Runner  # noqa: E402
from tests.helpers import INDUCTOR_IN_PROCESS_MARKS, restore_recursion_limit  # noqa: E402,F401 - the fixture

pytestmark = [*INDUCTOR_IN_PROCESS_MARKS, pytest.mark.usefixtures("restore_recursion_limit")]

ATTRIBUTES = ["attn.scale", "attn.table"]


class Attention(torch.nn.Module):
    def __init__(self, offset: float):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.table = torch.linspace(offset, offset + 1.0, 8)  # plain attributes, as GPT-J's on transformers 4.57
        self.scale = torch.tensor(0.5 + offset)

    def forward(self, x):
        return self.proj(x) * self.scale + self.table


class Net(torch.nn.Module):
    def __init__(self, seed: int, offset: float = 0.0):
        super().__init__()
        torch.manual_seed(seed)
        self.attn = Attention(offset)

    def forward(self, x):
        return self.attn(x).relu()


@pytest.fixture(scope="module")
def x():
    return torch.randn(2, 8, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def built(tmp_path_factory, x):
    """(the proof, what export made, the package): the publisher's steps for Net(0)."""
    if support.support():
        pytest.skip(support.support())
    folder = tmp_path_factory.mktemp("attributes")
    exported, package = str(folder / "exported.pt2"), str(folder / "model.pt2")
    with torch.no_grad():
        made_proof = proof.capture(Net(0), (x,), {})
    made = export.export(Net(0), (x,), exported, attributes=made_proof.attributes)
    build.build(exported, package, mode=None, carry=not made_proof.reads_inputs)
    proof.attach(package, made_proof)
    return made_proof, made, package


def _bound(model, package):
    binding = Binding(model)
    checked = proof.Proof.load(proof.read(package), model)
    binding.bind_attributes(checked.attributes)
    return binding, checked, Runner(package, binding.constants, "cpu")


def test_the_proof_names_the_attributes_and_export_binds_them(built):
    made_proof, made, _ = built
    assert made_proof.attributes == ATTRIBUTES
    assert not made_proof.reads_inputs  # nothing outside the model: no INPUT entry compares their values
    assert not [k for e in made_proof.entries for k in e.header["described"] if k.startswith(INPUT)]
    assert made.attributes == ATTRIBUTES


def test_the_package_runs_on_the_live_attributes_of_another_model(built, x):
    """Fails on the code before: the package wanted ``_tensor_constant*``, which no live tensor is called."""
    _, _, package = built
    other = Net(7, offset=3.0)  # other weights, another table and scale
    binding, checked, runner = _bound(other, package)
    assert set(ATTRIBUTES) <= set(runner.constant_fqns)
    assert not [f for f in runner.constant_fqns if f.startswith("_tensor_constant")]
    with torch.no_grad():
        assert checked.holds((x,), {})
        torch.testing.assert_close(runner(x), other(x))
        other.attn.table.mul_(-2.0)  # an in-place update is read as it is
        other.attn.scale.fill_(4.0)
        torch.testing.assert_close(runner(x), other(x))
    assert binding.changed() is None


def test_a_replaced_attribute_fails_its_pin_and_is_rebound(built, x):
    _, _, package = built
    model = Net(3)
    binding, checked, runner = _bound(model, package)
    assert {id(model.attn.table), id(model.attn.scale)} <= checked.pinned()
    with torch.no_grad():  # the build traced under no_grad: the trees hold there
        assert checked.holds((x,), {})
        model.attn.table = torch.full((8,), 9.0)  # another object, the same layout
        assert not checked.holds((x,), {})  # the pin
        assert binding.changed() == "attn.table"  # the walk
        assert binding.refresh() is None
        runner.rebind(binding.constants)
        assert checked.unpinned().holds((x,), {})
        torch.testing.assert_close(runner(x), model(x))
    model.attn.table = torch.zeros(4)  # another layout: the package cannot run on it
    assert binding.changed() == "attn.table"
    assert "attn.table was replaced by a tensor of shape (4,)" in binding.refresh()


def test_a_model_without_the_attribute_cannot_bind_the_package(built):
    _, _, package = built
    model = Net(0)
    model.attn.table = model.attn.table.tolist()  # no longer a tensor: left out of the binding
    assert "attn.table" not in Binding(model, ATTRIBUTES).constants
    with pytest.raises(Exception, match="wants constants the model lacks"):
        Runner(package, Binding(model, ATTRIBUTES).constants, "cpu")


def test_the_publish_check_perturbs_the_attributes_too(built, x):
    _, made, package = built
    model = Net(0)
    before = model.attn.table.clone()
    verify.perturb(model, made.attributes)
    assert not torch.equal(before, model.attn.table)
    verify.verify(package, Net(0), (x,), "cpu", attributes=made.attributes)


@pytest.mark.parametrize("source, fqn", [
    ("L['self']._modules['transformer']._modules['h']._modules['0']._modules['attn'].embed_positions",
     "transformer.h.0.attn.embed_positions"),
    ("L['self'].scale", "scale"),
    ("L['self']._modules['fc']._parameters['weight']", None),  # a parameter's slot, bound as a weight
    ("L['self']._modules['fc'].cache.table", None),  # an attribute of an attribute: not a module's own
    ("G['TABLE']", None),
    ("L['args'][0].table", None),
])
def test_only_a_module_s_own_attribute_is_bound_by_path(source, fqn):
    assert attribute_fqn(source) == fqn


class Counts(torch.nn.Module):
    """Its forward replaces a plain tensor attribute: the package would read it and never change it."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.count = torch.zeros(())

    def forward(self, x):
        self.count = self.count + 1
        return self.fc(x) * self.count


class CountsInPlace(Counts):
    def forward(self, x):
        self.count.add_(1)
        return self.fc(x) * self.count


@pytest.mark.parametrize("model", [Counts, CountsInPlace])
def test_a_forward_that_changes_a_bound_attribute_gets_no_package(model, x, tmp_path):
    """torch.export drops the change (the program reads ``count`` and never writes it back), so such a package
    would serve every call the first one's answer. The publish check runs eager on a copy first and refuses it,
    before the package runs at all (no package is built here)."""
    with torch.no_grad():
        assert proof.capture(model(), (x,), {}).attributes == ["count"]
    with pytest.raises(Exception, match="changes its attribute count"):
        verify.verify(str(tmp_path / "never-built.pt2"), model(), (x,), "cpu", attributes=["count"])
