"""The proof's portable descriptions, as a process that describes many classes and much code sees them.

A restart compares the build's descriptions with the live model's (proof/check.py). Describing the same
code and the same base classes again was most of that comparison, so code is described once per code
object and each class's own members once per class. These tests hold what those caches must not change:
the description itself (a published proof was made without them), and a class changed in the same
process after it was described (a monkeypatch) is described anew.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.one_call.proof import portable  # noqa: E402


def uncached(cls: type) -> str:
    """A class's description as it was made before the caches: every class of the MRO, every member."""
    parts = []
    for c in cls.__mro__:
        if c is object:
            continue
        parts.append(portable._fqn(c))
        for name, attr in sorted(vars(c).items(), key=lambda kv: kv[0]):
            if name not in portable.CACHED:
                parts.append((name, portable._member(attr)))
    return f"class:{portable._fqn(cls)}:" + portable._digest(parts)


class Block(torch.nn.Module):
    scale = 2

    def forward(self, x):
        return torch.relu(x) * self.scale


class Wider(Block):
    def extra(self):
        return 1


@pytest.mark.parametrize("cls", [torch.nn.Linear, torch.nn.Module, torch.nn.Sequential, Block, Wider, dict, int])
def test_a_class_is_described_as_before_the_caches_the_first_time_and_again(cls):
    assert portable.klass(cls) == uncached(cls)
    assert portable.klass(cls) == uncached(cls)


def test_a_method_replaced_after_the_class_was_described_is_described_anew():
    class Patched(torch.nn.Module):
        def forward(self, x):
            return x + 1

    before = portable.klass(Patched)
    Patched.forward = lambda self, x: x + 2  # the same process, after a first compile() described it
    assert portable.klass(Patched) != before
    assert portable.klass(Patched) == uncached(Patched)


def test_a_base_class_changed_after_a_subclass_was_described_changes_the_subclass():
    class Base(torch.nn.Module):
        def helper(self):
            return 1

    class Child(Base):
        pass

    before = portable.klass(Child)
    Base.helper = lambda self: 2
    assert portable.klass(Child) != before
    assert portable.klass(Child) == uncached(Child)


def test_a_member_added_or_removed_after_a_description_is_another_description():
    class Grown(torch.nn.Module):
        pass

    first = portable.klass(Grown)
    Grown.setting = 3
    grown = portable.klass(Grown)
    del Grown.setting
    assert first != grown and portable.klass(Grown) == first


def test_code_that_differs_only_in_a_constants_type_is_described_apart():
    """The code cache is keyed by the code object: CPython's code equality tells 1, 1.0 and True apart, so
    functions that return each have three descriptions."""
    def one():
        return 1

    def one_float():
        return 1.0

    def true():
        return True

    one_float.__code__ = one_float.__code__.replace(co_name="one")
    true.__code__ = true.__code__.replace(co_name="one")
    described = {portable.code(f.__code__) for f in (one, one_float, true)}
    assert len(described) == 3


def test_a_session_describes_each_class_once_and_the_next_session_sees_a_change(monkeypatch):
    """A proof's load describes a class for every TYPE_MATCH guard on it; inside ``session()`` the MRO's
    members are walked once per class. The description is the one made outside a session, and a class
    changed between two loads (a monkeypatch after a first compile()) is described anew by the next."""
    class Patched(Wider):
        pass

    walked = []
    real = portable._klass
    monkeypatch.setattr(portable, "_klass", lambda cls: walked.append(cls) or real(cls))
    with portable.session():
        inside = {portable.klass(Patched) for _ in range(5)}
        with portable.session():  # nested: the outer session's memo
            inside.add(portable.klass(Patched))
        other = portable.klass(Block)
    assert [c for c in walked if c in (Patched, Block)] == [Patched, Block]  # others: what their members name
    assert inside == {uncached(Patched)} and other == uncached(Block)
    monkeypatch.setattr(Block, "forward", lambda self, x: x - 1)  # a base class patched between two loads
    with portable.session():
        assert portable.klass(Patched) == uncached(Patched) != inside.pop()


def test_a_class_named_by_a_kept_classs_member_changed_since_changes_that_class(monkeypatch):
    """A class's kept description holds the descriptions of the classes its members name (an annotation's
    ``torch.Tensor``): one of those patched later in the same process (Dynamo and the one call add members
    to torch's classes) makes the kept description stale. CI, 2026-12-05: nn.Linear's description differed
    from a fresh one after an in-process hit, by its annotation's torch.Tensor."""
    class Payload:
        def value(self):
            return 1

    class Holder(torch.nn.Module):
        kinds = (Payload,)  # a class attribute holding another class (described by its members, as annotations are)

    before = portable.klass(Holder)
    monkeypatch.setattr(Payload, "value", lambda self: 2)
    assert portable.klass(Holder) != before
    assert portable.klass(Holder) == uncached(Holder)


def test_pickling_an_instance_does_not_change_its_class():
    """copyreg caches ``__slotnames__`` on a class the first time one of its instances is pickled: a proof's
    capture pickles tensors, so torch.Tensor (and nn.Linear, whose annotations name it) was described otherwise
    by a process that had pickled a tensor than by one that had not, and an in-process hit after a build missed."""
    import copy

    class Slotted:
        __slots__ = ("a",)

        def __init__(self):
            self.a = 1

    before = portable.klass(Slotted)
    copy.copy(Slotted())  # as pickling does, through copyreg
    assert "__slotnames__" in vars(Slotted) and portable.klass(Slotted) == before == uncached(Slotted)
