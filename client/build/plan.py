"""The build plan: which packages cover the top of the fleet's demand for one model. Pure (shape texts and
numbers in, a ``Plan`` out; no torch, no service), so the rule is tested on synthetic demand.

    p = plan(demand, example, max_packages=8, coverage=0.99)   # demand: CacheClient.demand's rows
    p.kind, p.packages, p.summary()                            # "exact" | "ranges"; packages busiest first

The rule:

- Only shapes of the example call's structure can be built from it: the same items, with the same dtypes
  and ranks (``one_call.shapes.items``). The others are left out and counted; the shares below are of the
  calls of the example's structure, the ones a package of this call can serve.
- Exact first: the busiest shapes, a package each, while there are fewer than ``max_packages`` and their
  calls are short of ``coverage``. If they reach it, that is the plan (a package of one shape is the
  fastest a shape can be served).
- Else ranges. The positions (input, dim) whose size differs between the shapes are grouped: positions
  whose sizes are equal in every shape vary together and take one ``torch.export.Dim``, named ``batch``
  when the group is dim 0 of every tensor, else ``d<dim>``. Each group's observed sizes are cut into at
  most ``max_packages`` contiguous buckets of about equal calls, so a busy size gets a narrow bucket (or
  one of its own); with several groups, a bucket at a time is added to the coarsest group while the boxes
  (a bucket of each group) that hold shapes number at most ``max_packages``. A size 0 or 1 is always a
  bucket of its own: torch.export and Dynamo specialize those sizes, so a range reaching down to 1 needs a
  second trace at 1, and an AOTInductor package built for an encoder's batch 1..2 (torch 2.13) returned
  batch 2 at batch 1: the build's check refused that end, and those calls compiled in the fleet. Each box
  is a package: per group, the range of its shapes' sizes (min..max), and as its example its busiest
  shape. A box of one shape is an exact package. The boxes hold every shape of the structure, so they
  cover 100%, unless the buckets of sizes 0 and 1 alone already make more than ``max_packages`` boxes:
  then the busiest boxes are the plan, and it says what it left out.
- A range is declared on a top-level tensor argument only (the job says which inputs are: ``declarable``).
  Where a varying position is not one, no range can be declared: the exact plan stands, short of
  coverage, and says why.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Collection, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..one_call.shapes import items as parse

#: a place in a shape: (input, dim), the input counted over the shape text's items
Position = Tuple[int, int]
#: sizes torch.export specializes: never a range's example, and a bucket of them alone is exact
SPECIALIZED = (0, 1)


@dataclass(frozen=True)
class Range:
    """One declared dim: ``name`` in ``lo..hi`` at each of ``positions``."""

    name: str
    lo: int
    hi: int
    positions: Tuple[Position, ...]


@dataclass(frozen=True)
class Package:
    """A package to build: from the example call resized to ``shape``, serving ``ranges`` (none: exactly ``shape``)."""

    shape: str
    calls: int  # the observed calls it serves
    ranges: Tuple[Range, ...] = ()

    @property
    def exact(self) -> bool:
        return not self.ranges

    def describe(self) -> str:
        """``f32[8,256]``, or ``f32[8,256] with batch 2..16``."""
        if self.exact:
            return self.shape
        return f"{self.shape} with " + ", ".join(f"{r.name} {r.lo}..{r.hi}" for r in self.ranges)


@dataclass(frozen=True)
class Plan:
    kind: str  # exact | ranges
    packages: Tuple[Package, ...]
    calls: int  # the observed calls of the example's structure
    covered: int  # of those, the calls the packages serve
    coverage: float  # the share asked for
    other_shapes: int = 0  # shapes of another call structure, left out
    other_calls: int = 0
    exact_needed: int = 0  # ranges: how many exact packages would have reached the coverage
    why: str = ""  # short of the coverage: why (exact: no range could be declared; ranges: the limit)
    dims: Tuple[str, ...] = ()  # ranges: the names of the varying groups, in the order of their positions

    @property
    def share(self) -> float:
        return self.covered / self.calls if self.calls else 0.0

    def summary(self) -> List[str]:
        """One or two lines: which plan and why; the shapes left out."""
        lines = [self._choice()]
        if self.other_shapes:
            lines.append(f"{self.other_shapes} shape{'s' * (self.other_shapes != 1)} of another call structure "
                         f"not covered ({self.other_calls:,} calls)")
        return lines

    def _choice(self) -> str:
        if not self.calls:
            return "no demand of this call's structure: nothing to plan"
        one = len(self.packages) == 1
        covers = (f"{len(self.packages)} package{'' if one else 's'} cover{'s' if one else ''} "
                  f"{percent(self.share)} of {self.calls:,} calls")
        if self.kind == "ranges":
            short = f", short of {percent(self.coverage)}: {self.why}" if self.why else ""
            return (f"ranges of {', '.join(self.dims)}: {covers}{short}; exact shapes would need "
                    f"{self.exact_needed} for {percent(self.coverage)}")
        if self.why:
            return f"exact: {covers}, short of {percent(self.coverage)}: {self.why}"
        return f"exact: {covers}"

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["packages"] = [dict(asdict(p), exact=p.exact) for p in self.packages]
        out["summary"] = self.summary()
        return out


def percent(share: float) -> str:
    """``99.4%``: rounded down, so a plan short of 100% never shows 100%."""
    return f"{math.floor(round(share * 1000, 6)) / 10:g}%"


@dataclass(frozen=True)
class _Shape:
    text: str
    calls: int
    sizes: Tuple[int, ...]  # at each position, in order


def plan(demand: Iterable[Mapping[str, Any]], example: str, *, max_packages: int = 8, coverage: float = 0.99,
         declarable: Optional[Collection[int]] = None) -> Plan:
    """The plan for ``demand`` (rows with ``shape`` and ``calls``) of the model whose example call has the shape
    text ``example`` (see the module). ``declarable``: the inputs a range can be declared on (default: every
    one). Raises ValueError for limits out of range or an ``example`` that is not a shape text."""
    if max_packages < 1:
        raise ValueError(f"max_packages must be at least 1, not {max_packages}")
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], not {coverage}")
    base = parse(example)
    if base is None:
        raise ValueError(f"{example!r} is not a shape text")
    mine, other_shapes, other_calls = _of_structure(demand, base)
    total = sum(s.calls for s in mine)
    exact = _busiest(mine, max_packages, coverage, total)
    covered = sum(s.calls for s in exact)
    made = dict(calls=total, coverage=coverage, other_shapes=other_shapes, other_calls=other_calls)
    if not total or _reaches(covered, coverage, total):
        return Plan("exact", tuple(Package(s.text, s.calls) for s in exact), covered=covered, **made)
    positions = _positions(base)
    groups = _groups(mine, positions)
    blocked = sorted({positions[i][0] for g in groups for i in g} - set(declarable)) if declarable is not None else []
    if blocked:
        why = (f"input {blocked[0]} varies but is not a top-level tensor argument, so no range can be declared "
               f"there")
        return Plan("exact", tuple(Package(s.text, s.calls) for s in exact), covered=covered, why=why, **made)
    names = _names(groups, positions, base)
    packages, left_out = _boxes(mine, groups, names, base, positions, max_packages)
    why = (f"{left_out} more box{'es' * (left_out != 1)} of shapes would be needed: sizes 0 and 1 are packages of "
           f"their own (torch.export specializes them); raise --max-packages") if left_out else ""
    return Plan("ranges", packages, covered=sum(p.calls for p in packages), why=why,
                exact_needed=len(_busiest(mine, len(mine), coverage, total)), dims=tuple(names), **made)


# -- the shapes -------------------------------------------------------------------------------------

def _structure(items: Sequence[tuple]) -> tuple:
    return tuple((prefix, dtype, None if dims is None else len(dims)) for prefix, dtype, dims in items)


def _of_structure(demand: Iterable[Mapping[str, Any]], base: Sequence[tuple]) -> Tuple[List[_Shape], int, int]:
    """The demand's shapes of ``base``'s structure, busiest first; and how many shapes and calls are not."""
    want = _structure(base)
    calls: Dict[str, int] = {}
    for row in demand:
        if isinstance(row.get("shape"), str) and isinstance(row.get("calls"), int) and row["calls"] > 0:
            calls[row["shape"]] = calls.get(row["shape"], 0) + row["calls"]
    mine, other_shapes, other_calls = [], 0, 0
    for text, n in calls.items():
        got = parse(text)
        if got is None or _structure(got) != want:
            other_shapes, other_calls = other_shapes + 1, other_calls + n
            continue
        mine.append(_Shape(text, n, tuple(d for _, dtype, dims in got if dtype is not None for d in dims)))
    mine.sort(key=lambda s: (-s.calls, s.text))
    return mine, other_shapes, other_calls


def _reaches(covered: int, coverage: float, total: int) -> bool:
    return covered >= coverage * total * (1 - 1e-12)


def _busiest(mine: List[_Shape], limit: int, coverage: float, total: int) -> List[_Shape]:
    """The busiest shapes while fewer than ``limit`` and short of ``coverage``."""
    chosen, covered = [], 0
    for shape in mine:
        if len(chosen) >= limit or _reaches(covered, coverage, total):
            break
        chosen.append(shape)
        covered += shape.calls
    return chosen


def _positions(base: Sequence[tuple]) -> List[Position]:
    return [(i, d) for i, (_, dtype, dims) in enumerate(base) if dtype is not None for d in range(len(dims))]


def _render(base: Sequence[tuple], sizes: Sequence[int]) -> str:
    """The shape text of ``base``'s structure with ``sizes`` at its positions."""
    at, parts = iter(sizes), []
    for prefix, dtype, dims in base:
        parts.append(prefix if dtype is None else f"{prefix}{dtype}[{','.join(str(next(at)) for _ in dims)}]")
    return ",".join(parts)


