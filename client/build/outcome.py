"""What the build job did: a result per package, and the whole as lines (stdout) or as one JSON document."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from .plan import Package, Plan

BUILT, ALREADY, FAILED, NOT_STARTED, PLANNED = "built", "already built", "failed", "not started", "planned"
#: the statuses after which the package exists on the service
EXISTS = (BUILT, ALREADY)


@dataclass
class Result:
    """One package: built from the example resized to ``shape``, keyed by ``key`` (a range's: ``shape|dynamic=...``)."""

    shape: str
    key: str
    calls: int  # the observed calls it serves (the example's: those of its shape)
    ranges: Dict[str, List[int]] = field(default_factory=dict)  # name -> [lo, hi]; none: exact
    status: str = PLANNED
    why: str = ""  # failed: the cause; not started: the budget
    seconds: float = 0.0  # what building it (or finding it built) took
    example: bool = False  # the example call's own package, built first

    @classmethod
    def of(cls, package: Package, key: str = "") -> "Result":
        return cls(package.shape, key or package.shape, package.calls,
                   {r.name: [r.lo, r.hi] for r in package.ranges})

    @property
    def exists(self) -> bool:
        return self.status in EXISTS

    def describe(self) -> str:
        ranges = ", ".join(f"{name} {lo}..{hi}" for name, (lo, hi) in self.ranges.items())
        return f"{self.shape} with {ranges}" if ranges else self.shape

    def state(self) -> str:
        """``built in 31.2 s``, ``already built``, ``failed: why``, ``not started: over the 3600 s budget``."""
        timed = f" in {self.seconds:.1f} s" if self.status == BUILT else ""
        return f"{self.status}{timed}" + (f": {self.why}" if self.why else "")


@dataclass
class Outcome:
    name: str
    key: Dict[str, Any]  # the key family: name, tags, env
    example: Result
    job: Dict[str, Any] = field(default_factory=dict)  # how it was asked to build (mode, options, limits)
    dry_run: bool = False
    plan: Optional[Plan] = None
    packages: List[Result] = field(default_factory=list)
    note: str = ""  # why there is no plan (no demand yet)
    error: str = ""  # the demand could not be read
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Every planned package exists (a dry run: the plan was made); the exit status is 0 then, else 1."""
        if self.error:
            return False
        return self.dry_run or all(r.exists for r in [self.example, *self.packages])

    def counts(self) -> Dict[str, int]:
        statuses = [r.status for r in self.packages]
        return {s: statuses.count(s) for s in (BUILT, ALREADY, FAILED, NOT_STARTED, PLANNED)}

    def lines(self) -> List[str]:
        out = [f"build {self.name}: example {self.example.describe()}: {self.example.state()}"]
        if self.error or self.note:
            return out + [self.error or self.note]
        out += [f"plan: {line}" for line in self.plan.summary()]
        width = max([len(r.describe()) for r in self.packages] + [10])
        out += [f"  {r.describe():<{width}}  {r.calls:>10,} calls  {r.state()}{' (the example)' * r.example}"
                for r in self.packages]
        return out + [self._summary()]

    def _summary(self) -> str:
        n = self.counts()
        if self.dry_run:
            return (f"dry run: {len(self.packages)} packages planned, {n[ALREADY]} already built, {n[PLANNED]} to "
                    f"build; nothing built ({self.seconds:.1f} s)")
        said = ", ".join(f"{count} {status}" for status, count in n.items() if status != PLANNED)
        ending = "every planned package exists" if self.ok else "some planned packages do not exist"
        return f"{said} in {self.seconds:.1f} s: {ending}"

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "key": self.key, "job": self.job, "dry_run": self.dry_run, "ok": self.ok,
                "example": dict(asdict(self.example), exists=self.example.exists),
                "plan": self.plan.to_dict() if self.plan is not None else None,
                "packages": [dict(asdict(r), exists=r.exists) for r in self.packages],
                "counts": self.counts(), "note": self.note, "error": self.error,
                "seconds": round(self.seconds, 3), "lines": self.lines()}
