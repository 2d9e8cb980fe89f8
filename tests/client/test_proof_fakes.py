"""torch's guard state unpickled with one fake-tensor mode for all its tensors (client/one_call/proof/fakes.py):
the fakes are what torch's own per-tensor unpickling makes of them, field for field, and only the block's
thread shares the mode. torch's own pickler writes the state here, as a build does."""
from __future__ import annotations

import io
import pickle
import threading

import pytest

torch = pytest.importorskip("torch")

from torch._dynamo.guards import GuardsStatePickler  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402

from cachesvc_client.one_call.proof import fakes  # noqa: E402


def state() -> bytes:
    """What a guard state holds of a model's tensors: weights with and without grad, a transposed and a
    channels-last one, a buffer of another dtype, one with a .grad."""
    with_grad = torch.randn(3, 4, requires_grad=True)
    with_grad.grad = torch.randn(3, 4)
    tensors = [torch.randn(8, 4, requires_grad=True), torch.randn(4, 8).t(), torch.zeros(5, dtype=torch.int64),
               torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last), with_grad]
    out = io.BytesIO()
    guarded = {id(t): t for t in [*tensors, with_grad.grad]}  # what the guard tree read: the rest is left out
    GuardsStatePickler(guarded, {}, {}, out).dump(tensors)
    return out.getvalue()


def fields(t) -> tuple:
    grad = fields(t.grad) if t.grad is not None else None
    return (type(t), tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad,
            torch._C._dispatch_keys(t).raw_repr(), grad)


def test_the_fakes_are_torchs_field_for_field_and_share_the_blocks_mode():
    data = state()
    theirs = pickle.loads(data)
    mode = FakeTensorMode()
    with fakes.one_mode(mode):
        ours = pickle.loads(data)
    assert all(isinstance(t, FakeTensor) for t in ours)
    assert [fields(t) for t in ours] == [fields(t) for t in theirs]
    assert all(t.fake_mode is mode for t in ours)
    # torch's own: a mode for each tensor
    assert len({id(t.fake_mode) for t in theirs}) == len(theirs)


def test_outside_the_block_and_in_other_threads_torch_makes_its_own_modes():
    data = state()
    mode = FakeTensorMode()
    seen = {}
    with fakes.one_mode(mode):
        worker = threading.Thread(target=lambda: seen.update(other=pickle.loads(data)))
        worker.start()
        worker.join()
    after = pickle.loads(data)
    for loaded in (seen["other"], after):
        assert all(t.fake_mode is not mode for t in loaded)
        assert len({id(t.fake_mode) for t in loaded}) == len(loaded)


def test_a_torch_whose_function_takes_other_arguments_is_left_as_it_is(monkeypatch):
    monkeypatch.setattr(fakes, "_installed", False)
    monkeypatch.setattr(fakes, "ARGUMENTS", ("meta_tensor", "device"))
    before = GuardsStatePickler.__dict__["_unpickle_tensor"]
    assert fakes._install() is False
    with fakes.one_mode(FakeTensorMode()):
        loaded = pickle.loads(state())
    assert GuardsStatePickler.__dict__["_unpickle_tensor"] is before
    assert len({id(t.fake_mode) for t in loaded}) == len(loaded)