# -- ranges -----------------------------------------------------------------------------------------

def _groups(mine: List[_Shape], positions: List[Position]) -> List[Tuple[int, ...]]:
    """The varying positions (indices into ``positions``), grouped where their sizes are equal in every shape."""
    by_sizes: Dict[Tuple[int, ...], List[int]] = {}
    for i in range(len(positions)):
        sizes = tuple(s.sizes[i] for s in mine)
        if len(set(sizes)) > 1:
            by_sizes.setdefault(sizes, []).append(i)
    return [tuple(g) for g in by_sizes.values()]


def _names(groups: List[Tuple[int, ...]], positions: List[Position], base: Sequence[tuple]) -> List[str]:
    """``batch`` for dim 0 of every tensor, else ``d<dim>`` of the group's first position (``_2``... if taken)."""
    batch = {(i, 0) for i, (_, dtype, dims) in enumerate(base) if dtype is not None and dims}
    names: List[str] = []
    for g in groups:
        at = {positions[i] for i in g}
        name = "batch" if at == batch else f"d{positions[g[0]][1]}"
        taken = sum(1 for n in names if n == name or n.startswith(name + "_"))
        names.append(f"{name}_{taken + 1}" if taken else name)
    return names


def _cut(weights: List[Tuple[int, int]], k: int) -> List[List[int]]:
    """``weights`` ((size, calls), by size) cut into contiguous buckets: each size 0 or 1 alone, the others into
    at most ``k`` less those (at least one) of about equal calls."""
    alone = [[size] for size, _ in weights if size in SPECIALIZED]
    rest = [(size, calls) for size, calls in weights if size not in SPECIALIZED]
    return alone + (_cut_evenly(rest, max(1, k - len(alone))) if rest else [])


