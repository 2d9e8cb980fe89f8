"""The proof that a package may serve a call: torch.compile's own guards, carried to the restarted process.

A package is the computation torch traced for one model in one state: its class constants, the
helpers it called, the config values it read, the training flags, the grad and autocast modes, the
tensors' layouts. torch.compile knows exactly which state that was: Dynamo records a guard for every
value the trace read, and re-checks them before each reuse. A key that guesses what the answer depends
on cannot be complete; these guards are. So the builder traces the model with Dynamo (a full-graph trace
on fake tensors, nothing compiled) and ships its guards inside the package, and a restarted process
serves a call only when they hold:

1. at load (``Proof.load``), every guard whose value comes from the model or from the globals is compared
   with what the build saw, in a form that means the same in both processes (portable.py: a constant by
   value, a class by its name and its members' code, a function by its code, a tensor by its layout);
   the source lines Dynamo traced are compared by digest (an edited file is another computation), and so
   are the environment variables the model's code read (capture.environment_reads);
2. then torch's own guard tree is built over the live objects and checked before every served call, in
   C++ (``Proof.holds``): a later ``train()``, a hook, a monkeypatched function, another grad or autocast
   mode, another input layout fails it, and the call goes to torch.compile.

Where Dynamo passes a value to its graph that torch.export bakes into the package (a numpy scalar, a
tensor that is not a parameter or buffer), the value itself is compared. Guards on the call's inputs keep
the build's expectations (torch's serialized state: dtypes, shapes, strides, dynamic dims). Guard kinds
that pin a process-local identity with no portable meaning are refused at build: no proof, no package.

A proof holds one entry per trace: the example's, and one per declared range end that trace does not
admit (Dynamo specializes sizes 0 and 1), each checked at the build against eager (ends.py).

The steps, one module each:

    capture.py    the build: trace, record the guards and their portable descriptions
    check.py      the restart: compare, rebuild the guard tree over the live model, check each call
    hooks.py      the module hook dicts the trace saw empty: checked here, not by torch's tree
    portable.py   descriptions of values that mean the same in every process
    guards.py     what both sides agree on: guard kinds, roots, keys
    container.py  the bytes: entries, the environment, the package's zip entry
    bytecode.py   why the proof's imports can be slow: a torch without bytecode caches (a log line)
    templates.py  guard sources' texts compiled once per process (torch's eval of them, at load)

torch's guard serialization is the part of torch.compile's AOT precompile that carries guards from one
process to another (``torch._dynamo.package``); it pickles, as the package's .so is machine code: both
come from the version's blobs, whose digests (and signatures, where required) the restore checks.
"""
from __future__ import annotations

from .capture import capture, environment_reads
from .check import Proof
from .container import Built, NoProof, attach, read

__all__ = ["Built", "NoProof", "Proof", "attach", "capture", "environment_reads", "read"]
