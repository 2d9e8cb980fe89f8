"""Tensors a model's forward makes travel inside its package (client/one_call/computed.py).

transformers 4.57's Gemma makes ``torch.tensor(hidden_size ** 0.5)`` in its forward: AOTInductor asked
the loader for it as ``_tensor_constant0``, which the live model does not have, so the model never got
a package. Here a small model makes a scalar and a 9-element table the same way: its package carries the
table (the scalar is a constant in the code), runs on another model's live weights and equals eager; a
package built without them cannot load. The publisher asks for them only where the trace read no tensor
outside the model (a global's would be the live process's), and the entry's bytes are untrusted
like the rest of the package: anything but tensors under AOTInductor's names is a LoadFailed.
"""
from __future__ import annotations

import io
import zipfile

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.errors import LoadFailed  # noqa: E402
from cachesvc_client.one_call import build, computed, export, proof, support, verify  # noqa: E402
from cachesvc_client.one_call.runner import Runner, live_constants  # noqa: E402
from tests.helpers import INDUCTOR_IN_PROCESS_MARKS, restore_recursion_limit  # noqa: E402,F401 - the fixture

pytestmark = [*INDUCTOR_IN_PROCESS_MARKS, pytest.mark.usefixtures("restore_recursion_limit")]


class MakesATable(torch.nn.Module):
    """Its forward makes a tensor from Python values (the table, times a config-like float)."""

    def __init__(self, seed: int, scale: float = 3.0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = torch.nn.Linear(8, 8)
        self.scale = scale

    def forward(self, x):
        table = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])[:8]
        return self.fc(x) * torch.tensor(self.scale ** 0.5, dtype=x.dtype) + table * self.scale  # Gemma's scalar too


OFFSET = torch.linspace(0, 1, 8)


class ReadsAGlobalTensor(MakesATable):
    """The same, plus a tensor held in a global: the live process's, not the computation's."""

    def forward(self, x):
        return super().forward(x) + OFFSET


class ReadsAPlainTensor(MakesATable):
    """The same, plus a tensor held in a plain attribute: the model's own, bound live by its path
    (test_plain_attributes.py), so the computation's tensors may still travel."""

    def __init__(self, seed: int):
        super().__init__(seed)
        self.offset = torch.linspace(0, 1, 8)

    def forward(self, x):
        return super().forward(x) + self.offset


class HoldsAViewBuffer(MakesATable):
    """The same, plus a buffer that is a view (DeBERTa-v2's ``position_ids``: ``arange(...).expand(1, -1)``):
    Dynamo takes the view's base as a graph input of its own, which is still the model's tensor."""

    def __init__(self, seed: int):
        super().__init__(seed)
        self.register_buffer("ids", torch.arange(8.0).expand((1, -1)), persistent=False)

    def forward(self, x):
        return super().forward(x) + self.ids[:, : x.shape[-1]]


@pytest.fixture(scope="module")
def x():
    return torch.randn(2, 8, generator=torch.Generator().manual_seed(1))


def test_a_package_carries_the_tensors_its_forward_makes_and_runs_on_live_weights(tmp_path, x):
    if support.support():
        pytest.skip(support.support())
    exported, package = str(tmp_path / "exported.pt2"), str(tmp_path / "model.pt2")
    export.export(MakesATable(0), (x,), exported)
    other = MakesATable(7)
    build.build(exported, package, mode=None, carry=True)
    with pytest.raises(LoadFailed, match="wants constants the model lacks: \\['_tensor_constant"):
        Runner(package, live_constants(other), "cpu")  # the build's table left beside it, not in it yet:
    # as a package built without carry=True (the proof read a tensor outside the model) stays
    assert computed.attach(package) == 1  # the table; the scalar is a constant in the code
    runner = Runner(package, live_constants(other), "cpu")
    with torch.no_grad():
        torch.testing.assert_close(runner(x), other(x))
        other.fc.bias.add_(1.0)  # the weights stay the live model's
        torch.testing.assert_close(runner(x), other(x))
        runner.rebind(live_constants(other))  # and a rebind keeps the carried table
        torch.testing.assert_close(runner(x), other(x))
    verify.verify(package, MakesATable(0), (x,), "cpu")  # the publish-time check, on other weights


def test_the_proof_says_whether_the_trace_read_a_tensor_outside_the_model(x):
    """What the publisher asks the build by (``carry=not reads_inputs``)."""
    assert not proof.capture(MakesATable(0), (x,), {}).reads_inputs
    assert proof.capture(ReadsAGlobalTensor(0), (x,), {}).reads_inputs
    attribute = proof.capture(ReadsAPlainTensor(0), (x,), {})
    assert not attribute.reads_inputs and attribute.attributes == ["offset"]
    # a buffer that is a view is read through its base: the model's own tensor, so its tensors travel (DeBERTa-v2
    # on transformers 4.57 got no package until then, 2026-12-07)
    assert not proof.capture(HoldsAViewBuffer(0), (x,), {}).reads_inputs


class RunsCode:
    def __reduce__(self):
        return (print, ("ran",))


def _package_with(tmp_path, payload):
    path = tmp_path / "p.pt2"
    data = payload if isinstance(payload, bytes) else _saved(payload)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(computed.ENTRY, data)
    return str(path)


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.mark.parametrize("payload, why", [
    (b"not a torch file", "could not be read"),
    ({"fc.weight": torch.ones(2)}, "not tensors under AOTInductor's constant names"),
    ({"_tensor_constant0": [1.0]}, "not tensors under AOTInductor's constant names"),
    ([torch.ones(2)], "not tensors under AOTInductor's constant names"),
    ({"_tensor_constant0": RunsCode()}, "could not be read"),  # weights_only: no code runs
])
def test_a_damaged_entry_is_a_load_failure(tmp_path, payload, why, capsys):
    with pytest.raises(LoadFailed, match=why):
        computed.read(_package_with(tmp_path, payload), "cpu")
    assert "ran" not in capsys.readouterr().out


def test_an_oversized_entry_is_not_read_and_no_entry_is_none(tmp_path, monkeypatch):
    package = _package_with(tmp_path, {"_tensor_constant0": torch.ones(64)})
    assert set(computed.read(package, "cpu")) == {"_tensor_constant0"}
    monkeypatch.setattr(computed, "MAX_BYTES", 16)
    with pytest.raises(LoadFailed, match="over 16"):
        computed.read(package, "cpu")
    bare = tmp_path / "bare.pt2"
    with zipfile.ZipFile(bare, "w") as archive:
        archive.writestr("model/data.bin", b"")
    assert computed.read(str(bare), "cpu") == {}
    (tmp_path / "junk.pt2").write_bytes(b"not a zip")
    with pytest.raises(LoadFailed, match="could not be read"):
        computed.read(str(tmp_path / "junk.pt2"), "cpu")
