"""The suite's fork servers (harness/forkserver.py): a container's process forked from a server that imported
torch once is as cold as a fresh interpreter, sees only its own folders, and reports as subprocess.run does.

If a torch upgrade derives another value from the server's folders at import, the scan below names it:
add it to forkserver._rederived."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness import forkserver
from harness.containers import Container

PROBE = textwrap.dedent('''
    import gc, json, os, sys, tempfile
    import torch
    import torch._dynamo.package as package
    import torch._inductor.codecache as codecache
    from torch._dynamo.utils import counters

    server = sys.argv[1]  # the server's folder: no value this process holds may lie under it
    found = set()
    for obj in gc.get_objects():
        try:
            items = obj.items() if isinstance(obj, dict) else (
                vars(obj).items() if hasattr(obj, "__dict__") and not isinstance(obj, type) else ())
            for key, value in items:
                if isinstance(value, str) and value.startswith(server + os.sep):
                    found.add(f"{type(obj).__name__}.{key} = {value}")
        except Exception:
            pass
    fn = torch.compile(lambda x: (x * 2).sin() + 1)
    y = fn(torch.ones(8))
    print("RESULT " + json.dumps({
        "found": sorted(found), "tmp": tempfile.gettempdir(), "header_dir": codecache._HEADER_DIR,
        "dynamo_cache": package.DynamoCache._path_prefix, "hash": hash("same text"), "cwd": os.getcwd(),
        "argv": sys.argv[1:], "main": __name__, "forked": getattr(sys, "harness_forked", False),
        "frames": dict(counters["stats"]), "y": y.tolist(), "home": os.path.expanduser("~"),
        "triton_cache": sys.modules["triton.knobs"].cache.dir if "triton.knobs" in sys.modules else None}))
''')


@pytest.fixture(scope="module")
def pool():
    made = forkserver.Pool()
    yield made
    made.close()


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("probe") / "probe.py"
    path.write_text(PROBE)
    return str(path)


def _run(pool, ctr: Container, argv, timeout=300, **extra):
    return pool.run(sys.executable, argv, ctr.env(**extra), str(ctr.root), timeout)


def _result(done) -> dict:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])


def _files(folder: Path) -> set:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _entries(cache_dir: Path) -> set:
    """The cache dir's files, an FX graph or AOTAutograd entry by its key (its folder)."""
    keyed = ("fxgraph", "aotautograd")
    return {str(p.parent if p.relative_to(cache_dir).parts[0] in keyed else p).replace(str(cache_dir), "")
            for p in cache_dir.rglob("*") if p.is_file()}


def test_a_forked_child_holds_nothing_of_the_servers_folders_and_compiles_as_a_cold_process(pool, probe, tmp_path):
    hello = tmp_path / "hello.py"
    hello.write_text("print('hello')\n")
    for turn in range(pool.each):  # each server starts at its first turn
        assert _run(pool, Container(tmp_path, f"first-{turn}"), [str(hello)]).stdout == "hello\n"
    folder = str(pool.folder)
    server_files = {str(s.folder): _files(s.folder) for servers in pool.servers.values() for s in servers}
    ctr, cold_ctr = Container(tmp_path, "forked"), Container(tmp_path, "cold")
    forked = _result(_run(pool, ctr, [probe, folder]))
    cold = _result(subprocess.run([sys.executable, probe, folder], env=cold_ctr.env(), cwd=cold_ctr.root,
                                  capture_output=True, text=True, timeout=300))
    assert forked["forked"] and not cold["forked"]
    assert forked["found"] == [], forked["found"]  # every value derived from a folder is the child's own
    assert forked["tmp"] == str(ctr.tmp) and forked["home"] == str(ctr.home) and forked["cwd"] == str(ctr.root)
    assert forked["header_dir"].startswith(str(ctr.tmp) + os.sep)
    assert forked["dynamo_cache"] == str(ctr.cache_dir / "dynamo")
    assert forked["triton_cache"] in (None, str(ctr.home / ".triton" / "cache"))  # where torch brings Triton
    assert forked["triton_cache"] == cold["triton_cache"].replace(str(cold_ctr.home), str(ctr.home)) \
        if cold["triton_cache"] else forked["triton_cache"] is None
    assert forked["main"] == "__main__" and forked["argv"] == [folder]
    # as cold as a fresh interpreter: the same trace, the same outputs, the same cache files written
    assert forked["frames"] == cold["frames"] and forked["frames"].get("unique_graphs") == 1, forked["frames"]
    assert forked["y"] == cold["y"]
    # (the FX graph and AOTAutograd entries' own names hash their bytes, timings included: their keys compared)
    assert _entries(ctr.cache_dir) == _entries(cold_ctr.cache_dir) and _entries(ctr.cache_dir)
    # nothing was written under the servers' folders by their children (they are read-only: a miss would fail)
    assert {str(s.folder): _files(s.folder) for servers in pool.servers.values() for s in servers} == server_files


