"""The build job's steps: the example built through the one call, the demand read, the plan built.

    outcome = run(example, name="ranker", client=CacheClient(), max_packages=8, coverage=0.99, budget=3600)

1. The example call goes through the one call (``publish=True``), is called once under ``torch.no_grad()``
   and its publish waited for; a hit means it was built before. Its ``tags`` name the key family.
2. The family's demand is read (``CacheClient.demand``); none yet: the example is all there is to build.
3. plan.py decides the packages.
4. Each is built the same way, busiest first: the example resized to the package's shape
   (``one_call.shapes.resized``), a range's dims declared (``dynamic_shapes``, a ``torch.export.Dim`` per
   range); a hit is "already built", so a second run builds nothing. A failure is recorded with its cause
   and the job goes on; no build starts once ``budget`` seconds have passed.

While it runs, the one call neither reports the job's calls (they are not the fleet's: ``CACHESVC_USAGE=0``)
nor fetches the family's other packages to serve calls with (the job serves none, and each model it makes
would fetch them all again: ``CACHESVC_LEARNED_PACKAGES=0``).
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from . import plan as plan_mod
from .outcome import ALREADY, BUILT, FAILED, NOT_STARTED, PLANNED, Outcome, Result
from .target import Example
from .. import one_call
from ..errors import CacheClientError
from ..one_call import calls, shapes
from ..process.fingerprint import shape_signature, sorted_keys
from ..settings import LEARNED_PACKAGES_VAR, USAGE_VAR

log = logging.getLogger("cachesvc_client")
#: the one call's settings the job runs with (see the module)
AS_BUILDER = {USAGE_VAR: "0", LEARNED_PACKAGES_VAR: "0"}
#: a publish's statuses after which the package is on the service (linked: another key's same content)
PUBLISHED = ("committed", "unchanged", "linked")


class JobError(Exception):
    """The job could not start: the example call could not be made through the one call."""


@dataclass(frozen=True)
class Job:
    """What the job builds and how: the one call's arguments and the plan's limits."""

    name: str
    mode: Optional[str] = None
    options: Optional[Mapping[str, Any]] = None  # torch.compile's keyword arguments
    tags: Optional[Mapping[str, str]] = None
    max_packages: int = 8
    coverage: float = 0.99
    budget: float = 3600.0  # seconds after which no build starts
    dry_run: bool = False


def run(example: Example, job: Job, client: Any) -> Outcome:
    """The job (see the module). Never raises for a package's trouble: the outcome says it. Raises JobError
    when the example itself cannot be made through the one call (nothing names the key family then)."""
    started = time.monotonic()
    with _as_builder():
        compiled, first = _example(example, job, client)
        outcome = Outcome(job.name, {"name": job.name, "tags": compiled.tags, "env": client.environment()},
                          first, job=_asked(job), dry_run=job.dry_run)
        demand = _demand(client, job, compiled.tags, outcome)
        if demand:
            _build_plan(demand, example, job, client, outcome, started)
    outcome.seconds = time.monotonic() - started
    return outcome


def _demand(client: Any, job: Job, tags: Mapping[str, str], outcome: Outcome) -> List[Dict[str, Any]]:
    """The key family's demand, busiest first; none (and the outcome says why) when there is none to read."""
    try:
        demand = client.demand(job.name, tags=tags)
    except CacheClientError as exc:
        outcome.error = f"could not read the fleet's demand: {exc.message}"
        return []
    if not demand:
        outcome.note = (f"no demand recorded yet for {job.name} (this key family, this environment): nothing to "
                        f"build but the example")
    return demand


def _build_plan(demand: List[Dict[str, Any]], example: Example, job: Job, client: Any, outcome: Outcome,
                started: float) -> None:
    """Plan, then build each planned package, busiest first (a dry run: say which exist)."""
    layout = _layout(example.args, example.kwargs)
    outcome.plan = plan_mod.plan(demand, outcome.example.shape, max_packages=job.max_packages,
                                 coverage=job.coverage, declarable=[i for i in layout if i is not None])
    known = _published_keys(client, job, outcome.key["tags"]) if job.dry_run else set()
    for package in outcome.plan.packages:
        result = _package(package, example, layout, job, client, outcome.example, known, started)
        if not job.dry_run:  # progress, on stderr: a package can take minutes
            log.info("cachesvc build %s: %s: %s", job.name, result.describe(), result.state())
        outcome.packages.append(result)


def _asked(job: Job) -> Dict[str, Any]:
    """The job's settings as JSON shows them (an option that is no JSON value, a set say, as its repr)."""
    options = {k: v if isinstance(v, (bool, int, float, str, type(None), list, dict)) else repr(v)
               for k, v in (job.options or {}).items()}
    return {"mode": job.mode, "options": options, "tags": dict(job.tags or {}), "max_packages": job.max_packages,
            "coverage": job.coverage, "budget": job.budget}


@contextlib.contextmanager
def _as_builder() -> Iterator[None]:
    """``AS_BUILDER`` set (the one call reads them as each model is made), and as they were afterwards."""
    before = {name: os.environ.get(name) for name in AS_BUILDER}
    os.environ.update(AS_BUILDER)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _compile(model: Any, args: tuple, kwargs: dict, job: Job, client: Any, **declared: Any) -> Any:
    """The one call as the job makes it: publishing after a miss, never requiring a hit (a miss is the job's)."""
    return one_call.compile(model, args, kwargs, name=job.name, mode=job.mode, client=client,
                            tags=job.tags, publish=not job.dry_run, require_hit=False, **declared,
                            **dict(job.options or {}))


