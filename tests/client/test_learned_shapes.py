"""The learned shapes' pieces that need no compile: calls of other shapes made from the example call
(one_call/shapes.py), a package's key read back into what it serves (calls.parse_declared, learned.py),
and the demand's shapes matched against a package's ranges. Each key text comes from the service: one
that is not a shape of this model's call, or not one this client writes, is refused, never guessed."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.one_call import calls, shapes  # noqa: E402
from cachesvc_client.one_call.learned import Learned, _covers  # noqa: E402
from cachesvc_client.usage import demand_rows, package_shapes  # noqa: E402


class Compiled:
    """What Learned reads of a CompiledModel: the example call, the model, the key's shape."""

    def __init__(self, model, args, kwargs=None):
        self.model, self.args, self.call_kwargs, self.name = model, args, dict(kwargs or {}), "m"
        self.shape = shapes.signature(args, self.call_kwargs)


class Encoder(torch.nn.Module):
    def forward(self, input_ids, attention_mask):
        return input_ids * attention_mask


def test_a_call_of_another_shape_keeps_the_structure_dtypes_and_values_of_the_example():
    ids = torch.arange(10).reshape(2, 5)
    mask = torch.ones(2, 5, dtype=torch.long)
    args, kwargs = shapes.resized((), {"input_ids": ids, "attention_mask": mask},
                                  "attention_mask=i64[1,7],input_ids=i64[1,7]")
    assert list(kwargs) == ["input_ids", "attention_mask"]  # the caller's order; the text's is sorted
    assert kwargs["input_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6]] and kwargs["attention_mask"].eq(1).all()
    x = torch.randn(8, 4)
    (y,), _ = shapes.resized((x,), {}, "f32[20,4]")
    assert y.shape == (20, 4) and torch.equal(y[:8], x) and torch.equal(y[8:16], x) and y.is_contiguous()


@pytest.mark.parametrize("text", ["f16[3,4]", "f32[3,4,1]", "f32[3,4],f32[1]", "", "f32[3,", "x=f32[3,4]",
                                  "f32[3,4]|dynamic=(b:1..4,4)", "int", "f32[-1,4]"])
def test_a_text_that_is_not_a_shape_of_the_call_makes_no_call(text):
    assert shapes.resized((torch.randn(8, 4),), {}, text) is None


def test_a_declared_key_parses_back_to_the_spec_that_wrote_it():
    x = torch.randn(4, 16)
    spec = calls.CallSpec((x,), None, False, dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=32)},),
                          forward=torch.nn.Linear(16, 2).forward)
    key = spec.signature("f32[4,16]")
    assert key == "f32[4,16]|dynamic=(batch:1..32,16)"
    again = calls.CallSpec((x,), None, False, leaf_dims=calls.parse_declared(key.partition("|dynamic=")[2]))
    assert again.signature("f32[4,16]") == key
    assert again.mismatch((torch.randn(17, 16),), {}, torch.nn.Linear(16, 2).eval()) is None
    assert "outside the declared batch" in again.mismatch((torch.randn(33, 16),), {}, torch.nn.Linear(16, 2).eval())


@pytest.mark.parametrize("text", ["(batch:1..32,16", "(batch:32..1,16)", "(1b:1..2,16)", "(batch:1..x,16)", "()x",
                                  "(batch=1..32,16)", ""])
def test_declared_ranges_that_are_not_this_clients_text_are_refused(text):
    assert calls.parse_declared(text) is None


def learned_of(model, args, kwargs=None) -> Learned:
    return Learned(Compiled(model, args, kwargs), limit=16)


def test_a_learned_key_becomes_a_spec_only_when_it_is_a_shape_of_this_call():
    learned = learned_of(torch.nn.Linear(16, 2).eval(), (torch.randn(4, 16),))
    spec, why = learned._spec("f32[9,16]")
    assert why == "" and spec.mismatch((torch.randn(9, 16),), {}, learned.compiled.model) is None
    spec, why = learned._spec("f32[2,16]|dynamic=(batch:2..64,16)")
    assert why == "" and spec.mismatch((torch.randn(40, 16),), {}, learned.compiled.model) is None
    for key, said in [("f32[9,16],f32[1]", "not a shape"), ("f32[2,16]|dynamic=(batch:2..64", "do not parse"),
                      ("f32[2,16]|examples=2x16;3x16", "declared examples"),
                      ("f32[2,16]|dynamic=(batch:2..64,17)", "do not hold"),  # another shape in its declaration
                      ("f32[2,16]|dynamic=(batch:3..64,16)", "do not hold")]:  # its example outside its range
        spec, why = learned._spec(key)
        assert spec is None and said in why, (key, why)


