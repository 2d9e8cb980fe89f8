"""Where a guard's source starts (proof/guards.py ``root``): the proof's comparison skips the call's own inputs
by it, so a memo that answered for the wrong chain would compare an input as the model, or skip the model."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._dynamo.source import (  # noqa: E402
    AttrSource, ConstantSource, DictGetItemSource, GetItemSource, GlobalSource, LocalSource,
)

from cachesvc_client.one_call.proof.guards import root  # noqa: E402


def _sources():
    model = LocalSource("self")
    block = AttrSource(AttrSource(model, "trunk"), "block1")
    weight = DictGetItemSource(AttrSource(block, "_parameters"), "weight")
    arg = GetItemSource(LocalSource("args"), 0)
    shared = AttrSource(GlobalSource("torch"), "nn")
    return [
        (weight, "self"), (AttrSource(block, "training"), "self"), (block, "self"), (model, "self"),
        (AttrSource(arg, "shape"), "args"), (arg, "args"),
        (AttrSource(shared, "functional"), "G"), (shared, "G"), (GlobalSource("math"), "G"),
        (AttrSource(ConstantSource("x"), "y"), None),
    ]


def test_each_source_starts_where_its_chain_ends():
    for source, want in _sources():
        assert root(source) == want, source.name


def test_a_shared_memo_gives_every_chain_its_own_answer_in_any_order():
    sources = _sources()
    for order in (sources, sources[::-1], sources[1::2] + sources[::2]):
        memo: dict = {}
        assert [root(s, memo) for s, _ in order] == [want for _, want in order]
        assert [root(s, memo) for s, _ in order] == [want for _, want in order]  # the memo's own answers