def _example(example: Example, job: Job, client: Any) -> Tuple[Any, Result]:
    """The example call through the one call (a dry run: only made, for its key); its result."""
    started = time.monotonic()
    try:
        compiled = _compile(example.model, example.args, example.kwargs, job, client)
    except Exception as exc:  # noqa: BLE001 - said in one line by the caller
        raise JobError(f"the one call could not take the example call: {_why(exc)}") from exc
    result = Result(shapes.signature(example.args, example.kwargs), compiled.shape, 0, example=True)
    if compiled.source == "artifact":
        result.status = ALREADY
    elif not job.dry_run:
        result.status, result.why = _called_and_published(compiled, example.args, example.kwargs)
    result.seconds = time.monotonic() - started
    return compiled, result


def _called_and_published(compiled: Any, args: tuple, kwargs: dict) -> Tuple[str, str]:
    """A miss called once (its publish starts after the first call) and its publish waited for: built or failed."""
    import torch

    try:
        with torch.no_grad():
            compiled(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the model's own error on this shape: that package fails
        return FAILED, f"the model's call raised {_why(exc)}"
    return _verdict(compiled.wait_published())


def _verdict(published: Optional[Dict[str, Any]]) -> Tuple[str, str]:
    """What ``CompiledModel.wait_published`` returned, as built or failed (and why)."""
    if published is None:
        return FAILED, "nothing was published (the key could not be made: see the warning above)"
    artifact = published.get("artifact") or {}
    if artifact.get("status") in PUBLISHED:
        return BUILT, ""
    why = artifact.get("error") or artifact.get("skipped") or artifact.get("reason") or artifact.get("status")
    return FAILED, " ".join(str(why or "the package was not published").split())


def _package(package: plan_mod.Package, example: Example, layout: List[Optional[int]], job: Job,
             client: Any, first: Result, known: set, started: float) -> Result:
    """One planned package built (or found built, or left out by the budget)."""
    if package.exact and package.shape == first.shape:  # the example, built at step 1
        return replace(Result.of(package, first.key), status=first.status, why=first.why, seconds=first.seconds,
                       example=True)
    call = shapes.resized(example.args, example.kwargs, package.shape)
    if call is None:  # the plan keeps shapes of the example's structure only: not expected
        return replace(Result.of(package), status=FAILED, why="not a shape the example call can be resized to")
    declared = {"dynamic_shapes": _declared(package, layout)} if not package.exact else {}
    if job.dry_run:
        key = _key_shape(example.model, call, declared)
        return replace(Result.of(package, key), status=ALREADY if key in known else PLANNED)
    spent = time.monotonic() - started
    if spent > job.budget:
        return replace(Result.of(package), status=NOT_STARTED,
                       why=f"over the {job.budget:g} s budget ({spent:.0f} s spent)")
    began = time.monotonic()
    try:
        compiled = _compile(example.model, *call, job, client, **declared)
    except Exception as exc:  # noqa: BLE001 - e.g. a declaration the one call refuses: this package fails
        return replace(Result.of(package), status=FAILED, why=_why(exc), seconds=time.monotonic() - began)
    result = Result.of(package, compiled.shape)
    if compiled.source == "artifact":
        result.status = ALREADY
    else:
        result.status, result.why = _called_and_published(compiled, *call)
    result.seconds = time.monotonic() - began
    return result


def _layout(args: tuple, kwargs: Dict[str, Any]) -> List[Optional[int]]:
    """Per top-level argument (positional, then keyword in the call's order, as ``dynamic_shapes``' tuple form
    lists them): its item in the call's shape text if it is a tensor, the only kind a range is declared on."""
    items: Dict[Tuple[str, Any], Optional[int]] = {}
    at = 0
    in_text_order = [(("#", i), a) for i, a in enumerate(args)] + [(("=", k), kwargs[k]) for k in sorted_keys(kwargs)]
    for where, value in in_text_order:
        items[where] = at if _is_tensor(value) else None
        at += len(shapes.items(shape_signature(value)) or ())  # shape text order: keywords sorted
    return [items[("#", i)] for i in range(len(args))] + [items[("=", k)] for k in kwargs]


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _declared(package: plan_mod.Package, layout: List[Optional[int]]) -> tuple:
    """``dynamic_shapes`` in its tuple form: per argument, ``{dim: Dim}`` at the package's ranges, else None."""
    from torch.export import Dim

    dims = {r.name: Dim(r.name, min=r.lo, max=r.hi) for r in package.ranges}
    per_item: Dict[int, Dict[int, Any]] = {}
    for r in package.ranges:
        for item, d in r.positions:
            per_item.setdefault(item, {})[d] = dims[r.name]
    return tuple(per_item.get(item) if item is not None else None for item in layout)


def _key_shape(model: Any, call: Tuple[tuple, dict], declared: Dict[str, Any]) -> str:
    """The key's shape text the one call would give this package (calls.CallSpec.signature): what a dry run
    looks for among the published packages."""
    args, kwargs = call
    base = shapes.signature(args, kwargs)
    if not declared:
        return base
    try:
        spec = calls.CallSpec(args, kwargs, bool(model.training), forward=getattr(model, "forward", None), **declared)
    except Exception:  # noqa: BLE001 - a call the package route would not take: its key is the base
        return base
    return spec.signature(base)


def _published_keys(client: Any, job: Job, tags: Mapping[str, str]) -> set:
    """The key family's shapes that have a package (a dry run's "already built"); none when it cannot tell."""
    try:
        return set(client.packages(job.name, tags, limit=1000))
    except CacheClientError as exc:
        log.warning("cachesvc build %s: could not list the published packages: %s", job.name, exc.message)
        return set()


def _why(exc: BaseException) -> str:
    return exc.message if isinstance(exc, CacheClientError) else f"{type(exc).__name__}: {' '.join(str(exc).split())}"
