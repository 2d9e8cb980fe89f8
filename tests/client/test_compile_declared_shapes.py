"""The one call with keyword arguments and declared shapes, in this process against a live service.

A model called with keywords (``model(x=..., mask=...)``) is compiled through the one call with its
shapes declared, either as a list of example calls or as torch.export Dims; the miss publishes one
package with dynamic dims. A second CompiledModel in a fresh container (own HOME, TMPDIR, cache dir)
gets that package: every declared shape is served by it (Dynamo traces no frame, ``calls`` counts
the artifact), keywords in another order too; a shape outside the declaration runs torch.compile,
with one log line however often it is called.
"""
from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

import cachesvc_client  # noqa: E402
from cachesvc_client.one_call import support  # noqa: E402
from tests.helpers import INDUCTOR_IN_PROCESS_MARKS, restore_recursion_limit  # noqa: E402,F401 - the fixture
from tests.helpers.backends import one_backend  # noqa: E402
from tests.helpers.client import client_for, enter_container  # noqa: E402

pytestmark = [*INDUCTOR_IN_PROCESS_MARKS, pytest.mark.usefixtures("restore_recursion_limit")]


class Masked(torch.nn.Module):
    """Called with keywords, as transformers' models are: ``model(x=..., mask=...)``."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, mask):
        return {"y": torch.tanh(self.proj(x)) * mask.unsqueeze(-1), "n": mask.sum(-1)}


def call(batch: int, seq: int = 4) -> dict:
    gen = torch.Generator().manual_seed(batch * 100 + seq)
    return {"x": torch.randn(batch, seq, 8, generator=gen), "mask": (torch.rand(batch, seq, generator=gen) > 0.3).float()}


def declarations():
    from torch.export import Dim

    batch = Dim("batch", min=1, max=8)
    return {"examples": {"examples": [call(4), call(8)]},
            "dims": {"dynamic_shapes": {"x": {0: batch}, "mask": {0: batch}}}}


@one_backend
@pytest.mark.parametrize("form, served, outside", [("examples", (2, 4, 8), 3), ("dims", (1, 3, 8), 9)])
def test_declared_shapes_are_served_by_one_package_and_others_fall_back_once(live_server, tmp_path, monkeypatch,
                                                                             caplog, form, served, outside):
    if support.support():
        pytest.skip(support.support())
    from torch._dynamo.utils import counters

    model = Masked().eval()
    declared = declarations()[form]
    enter_container(monkeypatch, tmp_path / "cold")
    cold = cachesvc_client.compile(model, kwargs=call(2), name=f"masked-{form}", client=client_for(live_server.url),
                                   publish=True, **declared)
    with torch.no_grad():
        cold(**call(2))
    published = cold.wait_published()
    assert published["artifact"].get("status") == "committed", published
    assert cold.shape.startswith("mask=f32[2,4],x=f32[2,4,8]|")  # the keywords' names and the declaration

    enter_container(monkeypatch, tmp_path / "restarted")
    counters.clear()
    warm = cachesvc_client.compile(model, kwargs=call(2), name=f"masked-{form}", client=client_for(live_server.url),
                                   **declared)
    assert warm.tags == cold.tags  # the same model after the miss's torch.compile (which marks it) keys the same
    assert warm.source == "artifact", warm.miss_reason
    with torch.no_grad():
        for batch in served:
            got, want = warm(mask=call(batch)["mask"], x=call(batch)["x"]), model(**call(batch))  # another order
            assert set(got) == {"y", "n"}
            torch.testing.assert_close(got, want)
        assert warm.calls == {"artifact": len(served), "torch.compile": 0}
        assert "frames" not in counters  # nothing traced: the package served every declared shape
        caplog.set_level(logging.WARNING, logger="cachesvc_client")
        for _ in range(2):
            torch.testing.assert_close(warm(**call(outside)), model(**call(outside)))
    assert warm.calls["torch.compile"] == 2
    lines = [r.getMessage() for r in caplog.records if "torch.compile serves this call" in r.getMessage()]
    assert len(lines) == 1 and "declared" in lines[0], lines


class Positioned(torch.nn.Module):
    """Position embeddings for 16 places, longer inputs cut to 16 first: a trace at a sequence of 16 or less
    holds for those lengths only, so a declared range past 16 cannot be exported whole."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Parameter(torch.randn(16, 8))
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[1] > 16:
            x = x[:, :16]
        return self.proj(x + self.pos[: x.shape[1]])


@one_backend
def test_a_range_torch_export_narrows_is_served_as_narrowed(live_server, tmp_path, monkeypatch, caplog):
    """Declared seq 2..32; torch.export refuses it ("Constraints violated (seq) ... Suggested fixes: seq =
    Dim('seq', max=16)"): the package is exported for 2..16, the build says so in one line, the package's meta
    carries the range, and a restart serves 2..16 and sends 24 to torch.compile, naming the range."""
    if support.support():
        pytest.skip(support.support())
    from torch.export import Dim

    model, seq = Positioned().eval(), Dim("seq", min=2, max=32)
    x = {n: torch.randn(2, n, 8, generator=torch.Generator().manual_seed(n)) for n in (4, 12, 24)}
    declared = {"dynamic_shapes": {"x": {1: seq}}}
    enter_container(monkeypatch, tmp_path / "cold")
    caplog.set_level(logging.WARNING, logger="cachesvc_client")
    cold = cachesvc_client.compile(model, (x[4],), name="positioned", client=client_for(live_server.url),
                                   publish=True, **declared)
    with torch.no_grad():
        cold(x[4])
    published = cold.wait_published()
    assert published["artifact"].get("status") == "committed", published
    said = [r.getMessage() for r in caplog.records if "is served as" in r.getMessage()]
    assert len(said) == 1 and "declared seq=2..32 is served as seq=2..16" in said[0], said

    enter_container(monkeypatch, tmp_path / "restarted")
    warm = cachesvc_client.compile(model, (x[4],), name="positioned", client=client_for(live_server.url), **declared)
    assert warm.source == "artifact", warm.miss_reason
    with torch.no_grad():
        for n in (4, 12):
            torch.testing.assert_close(warm(x[n]), model(x[n]))
        assert warm.calls == {"artifact": 2, "torch.compile": 0}
        torch.testing.assert_close(warm(x[24]), model(x[24]))
    assert warm.calls["torch.compile"] == 1 and "outside the declared seq in [2, 16]" in warm.calls.why, warm.calls.why