def _minimum_buckets(sizes: Collection[int]) -> int:
    """The fewest buckets ``_cut`` makes of these sizes: each size 0 or 1, and one for the others."""
    alone = sum(1 for size in sizes if size in SPECIALIZED)
    return alone + (1 if len(sizes) > alone else 0)


def _cut_evenly(weights: List[Tuple[int, int]], k: int) -> List[List[int]]:
    """``weights`` cut into at most ``k`` contiguous buckets of about equal calls: a bucket closes once it holds
    its share of the calls left (over the buckets left), or when the sizes left are only enough for a bucket
    each."""
    if len(weights) <= k:
        return [[size] for size, _ in weights]
    buckets: List[List[int]] = []
    current: List[int] = []
    held, left = 0, sum(calls for _, calls in weights)
    for i, (size, calls) in enumerate(weights):
        current.append(size)
        held += calls
        buckets_left, sizes_left = k - len(buckets), len(weights) - i - 1
        if buckets_left > 1 and (held * buckets_left >= left or sizes_left == buckets_left - 1):
            buckets.append(current)
            left, current, held = left - held, [], 0
    buckets.append(current)
    return buckets


def _bucketed(mine: List[_Shape], groups: List[Tuple[int, ...]], counts: List[int]) -> Dict[tuple, List[_Shape]]:
    """The shapes by box: the bucket of each group they fall in, each group cut into ``counts[g]`` buckets."""
    where = []
    for g, k in zip(groups, counts):
        weights: Dict[int, int] = {}
        for s in mine:
            weights[s.sizes[g[0]]] = weights.get(s.sizes[g[0]], 0) + s.calls
        where.append({size: b for b, bucket in enumerate(_cut(sorted(weights.items()), k)) for size in bucket})
    boxes: Dict[tuple, List[_Shape]] = {}
    for s in mine:
        boxes.setdefault(tuple(w[s.sizes[g[0]]] for g, w in zip(groups, where)), []).append(s)
    return boxes


