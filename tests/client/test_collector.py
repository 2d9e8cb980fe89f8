"""The garbage collector's clock (process/collector.py): compile()'s ``phases["gc"]``."""
from __future__ import annotations

import gc
import threading

from cachesvc_client.process.collector import OLDEST, CollectorClock


def cycles(n: int) -> None:
    """``n`` objects the collector alone can free (each refers to itself)."""
    for _ in range(n):
        node: dict = {}
        node["self"] = node


def survivors(n: int) -> list:
    """``n`` objects the collector tracks, kept alive: they reach the oldest generation."""
    return [[] for _ in range(n)]


def test_it_counts_a_full_collection_and_leaves_gc_callbacks_as_it_found_them():
    before = list(gc.callbacks)
    with CollectorClock() as clock:
        cycles(50_000)
        gc.collect()
    assert clock.full >= 1 and clock.seconds > 0
    assert gc.callbacks == before
    seconds = clock.seconds
    gc.collect()  # after the stretch: not counted
    assert clock.seconds == seconds


def test_it_counts_the_collections_other_threads_set_off():
    with CollectorClock() as clock:
        worker = threading.Thread(target=lambda: gc.collect(OLDEST))
        worker.start()
        worker.join()
    assert clock.full == 1 and clock.seconds > 0


def test_a_young_collection_is_timed_but_not_full():
    with CollectorClock() as clock:
        gc.collect(0)
    assert clock.full == 0 and clock.seconds > 0


def test_an_error_inside_still_removes_the_callback_and_a_cleared_list_is_no_error():
    before = list(gc.callbacks)
    try:
        with CollectorClock():
            raise KeyError("inside")
    except KeyError:
        pass
    assert gc.callbacks == before
    with CollectorClock():
        saved = list(gc.callbacks)
        gc.callbacks.clear()  # someone else's code cleared it
    gc.callbacks.extend(c for c in saved if c in before)
    assert gc.callbacks == before


# -- the hold on full collections (compile() to just after its first output) ------------------------------

import time  # noqa: E402 - the hold's tests only

import pytest  # noqa: E402

from cachesvc_client.process.collector import hold_full_collections  # noqa: E402


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield saved
    gc.set_threshold(*saved)


def test_a_hold_stops_full_collections_not_young_ones_and_its_release_lets_them_run(thresholds):
    gc.set_threshold(100, 1, 1)  # a full collection due after every second young one's
    held = hold_full_collections()
    with CollectorClock() as clock:
        kept = survivors(len(gc.get_objects()))  # what would make a full collection due: as many new as there are
    assert clock.full == 0 and clock.seconds > 0  # the young ones ran
    held.release()
    held.release()  # once is enough; a second does nothing
    assert gc.get_threshold() == (100, 1, 1)
    with CollectorClock() as clock:
        kept += survivors(1000)
    assert clock.full >= 1


def test_nested_holds_end_with_the_last_and_a_threshold_set_meanwhile_is_kept(thresholds):
    first, second = hold_full_collections(), hold_full_collections()
    first.release()
    assert gc.get_threshold()[OLDEST] > 10**6  # the second still holds
    second.release()
    assert gc.get_threshold() == thresholds
    third = hold_full_collections()
    gc.set_threshold(500, 5, 5)  # the user's own, set while held
    third.release()
    assert gc.get_threshold() == (500, 5, 5)


def test_a_hold_nobody_releases_ends_by_itself(thresholds):
    hold_full_collections(max_s=0.05)
    deadline = time.monotonic() + 5
    while gc.get_threshold() != thresholds and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gc.get_threshold() == thresholds


def test_release_after_moves_the_end_later_or_sooner_and_a_released_hold_stays_released(thresholds):
    held = hold_full_collections(max_s=0.05)
    held.release_after(30)  # a hit's first output: past the first call's return, not at the 50 ms bound
    time.sleep(0.3)
    assert gc.get_threshold()[OLDEST] > 10**6 and not held.released
    held.release_after(0.05)
    deadline = time.monotonic() + 5
    while not held.released and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held.released and gc.get_threshold() == thresholds
    held.release_after(0.01)  # ended already: nothing starts again
    time.sleep(0.1)
    assert gc.get_threshold() == thresholds


def test_release_after_with_no_thread_to_be_had_releases_at_once(thresholds, monkeypatch):
    import threading

    held = hold_full_collections()

    def refused(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Timer, "start", refused)
    held.release_after(30)  # a first output as the process exits: nothing raises into the call
    assert held.released and gc.get_threshold() == thresholds


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_child_forked_during_a_hold_starts_with_the_saved_thresholds(thresholds):
    import os

    held = hold_full_collections()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its thresholds, then leave without pytest's teardown
        os.write(write, repr(gc.get_threshold()).encode())
        os._exit(0)
    os.close(write)
    seen = os.read(read, 200).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert gc.get_threshold()[OLDEST] > 10**6  # the parent still holds
    held.release()
    assert seen == repr(thresholds)