def test_the_demand_orders_packages_by_the_calls_they_would_serve():
    learned = learned_of(torch.nn.Linear(16, 2).eval(), (torch.randn(4, 16),))
    ranged, _ = learned._spec("f32[2,16]|dynamic=(batch:2..8,16)")
    exact, _ = learned._spec("f32[32,16]")
    learned.demand = [{"shape": "f32[32,16]", "calls": 100}, {"shape": "f32[3,16]", "calls": 60},
                      {"shape": "f32[5,16]", "calls": 50}, {"shape": "f32[9,16]", "calls": 500},
                      {"shape": "i64[3,16]", "calls": 7}]
    assert learned._busy(exact) == 100 and learned._busy(ranged) == 110 + 7  # by shape alone: i64 counts
    assert _covers(ranged, "f32[8,16]") and not _covers(ranged, "f32[9,16]") and not _covers(ranged, "f32[3,17]")
    assert not _covers(ranged, "f32[3,16],f32[3,16]") and not _covers(ranged, "junk")


def test_the_services_answers_are_read_defensively():
    tags = {"mode": "default"}
    answer = {"items": [{"tags": tags, "shapes": [{"shape": "f32[1,4]", "calls": 3}, {"shape": 5, "calls": 1},
                                                  {"shape": "f32[2,4]", "calls": "9"}, "junk",
                                                  {"shape": "f32[2,4]", "calls": True}]},
                        {"tags": {"mode": "other"}, "shapes": [{"shape": "f32[1,4]", "calls": 4}]}, None]}
    assert [r["shape"] for r in demand_rows(answer, tags)] == ["f32[1,4]"]
    assert demand_rows(answer, None)[0]["calls"] == 7  # every family, merged
    assert demand_rows({"items": "nope"}, tags) == [] and demand_rows([], None) == []
    assert package_shapes({"entries": [{"shape": "f32[1,4]"}, {"shape": 3}, 7]}) == ["f32[1,4]"]
    assert package_shapes({"entries": None}) == [] and package_shapes("x") == []


EXITS_WHILE_OPENING = '''
import sys, time
from pathlib import Path

import torch
from cachesvc_client.one_call import learned, shapes

log = Path(sys.argv[1])


class Client:
    def packages(self, name, tags):
        return ["f32[2,16]", "f32[3,16]"]

    def demand(self, name, tags):
        return []

    def restore(self, *args, **kwargs):
        return type("Report", (), {"hit": True, "reason": ""})()


class Compiled:
    model = torch.nn.Linear(16, 2).eval()
    args, call_kwargs, name, tags, device, cuda_graph, client = (torch.randn(4, 16),), {}, "m", {}, "cpu", False, Client()
    shape = shapes.signature(args, {})


def open_slot(shape, *rest):  # AOTInductor's loader, in the background thread, slower than the process
    with log.open("a") as f:
        f.write(f"opening {shape}\\n")
    time.sleep(1.5)
    with log.open("a") as f:
        f.write(f"opened {shape}\\n")
    return None, "not this test's package"


learned.open_slot = open_slot
found = learned.Learned(Compiled(), limit=16)
found.start()
while not log.exists():
    time.sleep(0.01)
print("exiting", flush=True)  # the process's last output, with the first package still being opened
'''


def test_a_process_that_exits_while_a_learned_package_opens_waits_for_it_and_opens_no_more(tmp_path):
    """The interpreter must not finalize under AOTInductor's loader: a fleet process exited -6 ("terminate
    called without an active exception") after its last output while its learned packages were opening."""
    import subprocess
    import sys

    script, log = tmp_path / "exits.py", tmp_path / "opened.log"
    script.write_text(EXITS_WHILE_OPENING)
    done = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "exiting\n", done.stderr[-3000:]
    assert log.read_text().splitlines() == ["opening f32[2,16]", "opened f32[2,16]"]  # finished; the next not begun
    assert "cachesvc" not in done.stderr, done.stderr  # a short-lived process's exit is not a fault: silent


def test_a_learned_start_while_the_interpreter_exits_opens_nothing(tmp_path):
    """A hit's background start runs in a thread the exit waits for (deferred.py): the learned packages it
    starts then must not begin opening under a finalizing interpreter (CI, 2026-12-06: a fleet process
    printed its result and died -6, "terminate called without an active exception")."""
    import subprocess
    import sys

    script, log = tmp_path / "exits.py", tmp_path / "opened.log"
    starts_at_exit = EXITS_WHILE_OPENING.split("found = learned.Learned")[0] + (
        "import threading\n"
        "found = learned.Learned(Compiled(), limit=16)\n"
        "threading._register_atexit(lambda: (found.start(), print('done', found.wait(0), flush=True)))\n"
        "print('exiting', flush=True)\n")
    script.write_text(starts_at_exit)
    done = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "exiting\ndone True\n", (done.stdout, done.stderr[-3000:])
    assert not log.exists() and not done.stderr, done.stderr  # nothing opened, nothing said


