"""Classes whose descriptions lead back to themselves still get a proof, and one that holds where it should.

transformers 5.25's Phi-3 got no package (bench/model_table.py, 2026-12-06): describing its model's class
followed a class attribute to a function whose closure held another class, whose members led back, and
the capture ended in ``RecursionError``: "a guard cannot be carried to another process: TYPE_MATCH on
L['self']". A class past MAX_DEPTH inside a description is now named, not described (a closure's class
that the forward reads has a guard of its own), and a class reached again while it is being described is
named there (two classes that hold each other in class attributes). Here: the descriptions end, do not
depend on which class was described first, and still change with either class's code; and a model built
on such classes gets a proof in one process that holds in another, and is refused there after an edit.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.one_call.proof import portable  # noqa: E402


class Left:
    pass


class Right:
    pass


def _make_closure(target):
    def hook():
        return target
    return hook


Left.hooks = [_make_closure(Right)]  # a class attribute -> a function -> its closure's class -> ... -> Left
Right.hooks = [_make_closure(Left)]


class First:
    def value(self):
        return 1


class Second:
    def value(self):
        return 2


First.kinds = (Second,)  # two classes that hold each other in class attributes
Second.kinds = (First,)


@pytest.mark.parametrize("pair", [(Left, Right), (First, Second)], ids=["closures", "class-attributes"])
def test_the_description_ends_and_does_not_depend_on_which_class_came_first(pair):
    one, other = pair
    alone = {cls: portable.klass(cls) for cls in pair}
    for order in (pair, pair[::-1]):
        with portable.session():
            assert [portable.klass(cls) for cls in order] == [alone[cls] for cls in order]
    assert alone[one] != alone[other]


def test_a_change_in_either_class_of_a_cycle_changes_both(monkeypatch):
    before = {cls: portable.klass(cls) for cls in (First, Second)}
    monkeypatch.setattr(Second, "value", lambda self: 3)
    after = {cls: portable.klass(cls) for cls in (First, Second)}
    assert after[First] != before[First] and after[Second] != before[Second]


MODULE = '''
import torch


def _make(target):
    def hook():
        return target
    return hook


class Scale:
    FACTOR = 2.0

    def value(self):
        return self.FACTOR


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) * Scale.FACTOR


Net.hooks = [_make(Scale)]
Scale.owners = (Net,)
'''

BUILD = """
import sys, torch
from cyc import Net
from cachesvc_client.one_call import proof
torch.manual_seed(0)
with torch.no_grad():
    built = proof.capture(Net().eval(), (torch.randn(2, 8),), {})
open(sys.argv[1], "wb").write(built.data)
"""

LOAD = """
import sys, torch
from cyc import Net
from cachesvc_client.one_call import proof
try:
    checked = proof.Proof.load(open(sys.argv[1], "rb").read(), Net().eval())
except proof.NoProof as exc:
    print("refused:", exc)
else:
    with torch.no_grad():
        print("holds:", checked.holds((torch.randn(2, 8),), {}))
"""


def _python(code: str, folder, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=folder, capture_output=True,
                          text=True, timeout=300, env={**_env(), "PYTHONPATH": str(folder)})
    assert done.returncode == 0, done.stderr[-3000:]
    return (done.stdout.strip().splitlines() or [""])[-1]


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.slow
def test_a_model_on_a_cycle_of_classes_gets_a_proof_that_holds_and_is_refused_after_an_edit(tmp_path):
    (tmp_path / "cyc.py").write_text(textwrap.dedent(MODULE))
    data = tmp_path / "proof.bin"
    _python(BUILD, tmp_path, data)
    assert _python(LOAD, tmp_path, data) == "holds: True"
    (tmp_path / "cyc.py").write_text(textwrap.dedent(MODULE).replace("return self.FACTOR", "return -self.FACTOR"))
    assert _python(LOAD, tmp_path, data).startswith("refused:")


PHI3 = """
import sys
sys.path.insert(0, sys.argv[2])
import torch
from harness.models import build_call
from cachesvc_client.one_call import proof
model, args, kwargs = build_call("phi3")
with torch.no_grad():
    if sys.argv[3] == "build":
        open(sys.argv[1], "wb").write(proof.capture(model, args, kwargs).data)
    else:
        print("holds:", proof.Proof.load(open(sys.argv[1], "rb").read(), model).holds(args, kwargs))
"""


@pytest.mark.slow
def test_phi3_gets_a_proof_that_holds_in_another_process(tmp_path):
    """The model that found it: transformers' Phi-3 (a tiny config, random weights), built and loaded apart."""
    pytest.importorskip("transformers")
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    data = tmp_path / "proof.bin"
    _python(PHI3, tmp_path, data, repo, "build")
    assert _python(PHI3, tmp_path, data, repo, "load") == "holds: True"