def test_it_reports_as_subprocess_run_does(pool, tmp_path):
    script = tmp_path / "speak.py"
    script.write_text("import sys\nprint('out', sys.argv[1])\nprint('err', file=sys.stderr)\nsys.exit(3)\n")
    done = _run(pool, Container(tmp_path), [str(script), "x y"])
    assert (done.returncode, done.stdout, done.stderr) == (3, "out x y\n", "err\n")
    failing = tmp_path / "fail.py"
    failing.write_text("raise ValueError('no such thing')\n")
    done = _run(pool, Container(tmp_path, "failing"), [str(failing)])
    assert done.returncode == 1 and "ValueError: no such thing" in done.stderr


def test_a_child_writes_bytecode_as_its_own_environment_says(pool, tmp_path):
    """PYTHONDONTWRITEBYTECODE and PYTHONPYCACHEPREFIX are read when an interpreter starts: a forked child takes the
    request's, as a fresh interpreter of that environment would (tests/e2e/test_one_call_proof.py's containers write
    no bytecode; scripts/_venv.sh may keep the run's under .venv/pycache)."""
    script = tmp_path / "bytecode.py"
    script.write_text("import json, sys\nprint(json.dumps([sys.dont_write_bytecode, sys.pycache_prefix]))\n")
    keys = set()
    for extra, expected in (({"PYTHONDONTWRITEBYTECODE": "1"}, [True, None]),
                            ({"PYTHONPYCACHEPREFIX": str(tmp_path / "pyc")}, [False, str(tmp_path / "pyc")]),
                            ({}, [False, None])):
        ctr = Container(tmp_path, f"c{len(extra)}{sorted(extra)}")
        env = {k: v for k, v in ctr.env(**extra).items() if k in extra or not k.startswith("PYTHON") or k in (
            "PYTHONPATH", "PYTHONUNBUFFERED")}
        keys.add(tuple(sorted((k, v) for k, v in env.items() if not forkserver.own(k))))
        forked = pool.run(sys.executable, [str(script)], env, str(ctr.root), 60)
        cold = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert json.loads(forked.stdout) == json.loads(cold.stdout) == expected, (extra, forked.stderr)
    assert len(keys) == 1  # one environment's servers, whose own values are neither: each child's are its request's


def test_a_child_past_its_timeout_is_killed(pool, tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)\n")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        _run(pool, Container(tmp_path), [str(script)], timeout=3)
    assert time.monotonic() - started < 60
    pid = int(caught.value.output.split()[0])
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the timed-out child {pid} is still running")


def test_two_children_in_a_row_hash_differently_as_two_interpreters_do(pool, tmp_path):
    script = tmp_path / "hash.py"
    script.write_text("print('RESULT', '{\"hash\": %d}' % hash('same text'))\n")
    hashes = [_result(_run(pool, Container(tmp_path, f"c{i}"), [str(script)]))["hash"] for i in range(2)]
    assert hashes[0] != hashes[1]


def test_another_environment_gets_its_own_servers_and_a_gone_server_means_a_cold_start(tmp_path):
    script = tmp_path / "env.py"
    script.write_text("import json, os, sys\nprint('RESULT ' + json.dumps({'v': os.environ.get('TORCH_SHOW_CPP_"
                      "STACKTRACES'), 'forked': getattr(sys, 'harness_forked', False)}))\n")
    pool = forkserver.Pool(keep=1, each=1)
    try:
        ctr = Container(tmp_path)
        assert _result(_run(pool, ctr, [str(script)], TORCH_SHOW_CPP_STACKTRACES="1")) == {"v": "1", "forked": True}
        first = list(pool.servers)
        assert _result(_run(pool, ctr, [str(script)], TORCH_SHOW_CPP_STACKTRACES="0")) == {"v": "0", "forked": True}
        assert list(pool.servers) != first and len(pool.servers) == 1  # a variable torch reads: other servers
        for servers in pool.servers.values():
            for server in servers:
                server.process.kill()
                server.process.wait()
        with pytest.raises(forkserver.Unavailable):
            _run(pool, ctr, [str(script)], TORCH_SHOW_CPP_STACKTRACES="0")
        assert not pool.servers
    finally:
        pool.close()


