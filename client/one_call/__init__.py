"""``cachesvc_client.compile``: torch.compile that starts as fast as eager when the fleet has compiled before.

    model = cachesvc_client.compile(model, (x,), name="ranker")   # in place of torch.compile(model)
    with torch.no_grad():
        y = model(x)
    seq = torch.export.Dim("seq", min=2, max=512)                   # padded lengths 2..512: one package
    bert = cachesvc_client.compile(bert, kwargs={"input_ids": ids, "attention_mask": mask}, name="bert",
                                   dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}})
    model.wait_published()                                          # a build job: wait for the publish

A hit: the key (name, the inputs' shape signature, mode, the model's structure
fingerprint, torch.compile's options, and the environment: torch, Triton, CUDA,
GPU) has a precompiled artifact; it is fetched and loaded, nothing traced or
compiled: an AOTInductor package run on the live weights, serving a call only
where its proof (proof/: torch.compile's guards from the build's trace) holds
for this model and this call. A call that does not match what it was built for
(spec.py, the proof) goes to ``torch.compile(model, mode=mode, **kwargs)``,
with one log line naming why. A miss: the key's directory snapshot
is restored (if any) and torch.compile compiles; with a write token the snapshot
and the precompiled artifact are published after the first call, in a background
thread (``wait_published``).

The steps, one module each:

    support.py    can this torch and host take the package route (choose_route, check_host)
    spec.py       the structure fingerprint; calls that want autograd
    calls.py      what a call must match to be served by the package (arguments, declared shapes)
    identity.py   the code and the non-tensor configuration the key also covers (an index, not a proof)
    installed.py  which code is an installed distribution's (keyed by name==version, not followed)
    proof/        the proof: the build's Dynamo guards, compared at load and checked at every call
    ends.py       a declared range's ends: checked against eager at build, each admitted by a trace
    binding.py    the live tensors a hit runs on; replaced ones are seen and rebound
    compiled.py   CompiledModel: a hit's runner, else torch.compile; the publish after a miss
    deferred.py   a hit's background work (snapshot restore, learned packages), after its first output
    publisher.py  after a miss: export -> build -> verify -> publish, in a background thread
    export.py     torch.export of a copy of the model, in the serving thread
    build.py      the weightless package, built in a child process (child.py; process/cxx.py)
    computed.py   the tensors the model's computation makes (not weights), carried inside the package
    verify.py     the publish check: the package against eager, in another child process
    runner.py     a hit: the package opened by the C++ loader on the live tensors (graph.py:
                  reduce-overhead's CUDA-graph replay)
    libraries.py  a hit on a GPU: cuDNN, which its package calls, readied beside the proof

The door is ``compile`` (and ``CompiledModel``, what it returns).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from .compiled import CompiledModel
from .. import settings
from ..process.collector import CollectorClock, hold_full_collections
from .support import ROUTE_VAR, ROUTES, choose_route

__all__ = ["CompiledModel", "ROUTES", "ROUTE_VAR", "choose_route", "compile"]


def compile(model: Any, args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None, *,  # noqa: A001
            name: str, mode: Optional[str] = None, client: Any = None, tags: Optional[Mapping[str, str]] = None,
            publish: Optional[bool] = None, dynamic_shapes: Any = None, examples: Optional[Sequence[Any]] = None,
            verify: bool = False, require_hit: Optional[bool] = None, **torch_compile_kwargs: Any) -> CompiledModel:
    """Return a callable that behaves like ``torch.compile(model, mode=mode, **torch_compile_kwargs)``.

    ``args`` and ``kwargs``: an example call, in torch.export's form (``model(*args, **kwargs)``); the
    package serves calls with the same keywords and tensors like these (calls.py). More shapes, in
    one package: ``dynamic_shapes`` (torch.export's, each varying dim a ``Dim(name, min=, max=)``)
    serves every size in the ranges; ``examples`` (further example calls: argument tuples, or keyword
    dicts) serves exactly those shapes. A call outside them runs torch.compile (one log line); shapes
    declared wrongly raise ValueError (the message names the argument).
    ``client``: a CacheClient (default: ``CacheClient()``, from ``$CACHESVC_URL`` and ``$CACHESVC_TOKEN``).
    ``publish``: publish after a miss's first call (default: when the client has a token).
    ``tags`` are added to the key. ``verify``: a hit's first call also runs eager and compares (one
    eager forward; a difference beyond the publish check's tolerance sends it to torch.compile).
    ``require_hit`` (default ``$CACHESVC_REQUIRE_HIT``: 1, true, yes): a miss, or a fall-back to
    torch.compile on the declared inputs, raises HitRequired (a CacheClientError) naming why.
    Otherwise never raises for cache trouble: the model then compiles as usual.
    """
    held = hold_full_collections() if settings.current().gc_hold else None
    try:
        with CollectorClock() as collector:
            compiled = CompiledModel(model, tuple(args), dict(kwargs or {}), name=name, mode=mode, client=client,
                                     tags=tags, publish=publish, torch_compile_kwargs=torch_compile_kwargs,
                                     verify=verify, require_hit=require_hit,
                                     declared={"dynamic_shapes": dynamic_shapes, "examples": examples})
    except BaseException:  # declared shapes that are wrong, require_hit's miss: nothing left held behind
        if held is not None:
            held.release()
        raise
    # not one more step: the collections ran inside the steps above, and their seconds are in theirs too
    compiled.phases["gc"] = round(collector.seconds, 4)
    if held is not None and compiled.source == "artifact":
        compiled.gc_hold = held  # let go just after the first output (deferred.py)
    elif held is not None:
        held.release()  # a miss: torch.compile's own allocations come next, and are its to pay
    return compiled