def _box_counts(mine: List[_Shape], groups: List[Tuple[int, ...]], max_packages: int) -> List[int]:
    """Buckets per group: the fewest each (``_minimum_buckets``), then one more to the coarsest group (most sizes
    a bucket) that keeps the boxes holding shapes at ``max_packages`` or fewer, until none can take one."""
    sizes = [{s.sizes[g[0]] for s in mine} for g in groups]
    distinct = [len(found) for found in sizes]
    counts = [_minimum_buckets(found) for found in sizes]
    while True:
        order = sorted(range(len(groups)), key=lambda g: (-distinct[g] / counts[g], g))
        for g in order:
            trial = counts[:g] + [counts[g] + 1] + counts[g + 1:]
            if counts[g] < distinct[g] and len(_bucketed(mine, groups, trial)) <= max_packages:
                counts = trial
                break
        else:
            return counts


def _boxes(mine: List[_Shape], groups: List[Tuple[int, ...]], names: List[str], base: Sequence[tuple],
           positions: List[Position], max_packages: int) -> Tuple[Tuple[Package, ...], int]:
    """The packages, busiest first, at most ``max_packages``; and how many boxes were left out for the limit."""
    boxes = _bucketed(mine, groups, _box_counts(mine, groups, max_packages))
    packages = sorted((_package(box, groups, names, base, positions) for box in boxes.values()),
                      key=lambda p: (-p.calls, p.shape))
    return tuple(packages[:max_packages]), max(0, len(packages) - max_packages)


def _package(box: List[_Shape], groups: List[Tuple[int, ...]], names: List[str], base: Sequence[tuple],
             positions: List[Position]) -> Package:
    """A box's package: its ranges (the groups whose sizes differ in it) and its example (see the module)."""
    calls = sum(s.calls for s in box)
    spans = [(min(s.sizes[g[0]] for s in box), max(s.sizes[g[0]] for s in box)) for g in groups]
    ranged = [j for j, (lo, hi) in enumerate(spans) if lo < hi]
    if not ranged:  # every group one size here: the box is one shape
        return Package(box[0].text, calls)
    sizes = box[0].sizes  # the busiest: a ranged group never holds a size 0 or 1 (``_cut``)
    ranges = tuple(Range(names[j], spans[j][0], spans[j][1], tuple(positions[i] for i in groups[j]))
                   for j in ranged)
    return Package(_render(base, sizes), calls, ranges)