class CountingSlot:
    """A learned package's slot as Learned dispatches to it: its spec's own check, counted (the real
    Slot adds its proof's guards and the live tensors; ``refuse`` stands for either failing)."""

    def __init__(self, spec):
        self.spec, self.asked, self.dead, self.refuse = spec, 0, False, ""

    def refusal(self, args, kwargs, model, name):
        self.asked += 1
        why = self.spec.mismatch(args, kwargs, model) or self.refuse or None
        return why, why is None, self.spec.flat(args, kwargs) if why is None else None


def learned_slots(batches):
    learned = learned_of(torch.nn.Linear(16, 2).eval(), (torch.randn(4, 16),))
    learned.slots = [CountingSlot(learned._spec(f"f32[{b},16]")[0]) for b in batches]
    learned._listed.set()
    return learned


def walked(learned, x):
    """The answer without memory: the first slot in order whose spec serves the call."""
    return next((s for s in learned.slots if s.spec.mismatch((x,), {}, learned.compiled.model) is None
                 and not s.refuse and not s.dead), None)


def test_a_shape_served_before_asks_only_its_own_package_again():
    """The H200 replay's tail: a shape late in the list checked every package before it on every call."""
    batches = [1, 4, 16, 2, 32, 3, 64]
    learned = learned_slots(batches)
    x = torch.randn(64, 16)
    slot, flat = learned.find((x,), {})
    assert slot is learned.slots[-1] and flat[0] is x and [s.asked for s in learned.slots] == [1] * 7
    for _ in range(5):
        assert learned.find((x,), {})[0] is slot
    assert [s.asked for s in learned.slots] == [1] * 6 + [6]  # the others were not asked again
    assert learned.find((torch.randn(5, 16),), {}) is None  # no package: every one asked, nothing remembered


def test_a_remembered_package_that_refuses_sends_the_call_on_the_walk():
    learned = learned_slots([2, 8])
    ranged, _ = learned._spec("f32[2,16]|dynamic=(batch:2..64,16)")
    learned.slots.append(CountingSlot(ranged))
    x = torch.randn(8, 16)
    assert learned.find((x,), {})[0] is learned.slots[1]
    learned.slots[1].refuse = "the package's guards fail for this call"
    assert learned.find((x,), {})[0] is learned.slots[2]  # the range serves it now
    learned.slots[1].refuse, learned.slots[2].dead = "", True  # a dead package is dropped, remembered or not
    learned.slots[2].refuse = "the model's tensors were replaced"
    assert learned.find((torch.randn(30, 16),), {}) is None and len(learned.slots) == 2
    assert learned.find((x,), {})[0] is learned.slots[1]


def serves(learned, slot, x):
    return slot in learned.slots and slot.spec.mismatch((x,), {}, learned.compiled.model) is None \
        and not slot.refuse and not slot.dead


def test_dispatch_with_memory_serves_exactly_the_calls_the_walk_serves_for_any_sequence_of_calls():
    """A property over random sequences: calls of random shapes, packages refusing and recovering at random.
    A package is served only where it serves the call; a call goes to torch.compile only where none would;
    while no package changes its answer, the choice is the walk's (the first in order)."""
    import random

    rng = random.Random(7)
    for _ in range(20):
        learned = learned_slots(rng.sample([1, 2, 3, 4, 8, 16, 32, 64], 5))
        learned.slots.append(CountingSlot(learned._spec("f32[2,16]|dynamic=(batch:2..64,16)")[0]))
        for _ in range(60):
            if rng.random() < 0.2:
                rng.choice(learned.slots).refuse = rng.choice(["", "the package's guards fail for this call"])
            x = torch.randn(rng.choice([1, 2, 3, 4, 5, 8, 16, 32, 64]), 16)
            expected = walked(learned, x)
            got = learned.find((x,), {})
            assert (got is None) == (expected is None)
            assert got is None or serves(learned, got[0], x)
        fresh = learned_slots([s.spec.tensors[0].shape[0] for s in learned.slots[:-1]])
        fresh.slots.append(learned.slots[-1])
        for s in fresh.slots:
            s.refuse = ""
        for _ in range(30):
            x = torch.randn(rng.choice([1, 2, 3, 4, 5, 8, 16, 32, 64]), 16)
            got = fresh.find((x,), {})
            assert (got[0] if got else None) is walked(fresh, x)
