"""The build job's plan (cachesvc_client.build.plan) on synthetic demand: the exact shapes while they reach the
coverage within the package limit, else ranges of the sizes that vary; shapes of another call structure
left out and counted. No torch, no service: the rule alone.

Each plan is checked by what its packages would serve (``served``: a shape is served by a package when
every size outside its ranges is the example's and every size inside is in its range, the same within
one range), not by how the plan cut them."""
from __future__ import annotations

import random
from typing import Dict, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachesvc_client.build.plan import SPECIALIZED, Package, Plan, percent, plan
from cachesvc_client.one_call.shapes import items

MLP = "f32[8,256]"


def rows(calls: Dict[str, int]) -> List[dict]:
    """Demand rows as CacheClient.demand gives them, busiest first."""
    return [{"shape": s, "calls": n, "served": {"package": 0, "compile": n, "eager": 0}}
            for s, n in sorted(calls.items(), key=lambda kv: -kv[1])]


def sizes(text: str) -> Dict[tuple, int]:
    """(item, dim) -> size of a shape text."""
    return {(i, d): n for i, (_, dtype, dims) in enumerate(items(text)) if dtype is not None
            for d, n in enumerate(dims)}


def served(package: Package, text: str) -> bool:
    want, got = sizes(package.shape), sizes(text)
    if want.keys() != got.keys():
        return False
    ranged = {}
    for r in package.ranges:
        values = {got[p] for p in r.positions}
        if len(values) != 1 or not r.lo <= values.pop() <= r.hi:
            return False
        ranged.update(dict.fromkeys(r.positions))
    return all(got[p] == n for p, n in want.items() if p not in ranged)


def servers(p: Plan, text: str) -> List[Package]:
    return [pkg for pkg in p.packages if served(pkg, text)]


def check_ranges(p: Plan, demand: Dict[str, int], max_packages: int) -> None:
    """A ranges plan: at most max_packages, every shape served by at most one package, each package's calls
    those of the shapes it serves, no range reaching a size torch.export specializes (0 or 1); every call
    covered unless the limit left boxes out, and then the plan says so."""
    assert p.kind == "ranges" and 1 <= len(p.packages) <= max_packages, p
    for text in demand:
        assert len(servers(p, text)) <= 1, (text, [pkg.describe() for pkg in servers(p, text)])
    for pkg in p.packages:
        assert served(pkg, pkg.shape), pkg
        assert pkg.calls == sum(n for text, n in demand.items() if served(pkg, text)), pkg
        for r in pkg.ranges:
            assert r.lo < r.hi and r.lo not in SPECIALIZED, pkg.describe()
    assert p.calls == sum(demand.values()) and p.covered == sum(pkg.calls for pkg in p.packages)
    assert (p.covered == p.calls) != bool(p.why), p
    assert [pkg.calls for pkg in p.packages] == sorted((pkg.calls for pkg in p.packages), reverse=True)


def test_skewed_demand_is_planned_exact_busiest_first():
    demand = {"f32[8,256]": 9000, "f32[1,256]": 700, "f32[4,256]": 250, "f32[16,256]": 40, "f32[3,256]": 6,
              "f32[5,256]": 4}
    p = plan(rows(demand), MLP)
    assert p.kind == "exact" and [pkg.shape for pkg in p.packages] == ["f32[8,256]", "f32[1,256]", "f32[4,256]"]
    assert all(pkg.exact for pkg in p.packages) and p.covered == 9950 and p.calls == 10000
    assert p.summary() == ["exact: 3 packages cover 99.5% of 10,000 calls"]


def test_batch_1_to_64_is_covered_99_percent_by_at_most_8_packages():
    """Issue 41's goal: a model whose batch size varies 1..64, about uniformly."""
    rng = random.Random(41)
    demand = {f"f32[{b},256]": rng.randint(150, 250) for b in range(1, 65)}
    p = plan(rows(demand), MLP)
    check_ranges(p, demand, 8)
    assert len(p.packages) == 8 and p.share >= 0.99 and p.dims == ("batch",)
    assert {r.name for pkg in p.packages for r in pkg.ranges} == {"batch"}
    total = sum(demand.values())
    assert p.summary() == [f"ranges of batch: 8 packages cover 100% of {total:,} calls; exact shapes would need "
                           f"64 for 99%"]
    # about equal calls a package: none holds more than twice its share
    assert max(pkg.calls for pkg in p.packages) < 2 * total / 8


