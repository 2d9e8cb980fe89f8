"""The hook dicts the build saw empty (proof/hooks.py): the proof's comparison leaves their guards to it,
so at load each must be there and empty, and a hook registered later is seen at the next check."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._dynamo.source import AttrSource, LocalSource  # noqa: E402

from cachesvc_client.one_call.proof import NoProof  # noqa: E402
from cachesvc_client.one_call.proof.hooks import Hooks  # noqa: E402


def _hooks_of(*path):
    source = LocalSource("self")
    for name in path:
        source = AttrSource(source, name)
    return AttrSource(source, "_forward_hooks")


def _model():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())


def test_empty_dicts_load_and_a_later_hook_is_seen():
    model = _model()
    hooks = Hooks(model)
    hooks.add([_hooks_of(), _hooks_of("0")], {"self": model}, {})
    assert hooks.why() is None
    model[0].register_forward_hook(lambda *a: None)
    assert "has a hook" in hooks.why()


def test_a_dict_with_a_hook_at_load_is_no_proof():
    model = _model()
    model[1].register_forward_hook(lambda *a: None)
    with pytest.raises(NoProof, match="has a hook"):
        Hooks(model).add([_hooks_of("1")], {"self": model}, {})


def test_a_module_the_build_read_that_is_gone_is_no_proof_at_load_and_skipped_after():
    model = _model()
    with pytest.raises(NoProof, match="is not there in this process"):
        Hooks(model).add([_hooks_of("2")], {"self": model}, {})
    hooks = Hooks(model)
    hooks.add([_hooks_of("1")], {"self": model}, {})
    del model[1]  # after the load: the slot's own guards fail the call; the hook check skips it
    hooks.refresh()
    assert hooks.why() is None