def test_the_containers_run_cold_when_asked_and_then_say_what_they_imported(tmp_path):
    script = tmp_path / "imports.py"
    script.write_text("import json, sys\nprint('RESULT ' + json.dumps({'torch': 'torch' in sys.modules}))\n")
    ctr = Container(tmp_path)
    done = ctr.run([str(script)], ctr.env(), cold=True)
    assert _result(done) == {"torch": False}


def test_an_environment_whose_server_does_not_start_runs_cold(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    pool = forkserver.Pool()
    try:
        ctr = Container(tmp_path)
        broken = ctr.env(PYTHONPATH=str(tmp_path / "broken"))  # its torch does not import
        (tmp_path / "broken" / "torch").mkdir(parents=True)
        (tmp_path / "broken" / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
        for _ in range(2):  # refused at once the second time: no second server is tried
            with pytest.raises(forkserver.Unavailable, match="no torch here|no server starts"):
                pool.run(sys.executable, [str(script)], broken, str(tmp_path), 60)
        assert not pool.servers
        done = ctr.run([str(script)], broken)  # the container's own path: a cold start, which needs no torch
        assert done.returncode == 0 and done.stdout == "hello\n"
    finally:
        pool.close()


#: a forked container process that starts one of the client's children as the client does
PARENT = textwrap.dedent('''
    import json, os, subprocess, sys, time
    child = [sys.executable, "-m", "cachesvc_client.one_call.child", *sys.argv[1:]]
    if sys.argv[1] == "check":  # GIVEN is a fifo nobody writes: the child waits in torch.load until killed
        proc = subprocess.Popen(child, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(float(os.environ["WAIT"]))
        proc.kill()
        proc.wait()
        print("RESULT " + json.dumps({"killed": proc.returncode}))
    else:
        done = subprocess.run(child, capture_output=True, text=True)
        print("RESULT " + json.dumps({"status": done.returncode, "err": done.stderr}))
''')


def _served(pool, verdict: str = "forked") -> list:
    """The argv (and, refused, why) of every request the pool's servers forked or refused, from their logs."""
    return [line.split(" ", 1)[1] for servers in pool.servers.values() for server in servers
            for line in (server.folder / "server.log").read_text().splitlines() if line.startswith(verdict + " ")]


def test_a_forked_processs_client_child_is_forked_too_and_reports_as_itself(pool, tmp_path):
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT)
    got = _result(_run(pool, Container(tmp_path), [str(parent), "no-such-verb"]))
    assert got == {"status": 2, "err": "unknown verb 'no-such-verb': build | check\n"}
    assert any("cachesvc_client.one_call.child" in argv and "no-such-verb" in argv for argv in _served(pool))


def test_a_forked_child_whose_starter_is_killed_goes_with_it(pool, tmp_path):
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT)
    fifo = tmp_path / "given.fifo"
    os.mkfifo(fifo)
    got = _result(_run(pool, Container(tmp_path), [str(parent), "check", "p.pt2", str(fifo), "back.pt", "cpu"],
                       WAIT="5"))
    assert got == {"killed": -9}
    assert any(str(fifo) in argv for argv in _served(pool)), "the check child was not forked"
    time.sleep(1)
    with pytest.raises(OSError):  # ENXIO: nobody has the fifo open to read, so the forked child is gone
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_child_in_another_environment_is_not_forked(pool, tmp_path):
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT.replace("capture_output=True, text=True)",
                                     "capture_output=True, text=True, env=dict(os.environ, TORCH_LOGS='-all'))"))
    got = _result(_run(pool, Container(tmp_path), [str(parent), "other-env-verb"]))
    assert got["status"] == 2 and "unknown verb 'other-env-verb'" in got["err"]
    child = "cachesvc_client.one_call.child"
    assert not any(child in argv and "other-env-verb" in argv for argv in _served(pool))
    assert any(child in said and "another environment (TORCH_LOGS)" in said for said in _served(pool, "refused"))


def test_a_client_child_of_the_test_process_is_forked_from_its_own_server():
    """tests/conftest.py's client_children_forked: the package build a test that compiles in-process starts."""
    from harness import containers

    if containers.CHILDREN_SERVER is None:
        pytest.skip("the fork servers are off (TEST_FORK_SERVERS=0)")
    done = subprocess.run([sys.executable, "-m", "cachesvc_client.one_call.child", "own-server-verb"],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (2, "unknown verb 'own-server-verb': build | check\n")
    log = (containers.CHILDREN_SERVER.folder / "server.log").read_text()
    assert any(line.startswith("forked ") and "own-server-verb" in line for line in log.splitlines()), log