def test_a_busy_size_is_its_packages_example():
    demand = {f"f32[{b},256]": 10 for b in range(1, 65)}
    demand["f32[32,256]"] = 2000
    p = plan(rows(demand), MLP)
    check_ranges(p, demand, 8)
    (home,) = servers(p, "f32[32,256]")
    assert home.shape == "f32[32,256]"


def test_sizes_0_and_1_are_never_in_a_range_each_is_a_package_of_its_own():
    """torch.export and Dynamo specialize sizes 0 and 1: a range reaching down to 1 needs a trace of its own
    there, and an AOTInductor package of an encoder built for batch 1..2 returned batch 2 at batch 1 (the
    build's check refused that end, so the fleet compiled batch 1). Each is an exact bucket instead."""
    demand = {"f32[1,256]": 4000, **{f"f32[{b},256]": 50 for b in range(2, 65)}}
    p = plan(rows(demand), MLP)
    check_ranges(p, demand, 8)
    assert p.packages[0] == Package("f32[1,256]", 4000)  # the busiest, on its own: exact

    light = {"f32[1,256]": 150, "f32[2,256]": 100, "f32[3,256]": 90}
    p = plan(rows(light), MLP, max_packages=2)
    check_ranges(p, light, 2)
    assert [pkg.describe() for pkg in p.packages] == ["f32[2,256] with batch 2..3", "f32[1,256]"]
    two = {f"f32[{b},{s}]": 10 for b in (1, 2, 4) for s in (1, 8, 16)}  # 1 in both groups
    p = plan(rows(two), "f32[4,8]", max_packages=4)
    check_ranges(p, two, 4)
    assert p.covered == p.calls and sorted(pkg.describe() for pkg in p.packages) == [
        "f32[1,16] with d1 8..16", "f32[1,1]", "f32[2,16] with batch 2..4, d1 8..16", "f32[2,1] with batch 2..4"]


def test_a_limit_below_the_buckets_of_0_and_1_keeps_the_busiest_boxes_and_says_so():
    light = {"f32[1,256]": 150, "f32[2,256]": 100, "f32[3,256]": 90}
    p = plan(rows(light), MLP, max_packages=1)
    check_ranges(p, light, 1)
    assert [pkg.describe() for pkg in p.packages] == ["f32[2,256] with batch 2..3"] and p.covered == 190
    assert p.summary() == ["ranges of batch: 1 package covers 55.8% of 340 calls, short of 99%: 1 more box of "
                           "shapes would be needed: sizes 0 and 1 are packages of their own (torch.export "
                           "specializes them); raise --max-packages; exact shapes would need 3 for 99%"]
    p = plan(rows({"f32[0,256]": 5, "f32[1,256]": 9}), MLP, max_packages=1)
    assert [pkg.describe() for pkg in p.packages] == ["f32[1,256]"] and (p.covered, p.calls) == (9, 14)


def test_shapes_of_another_call_structure_are_left_out_and_counted():
    demand = {"f32[8,256]": 500, "f32[4,256]": 480, "i64[8,256]": 30, "f32[8,256,3]": 20, "f32[8,256],f32[8]": 10,
              "not a shape": 7}
    p = plan(rows(demand), MLP)
    assert p.kind == "exact" and [pkg.shape for pkg in p.packages] == ["f32[8,256]", "f32[4,256]"]
    assert (p.calls, p.covered, p.other_shapes, p.other_calls) == (980, 980, 4, 67)
    assert p.summary() == ["exact: 2 packages cover 100% of 980 calls",
                           "4 shapes of another call structure not covered (67 calls)"]


def test_sequence_lengths_varying_together_at_dim_1_are_one_range_named_d1():
    example = "attention_mask=i64[4,16],input_ids=i64[4,16]"
    demand = {f"attention_mask=i64[4,{s}],input_ids=i64[4,{s}]": 10 + s for s in range(2, 129)}
    p = plan(rows(demand), example, max_packages=4)
    check_ranges(p, demand, 4)
    assert p.dims == ("d1",)
    for pkg in p.packages:
        (r,) = pkg.ranges
        assert r.name == "d1" and set(r.positions) == {(0, 1), (1, 1)}
        assert sizes(pkg.shape)[(0, 0)] == 4


