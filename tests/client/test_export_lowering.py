"""A program torch.export cannot save as traced is lowered to ATen and saved so (client/one_call/export.py, issue 39).

transformers 4.x decoders build their attention mask with ``torch.vmap`` over a mask function that indexes a
tensor, under torch's ``TransformGetItemToIndex`` (torch/_dynamo/_trace_wrapped_higher_order_op.py). Non-strict
export records vmap's functorch calls and a ``flat_apply`` node; torch 2.13's serializer refuses the node, torch
2.11's already the ``lazy_load_decompositions`` call before it (on the H100, 2026-12-05: no 4.57 decoder got a
package). ``Masked`` below is that mask, built from the same torch pieces, small enough to export in a second.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from cachesvc_client.one_call import export


def _padding(pad):
    def inner(b, h, q, k):
        return pad[b, k]
    return inner


def _causal(b, h, q, k):
    return k <= q


def _both(*fns):
    def mask(b, h, q, k):
        out = q.new_ones((), dtype=torch.bool)
        for fn in fns:
            out = out & fn(b, h, q, k)
        return out
    return mask


class Masked(nn.Module):
    """A causal and padding mask as transformers 4.57 builds it (masking_utils: one vmap per b, h, q, kv)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, attention_mask):
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

        batch, n = attention_mask.shape
        fn = _both(_causal, _padding(attention_mask.bool()))
        for dims in ((None, None, None, 0), (None, None, 0, None), (None, 0, None, None), (0, None, None, None)):
            fn = torch.vmap(fn, in_dims=dims, out_dims=0)
        with TransformGetItemToIndex():
            mask = fn(torch.arange(batch), torch.arange(1), torch.arange(n), torch.arange(n))
        scores = self.proj(x) @ self.proj(x).transpose(-1, -2)
        return scores.masked_fill(~mask[:, 0], -1e4).softmax(-1)


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x).relu()


def _inputs():
    x = torch.randn(2, 5, 8)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, -2:] = 0  # padded
    return x, mask


def _not_aten(program) -> list:
    return sorted({str(n.target) for n in program.graph.nodes
                   if n.op == "call_function" and not isinstance(n.target, torch._ops.OpOverload)})


def test_the_vmap_mask_cannot_be_saved_as_traced():
    """The premise: without the lowering, torch's serializer refuses this program (if a torch release learns to
    save it, this test says so, and the lowering is no longer needed for it)."""
    model = Masked().eval()
    with torch.no_grad():
        program = torch.export.export(model, _inputs(), strict=False)
    assert _not_aten(program), "export left no functorch node"
    with pytest.raises(Exception, match="Failed serializing node"):
        torch.export.save(program, "/dev/null")


def test_a_program_that_cannot_be_saved_is_lowered_to_aten_and_computes_the_same(tmp_path):
    model = Masked().eval()
    made = export.export(model, _inputs(), str(tmp_path / "m.pt2"))
    assert (made.how, made.decomposed) == ("non-strict", True), made
    loaded = torch.export.load(str(tmp_path / "m.pt2"))
    assert _not_aten(loaded) == [], _not_aten(loaded)  # vmap's batching rules ran: plain ATen ops
    x, mask = _inputs()
    with torch.no_grad():
        assert torch.allclose(loaded.module()(x, mask), model(x, mask), atol=1e-6)


def test_a_program_that_saves_as_traced_is_not_lowered(tmp_path):
    made = export.export(Plain().eval(), (torch.randn(3, 8),), str(tmp_path / "m.pt2"))
    assert (made.how, made.decomposed) == ("non-strict", False), made
    assert torch.export.load(str(tmp_path / "m.pt2")) is not None


def test_when_even_the_lowered_program_cannot_be_saved_the_serializers_error_is_raised(tmp_path, monkeypatch):
    """A fault this torch does not produce (a lowering that fails), stubbed: the error that names the node is the
    one raised (the caller then tries strict export, and reports the first attempt's error)."""
    with torch.no_grad():
        program = torch.export.export(Masked().eval(), _inputs(), strict=False)

    def fails(self, *args, **kwargs):
        raise RuntimeError("lowering failed")

    monkeypatch.setattr(type(program), "run_decompositions", fails)
    with pytest.raises(Exception, match="Failed serializing node") as raised:
        export._save(program, str(tmp_path / "m.pt2"))
    assert raised.value.__cause__ is None and "lowering failed" not in str(raised.value)
