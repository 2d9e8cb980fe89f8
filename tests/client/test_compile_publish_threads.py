"""Where a miss's package is made: export in the thread that called, the build in a child process.

On the H200 (torch 2.11) a cold one-call ViT-B/16 died (KeyError 'custom',
then terminate) when the background thread exported the model while the
serving thread ran compiled calls: both set torch.fx's module-level node
metadata. So no torch.export, and no Inductor build,
may run in the background thread beside the serving one. These spy on the
real functions (calling through), keep calling the compiled model while the
publish runs, and check who ran what. Then a restart served by that package:
its background work (the snapshot restore, the learned packages) starts only
once its first call has its output, not beside the package's first run.
"""
from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

import cachesvc_client  # noqa: E402
from cachesvc_client.one_call import deferred, learned as learned_mod, support  # noqa: E402
from tests.helpers import INDUCTOR_IN_PROCESS_MARKS, restore_recursion_limit  # noqa: E402,F401 - the fixture
from tests.helpers.backends import one_backend  # noqa: E402
from tests.helpers.client import client_for, enter_container  # noqa: E402

pytestmark = [*INDUCTOR_IN_PROCESS_MARKS, pytest.mark.usefixtures("restore_recursion_limit")]



@one_backend  # where the work runs does not depend on the service's backends
def test_a_miss_exports_in_the_calling_thread_and_builds_the_package_in_a_child(live_server, tmp_path,
                                                                                monkeypatch):
    if support.support():
        pytest.skip(support.support())
    enter_container(monkeypatch, tmp_path / "a")
    exporters, in_process_builds = [], []
    real_export, real_package = torch.export.export, torch._inductor.aoti_compile_and_package

    def export_spy(*a, **kw):
        exporters.append(threading.current_thread().name)
        return real_export(*a, **kw)

    def package_spy(*a, **kw):
        in_process_builds.append(threading.current_thread().name)
        return real_package(*a, **kw)

    monkeypatch.setattr(torch.export, "export", export_spy)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", package_spy)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    x = torch.randn(2, 16)
    compiled = cachesvc_client.compile(model, (x,), name="threads", client=client_for(live_server.url),
                                       publish=True)
    with torch.no_grad():
        want = model(x)
        first = compiled(x)
        calls = 1
        while compiled.wait_published(timeout=0.05)["done"] is False:  # serve while the package is made
            torch.testing.assert_close(compiled(x), want)
            calls += 1
    result = compiled.wait_published()
    torch.testing.assert_close(first, want)
    assert result["artifact"].get("status") == "committed", result
    assert exporters == [threading.main_thread().name], exporters  # once, in the thread that called
    assert in_process_builds == [], in_process_builds  # Inductor built the package in a child process
    assert calls > 1  # the model served during the build
    # A restart served by that package starts nothing beside its first call, nor beside what the caller does
    # with that output: the snapshot restore and the learned packages (they shared the interpreter with the
    # package's first run) start a pause after the first call returned, then once, even as more calls come.
    enter_container(monkeypatch, tmp_path / "b")
    started = []
    client = client_for(live_server.url)
    real_restore, real_learned = client.start_restore, learned_mod.Learned.start
    monkeypatch.setattr(client, "start_restore",
                        lambda *a, **kw: started.append(("snapshot", time.monotonic())) or real_restore(*a, **kw))
    monkeypatch.setattr(learned_mod.Learned, "start", lambda self: started.append(("learned", 0)) or real_learned(self))
    hit = cachesvc_client.compile(model, (x,), name="threads", client=client, publish=False)
    assert hit.source == "artifact" and started == [] and "deferred" not in hit.phases, (hit.miss_reason, started)
    assert hit.learned["done"] is False  # not started yet: not "done"
    with torch.no_grad():
        torch.testing.assert_close(hit(x), want)
        returned = time.monotonic()
        # started in a thread of its own, the pause after the first call returned (one_call/deferred.py)
        assert hit._deferred_thread is not None and hit._deferred_thread.name.startswith("cachesvc-deferred-")
        deferred.wait(hit, 30)
        assert [what for what, _ in started] == ["snapshot", "learned"] and hit.phases["deferred"] >= 0, started
        assert started[0][1] - returned >= deferred.START_AFTER_OUTPUT_S - 0.05, (started, returned)
        started = [what for what, _ in started]
        torch.testing.assert_close(hit(x), want)
    assert started == ["snapshot", "learned"] and hit.calls == {"artifact": 2, "torch.compile": 0}
    hit._await_snapshot()  # the restore started after the first call finishes
    assert hit.snapshot is not None and hit.snapshot.hit, hit.snapshot
