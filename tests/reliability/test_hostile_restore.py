"""Issue 5, item 2: hostile content and interruptions on restore.

    a restore SIGKILLed at any moment leaves the dir usable
        -> test_interrupted_restore_killed_at_several_moments_leaves_only_whole_files_and_a_later_restore_completes
           test_interrupted_restore_then_torch_compile_hits_the_fx_graph_cache (real torch.compile)

Covered earlier, in tests/client/test_publish_restore.py:
    a blob whose bytes do not match its hash is never written (retried, then reported)
        -> test_corrupt_blob_is_never_written_and_is_named_in_the_report
    a manifest pointing outside the cache dir is refused whole
        -> test_manifest_pointing_outside_the_cache_dir_is_refused_whole
    never written through a symlink -> test_restore_does_not_write_through_a_symlink_in_the_cache_dir
    existing files never clobbered with a half-written one: temp file + rename (client/restore/place.py),
        checked here by assert_no_half_file after every kill.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.containers import Container
from tests.helpers.restores import (ENV_VARS, NAME, SHAPE, assert_no_half_file, final_files, make_files,
                                    publish_files, restore_cli, temp_files)
from tests.reliability.faults import SlowProxy, client_env


def _kill_when(proc: subprocess.Popen, seen, what: str, timeout: float = 90) -> None:
    """SIGKILL ``proc`` (a container killed mid-start) as soon as ``seen()`` holds, polled every few ms.

    A kill at a fixed delay lands wherever the machine's load puts the restore (under load, before
    it started); a kill on an observed moment lands there. Fails, naming the moment, if the process
    ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    try:
        while not seen():
            assert proc.poll() is None, f"the restore ended (exit {proc.returncode}) before {what}"
            assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait()


def _killed_restore(url: str, env: dict, cache: Path, moment: str, seen) -> None:
    """Start `cachesvc-client restore` and SIGKILL it at ``moment``: when ``seen(files it placed, its temp files)``
    holds in ``cache``."""
    placed, leftovers = set(final_files(cache)), set(temp_files(cache))
    proc = subprocess.Popen([sys.executable, "-m", "cachesvc_client.cli", "restore", "--name", NAME, "--shape", SHAPE,
                             "--url", url, "-q"], env={**env, **ENV_VARS}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _kill_when(proc, lambda: seen(len(set(final_files(cache)) - placed), set(temp_files(cache)) - leftovers), moment)


#: when each killed restore is killed, in turn: (name, (files it placed, its temp files) -> kill now). Each
#: moment is one the restore reaches whatever the timing: a placed file stays placed, so the loop sees it even
#: when the restore ends right after; a temp file is looked for only in the first restore, where the 2 MB
#: file is seconds in transfer (what is left later may land in one burst from a pack and end the restore).
MOMENTS = [
    ("its first temp file", lambda placed, temps: bool(temps)),
    ("its first placed file", lambda placed, temps: placed >= 1),
    ("its first placed file, late in the restore", lambda placed, temps: placed >= 1),
]


def test_interrupted_restore_killed_at_several_moments_leaves_only_whole_files_and_a_later_restore_completes(
        tmp_path, start_service):
    svc = start_service()
    sizes = {f"fxgraph/k{i % 5}/e{i}": 30_000 + 7_000 * i for i in range(24)} | {"sj/big.so": 2_000_000}
    files = make_files(tmp_path / "src", sizes)
    assert publish_files(svc.url, svc.token, tmp_path / "src").status == "committed"
    env = client_env({"CACHESVC_TOKEN": svc.token}, tmp_path / "ctr")
    cache = Path(env["TORCHINDUCTOR_CACHE_DIR"])

    progress = []
    # Blobs come through the service here; the proxy slows them to ~0.8 MB/s, so a restore lasts a few
    # seconds and each kill, made on what is seen in the cache dir, lands at its moment mid-restore.
    with SlowProxy(svc.port, delay=0.02, chunk=16384) as slow:
        for moment, seen in MOMENTS:
            _killed_restore(slow.url, env, cache, moment, seen)
            assert_no_half_file(cache, files)  # whatever was at a final path is whole
            progress.append((len(final_files(cache)), len(temp_files(cache))))
    assert any(0 < n < len(files) for n, _ in progress), f"no kill landed mid-restore: {progress}"
    assert any(t for _, t in progress), f"no kill landed mid-transfer (it leaves a temp file): {progress}"

    rc, report, _, err = restore_cli(svc.url, env)
    assert rc == 0 and report["hit"] and not report["failed"], (report, err)
    assert report["files"] + report["files_present"] == len(files) and report["files_present"] > 0
    assert not temp_files(cache), "the next restore removed the leftovers of the killed ones"
    print(f"after each kill (files at final paths, temp files): {progress}")
    assert_no_half_file(cache, files)
    assert set(final_files(cache)) == set(files)


@pytest.mark.slow
def test_interrupted_restore_then_torch_compile_hits_the_fx_graph_cache(tmp_path, start_service):
    svc = start_service()
    ctr = Container(tmp_path / "containers")
    cold = ctr.run_worker("--model", "mlp", "--name", NAME, "--publish", **svc.client_env())
    assert cold["publish"]["status"] == "committed"
    ctr.restart()
    with SlowProxy(svc.port, delay=0.01, chunk=65536) as slow:  # ~6 MB/s: the 150 MB header takes a while
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[2] / "harness" / "worker.py"),
                                 "--model", "mlp", "--name", NAME, "--restore"],
                                env=ctr.env(**{**svc.client_env(), "CACHESVC_URL": slow.url}),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # the restore under way: its first bytes are in a temp file (the header alone is 150 MB)
        _kill_when(proc, lambda: temp_files(ctr.cache_dir) or temp_files(ctr.tmp), "a temp file of the restore",
                   timeout=180)
    leftovers = temp_files(ctr.cache_dir) + temp_files(ctr.tmp)
    warm = ctr.run_worker("--model", "mlp", "--name", NAME, "--restore", **svc.client_env())
    report = warm["restore"]
    assert report["hit"] and not report["failed"], report
    assert warm["counters"].get("fxgraph_cache_hit", 0) >= 1 and warm["counters"].get("fxgraph_cache_miss", 0) == 0, \
        warm["counters"]
    assert not temp_files(ctr.cache_dir) and not temp_files(ctr.tmp), "leftovers of the killed restore were removed"
    print(f"killed restore left {len(leftovers)} temp file(s); the next restore brought {report['files']} file(s), "
          f"found {report['files_present']} whole; counters {warm['counters']}")
