"""A proof captured in a process that traced the model at other sizes before holds in a fresh process.

A build job builds one shape after another in one process: torch.compile has traced the model at the
earlier sizes when the next package's proof is captured. With Dynamo's automatic dynamic shapes, that
capture made the batch size symbolic, and a fresh process loading the package refused its proof ("a guard
fails on this model: 'NoneType' object has no attribute 'size'"): every package after the first was built
again each night and never served. The capture now keeps undeclared sizes static (proof/capture.py).
Each side runs in a process of its own, as the build and the restart do.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

MODEL = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
"""

BUILD = MODEL + """
import sys
from cachesvc_client.one_call import proof
with torch.no_grad():
    torch.compile(model)(torch.randn(8, 64))
    proof.capture(model, (torch.randn(2, 64),), {})  # the job's package before this one
    built = proof.capture(model, (torch.randn(4, 64),), {})  # a size Dynamo has seen another of: automatic dynamic
open(sys.argv[1], "wb").write(built.data)
"""

LOAD = MODEL + """
import sys
from cachesvc_client.one_call import proof
checked = proof.Proof.load(open(sys.argv[1], "rb").read(), model)
with torch.no_grad():
    print(checked.holds((torch.randn(4, 64),), {}), checked.holds((torch.randn(5, 64),), {}))
"""


def test_a_proof_captured_after_the_model_ran_at_other_sizes_holds_in_a_fresh_process(tmp_path):
    data = tmp_path / "proof.bin"
    built = subprocess.run([sys.executable, "-c", BUILD, str(data)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    loaded = subprocess.run([sys.executable, "-c", LOAD, str(data)], capture_output=True, text=True, timeout=600)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split() == ["True", "False"], loaded.stdout  # its own size only: nothing symbolic
