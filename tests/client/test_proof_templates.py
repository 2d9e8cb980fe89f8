"""Guard sources' texts compiled once (proof/templates.py): torch's values unchanged, its eval given back."""
from __future__ import annotations

import builtins
import threading

import torch
import torch._guards as torch_guards
from torch._dynamo.source import AttrSource, GetItemSource, LocalSource

from cachesvc_client.one_call.proof import templates


def sources():
    """Chained sources as Dynamo makes them for a module's parameter and a list's item."""
    base = LocalSource("self")
    weight = AttrSource(AttrSource(AttrSource(base, "layers"), "0"), "weight")
    item = GetItemSource(AttrSource(base, "sizes"), 1)
    return weight, item


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
        self.sizes = [3, 5]


def values(model):
    weight, item = sources()
    scope, cache = {"L": {"self": model}, "G": {}, "__builtins__": builtins.__dict__}, {}
    return weight.get_value(scope, {}, cache), item.get_value(scope, {}, cache)


def test_torch_reads_the_same_values_and_its_eval_is_given_back():
    model = Holder()
    plain = values(model)
    templates.compiled.cache_clear()
    with templates.compiled_once():
        assert torch_guards.eval is templates._eval
        inside = values(model)
        again = values(model)
    assert "eval" not in vars(torch_guards)
    assert inside[0] is plain[0] is model.layers[0].weight and inside[1] == plain[1] == 5 and again == inside
    info = templates.compiled.cache_info()
    assert info.hits >= info.misses > 0  # the second read compiled nothing


def test_nested_and_concurrent_uses_end_with_the_last():
    entered, leave = threading.Event(), threading.Event()

    def other():
        with templates.compiled_once():
            entered.set()
            leave.wait(5)

    worker = threading.Thread(target=other)
    worker.start()
    entered.wait(5)
    with templates.compiled_once():
        pass
    assert torch_guards.eval is templates._eval  # the other thread still inside
    leave.set()
    worker.join()
    assert "eval" not in vars(torch_guards)


def test_the_callers_scope_and_whitespace_behave_as_the_builtins():
    x = 41  # noqa: F841 - read by the expression below from this frame
    assert templates._eval(" x + 1\t") == 42
    assert templates._eval("y * 2", {"y": 4}) == 8
    assert templates._eval(compile("3", "<t>", "eval")) == 3