def test_batch_is_dim_0_of_every_tensor():
    demand = {f"f32[{b},256],mask=f32[{b}]": 100 for b in (2, 4, 8, 16, 32, 48, 64, 96, 128, 256)}
    p = plan(rows(demand), "f32[8,256],mask=f32[8]", max_packages=3)
    check_ranges(p, demand, 3)
    assert p.dims == ("batch",) and all(set(r.positions) == {(0, 0), (1, 0)} for pkg in p.packages
                                        for r in pkg.ranges)


def test_two_independent_varying_groups_make_boxes_within_the_limit():
    demand = {f"f32[{b},{s}]": 10 * b + s for b in (1, 2, 4, 8, 16) for s in (16, 32, 64, 128)}
    for limit in (1, 3, 8, 15):
        p = plan(rows(demand), "f32[8,16]", max_packages=limit)
        check_ranges(p, demand, limit)
        assert p.dims == ("batch", "d1")
    assert len(plan(rows(demand), "f32[8,16]", max_packages=15).packages) == 15  # the limit used up
    assert plan(rows(demand), "f32[8,16]", max_packages=20).kind == "exact"  # 20 shapes, 20 packages


def test_two_groups_at_the_same_dim_get_distinct_names():
    demand = {f"f32[4,{a}],f32[4,{b}]": 10 for a in (8, 16, 32) for b in (5, 7)}
    p = plan(rows(demand), "f32[4,8],f32[4,5]", max_packages=2)
    check_ranges(p, demand, 2)
    assert p.dims == ("d1", "d1_2")


def test_no_demand_plans_nothing():
    for demand in ({}, {"i64[3]": 40}):
        p = plan(rows(demand), MLP)
        assert (p.kind, p.packages, p.calls) == ("exact", (), 0)
        assert p.summary()[0] == "no demand of this call's structure: nothing to plan"


def test_coverage_is_reached_at_equality_and_max_packages_turns_exact_into_ranges():
    demand = {"f32[8,256]": 99, "f32[2,256]": 1}
    assert [pkg.shape for pkg in plan(rows(demand), MLP, coverage=0.99).packages] == ["f32[8,256]"]  # 99% is 99%
    assert len(plan(rows(demand), MLP, coverage=1.0).packages) == 2  # every shape
    p = plan(rows(demand), MLP, coverage=1.0, max_packages=1)  # two shapes, one package: a range
    check_ranges(p, demand, 1)
    assert p.packages[0].describe() == "f32[8,256] with batch 2..8"
    assert p.summary() == ["ranges of batch: 1 package covers 100% of 100 calls; exact shapes would need 2 for 100%"]


def test_limits_out_of_range_are_refused():
    for kwargs in ({"max_packages": 0}, {"coverage": 0}, {"coverage": 1.5}):
        with pytest.raises(ValueError):
            plan([], MLP, **kwargs)
    with pytest.raises(ValueError, match="not a shape text"):
        plan([], "?!")


def test_sizes_that_vary_where_no_range_can_be_declared_keep_the_exact_plan_and_say_why():
    demand = {f"f32[{b},256]": 10 for b in range(1, 30)}
    p = plan(rows(demand), MLP, declarable=[])
    assert p.kind == "exact" and len(p.packages) == 8 and p.covered == 80
    assert p.summary() == ["exact: 8 packages cover 27.5% of 290 calls, short of 99%: input 0 varies but is not a "
                           "top-level tensor argument, so no range can be declared there"]


def test_percent_never_rounds_up_to_100():
    assert (percent(0.9996), percent(1.0), percent(0.99), percent(0.994)) == ("99.9%", "100%", "99%", "99.4%")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9), st.integers(1, 500)), min_size=1, max_size=40),
       st.integers(1, 10), st.sampled_from([0.5, 0.9, 0.99, 1.0]))
def test_every_plan_keeps_its_limits_and_serves_what_it_says(shapes, limit, coverage):
    demand: Dict[str, int] = {}
    for b, s, n in shapes:
        demand[f"f32[{b},{s}],i64[{b}]"] = demand.get(f"f32[{b},{s}],i64[{b}]", 0) + n
    p = plan(rows(demand), "f32[2,3],i64[2]", max_packages=limit, coverage=coverage)
    if p.kind == "ranges":
        check_ranges(p, demand, limit)
        return
    assert len(p.packages) <= limit and p.covered >= coverage * p.calls * (1 - 1e-12), p
    assert p.covered == sum(demand[pkg.shape] for pkg in p.packages)
