"""The proof's trees pin the module tensors a trace read (client/one_call/proof/pins.py): a tensor replaced in its
slot, by any route, fails the tree, so the binding need not walk the slots before each call; ``.data =`` keeps the
object and is the binding's pointer check's. A real capture (Dynamo's trace) in a fresh process, as a build makes it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = r'''
import json, sys
import torch
from torch import nn
from cachesvc_client.one_call import proof
from cachesvc_client.one_call.binding import Binding


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.body(x))


def fresh():
    torch.manual_seed(0)
    return Net().eval()


x = torch.randn(3, 8)
with torch.no_grad():
    data = proof.capture(fresh(), (x,), {}).data
out = {}


def row(name, change):
    model = fresh()
    pinned, plain, binding = proof.Proof.load(data, model), proof.Proof.load(data, model, pin_tensors=False), Binding(model)
    change(model)
    with torch.no_grad():
        out[name] = {"pinned": pinned.holds((x,), {}), "plain": plain.holds((x,), {}), "walk": binding.changed(),
                     "storage": binding.changed(slots=False), "pins": pinned.pins_tensors,
                     "pinned_ids": len(pinned.pinned()), "unpinned": None}
        if not out[name]["pinned"] and out[name]["walk"]:
            again = pinned.unpinned()
            out[name]["unpinned"] = [again.holds((x,), {}), again.pins_tensors]


def assign(model):
    model.head.weight = nn.Parameter(model.head.weight.detach().clone())


def dict_write(model):  # as accelerate's loaders and functional_call write it: no registration hook runs
    model.body[1]._buffers["running_mean"] = model.body[1].running_mean.clone()


def swap_module(model):
    model.body[0] = nn.Linear(8, 16)


def state_dict_assign(model):
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)


def data_swap(model):
    model.head.weight.data = model.head.weight.data.clone()


def in_place(model):
    with torch.no_grad():
        model.head.weight.mul_(2)


for name, change in [("none", lambda m: None), ("assign", assign), ("dict_write", dict_write),
                     ("swap_module", swap_module), ("state_dict_assign", state_dict_assign),
                     ("data_swap", data_swap), ("in_place", in_place)]:
    row(name, change)
from cachesvc_client.one_call.proof import pins as pins_mod
real = pins_mod.PIN_IDENTITY
for name, stand_in in [("pin_not_made", lambda pins, builder, guard: setattr(pins, "failed", "no leaf here")),
                       ("tree_refuses_pins", lambda pins, builder, guard: 1 / 0)]:
    pins_mod.PIN_IDENTITY = stand_in  # a torch whose tree builder cannot take a pin
    try:
        model = fresh()
        loaded = proof.Proof.load(data, model)
        with torch.no_grad():
            out[name] = {"pins": loaded.pins_tensors, "holds": loaded.holds((x,), {})}
    finally:
        pins_mod.PIN_IDENTITY = real
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    script = tmp_path_factory.mktemp("pins") / "pins.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(script.parent), "TMPDIR": str(script.parent),
                               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_every_tensor_the_trace_read_is_pinned_and_an_unchanged_model_holds(rows):
    row = rows["none"]
    # body.0 weight+bias, BatchNorm's weight, bias, running_mean, running_var, head weight+bias
    assert row["pins"] is True and row["pinned_ids"] == 8, row
    assert row["pinned"] and row["plain"] and row["walk"] is None and row["storage"] is None


@pytest.mark.parametrize("how", ["assign", "dict_write", "swap_module", "state_dict_assign"])
def test_a_tensor_replaced_in_its_slot_fails_the_pinned_tree_and_the_unpinned_one_holds(rows, how):
    """The plain tree holds (only the binding's walk saw it before); the pinned one fails; the walk names what
    changed, and the trees rebuilt without pins hold over the model as it is, pinning nothing."""
    row = rows[how]
    assert row["plain"] is True and row["pinned"] is False and row["walk"], row
    assert row["unpinned"] == [True, False], row


def test_a_storage_swap_keeps_the_object_and_the_pointer_check_sees_it(rows):
    row = rows["data_swap"]
    assert row["pinned"] is True and row["storage"] == "head.weight" and row["walk"] == "head.weight", row


def test_an_in_place_update_is_no_change(rows):
    row = rows["in_place"]
    assert row["pinned"] is True and row["walk"] is None and row["storage"] is None, row


@pytest.mark.parametrize("how", ["pin_not_made", "tree_refuses_pins"])
def test_a_torch_that_cannot_pin_loads_the_proof_without_pins(rows, how):
    """A pin that could not be made, or a tree builder that fails on one: the proof loads as before the pins
    (the binding walks the slots), never a refused package."""
    assert rows[how] == {"pins": False, "holds": True}, rows[how]
