"""Simulated containers: each gets its own empty HOME, TMPDIR and Inductor cache dir.

A restarted container starts with all three empty, so hidden state left on
this machine (``/tmp/torchinductor_<user>``, ``~/.triton``) must not leak in.
``Container.restart()`` moves the old folders aside and gives the next
process fresh empty ones *at the same absolute paths*, exactly as a real
restart of the same image would.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple
from unittest import mock

from harness import forkserver

REPO = Path(__file__).resolve().parent.parent
_DROP = ("TORCHINDUCTOR_", "TRITON_", "CACHESVC_", "TORCH_COMPILE_", "XDG_CACHE_HOME")
#: passed in although _DROP names them: choices of the caller's run, not state left on this machine.
#: TORCHINDUCTOR_VEC_ISA_OK=1 (tests/conftest.py sets it) skips Inductor's CPU-ISA build probes, which
#: a fresh cache dir pays again in every process (about 10 s of g++ on the 2-core CI VM); benchmarks
#: leave it unset, so their cold starts pay the probes as a real container does. It is part of the
#: FX graph key, so every process of a run must see the same value: build a fresh process's
#: environment with inherited_env, never by dropping TORCHINDUCTOR_* by hand.
PASSED = ("TORCHINDUCTOR_VEC_ISA_OK",)


#: set by use_fork_servers(): the suite's containers forked from servers that imported torch once
_FORK_SERVERS: Optional[forkserver.Pool] = None
#: while client_children_forked() is open: the server of this process's environment
CHILDREN_SERVER: Optional[forkserver.Server] = None


def use_fork_servers() -> None:
    """Start this process's containers from fork servers (harness/forkserver.py), where their environment
    allows; the test suite's choice (tests/conftest.py). Benchmarks start every process cold."""
    global _FORK_SERVERS
    if _FORK_SERVERS is None:
        _FORK_SERVERS = forkserver.Pool()
        atexit.register(_FORK_SERVERS.close)


@contextlib.contextmanager
def client_children_forked() -> Iterator[None]:
    """While open, this process's own children that start a forkserver.TRAMPOLINED command (the client's package
    build and check, which a test that compiles in-process starts; ``cachesvc-client build`` run with this
    environment) are forked from a server of this process's environment, as a forked container's are."""
    folder = Path(tempfile.mkdtemp(prefix="cachesvc-test-forkserver-"))
    try:
        server = forkserver.Server(sys.executable, dict(os.environ), folder / "own")
    except (OSError, RuntimeError):  # no server: the children start cold
        shutil.rmtree(folder, ignore_errors=True)
        yield
        return
    global CHILDREN_SERVER
    CHILDREN_SERVER = server
    path = os.pathsep.join(filter(None, [forkserver.TRAMPOLINE, os.environ.get("PYTHONPATH")]))
    try:
        with mock.patch.dict(os.environ, {forkserver.SOCKET_VAR: server.socket, "PYTHONPATH": path}):
            yield
    finally:
        CHILDREN_SERVER = None
        server.close()
        shutil.rmtree(folder, ignore_errors=True)


def inherited_env(drop: Tuple[str, ...] = _DROP) -> Dict[str, str]:
    """This process's environment less the variables whose names start with one of ``drop``, except PASSED."""
    return {k: v for k, v in os.environ.items() if k in PASSED or not k.startswith(drop)}


class Container:
    """``python``: the container's interpreter (default: this one), ``harness``: the folder holding the
    harness/ package its worker runs from (default: this checkout). A wheel installed in a venv of its own,
    with a copy of harness/ outside the checkout, runs with nothing of the checkout importable."""

    def __init__(self, base: Path, name: str = "ctr", token: Optional[str] = None, *, python: str = sys.executable,
                 harness: Path = REPO):
        self.root = Path(base) / name
        self.generation = 0
        # CACHESVC_TOKEN for the container's processes (the only CACHESVC_* passed in); default:
        # this process's, which a running harness.service.ServiceProcess sets to its write token
        self.token = token
        self.python, self.harness = str(python), Path(harness)
        self._make()

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def cache_dir(self) -> Path:
        return self.root / "inductor-cache"

    def _make(self) -> None:
        for d in (self.home, self.tmp, self.cache_dir):
            d.mkdir(parents=True, exist_ok=True)

    def env(self, **extra: str) -> Dict[str, str]:
        env = inherited_env()
        env.update(HOME=str(self.home), TMPDIR=str(self.tmp), TORCHINDUCTOR_CACHE_DIR=str(self.cache_dir),
                   PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.harness), env.get("PYTHONPATH")]))
        token = self.token or os.environ.get("CACHESVC_TOKEN")
        if token:
            env["CACHESVC_TOKEN"] = token
        env.update(extra)
        return env

    def restart(self, keep: bool = False) -> Optional[Path]:
        """Empty the container's folders (same paths). With keep, the old ones move to a sibling and are returned."""
        self.generation += 1
        old = None
        if keep:
            old = self.root.with_name(f"{self.root.name}-gen{self.generation}")
            shutil.rmtree(old, ignore_errors=True)
            self.root.rename(old)
        else:
            shutil.rmtree(self.root)
        self._make()
        return old

    def artifacts(self) -> set:
        """Every publishable file in this container's roots, as ``role:relpath``, resolved from inside it."""
        env = self.env()
        code = ("import json,sys\nfrom cachesvc_client.process import roots\n"
                "print(json.dumps(sorted(r.role + ':' + rel for r in roots.default_roots(sys.argv[1]) "
                "for rel, *_ in roots.walk(r.path, r.exclude))))")
        out = subprocess.run([self.python, "-c", code, env["TORCHINDUCTOR_CACHE_DIR"]], env=env,
                             capture_output=True, text=True, check=True)
        return set(json.loads(out.stdout))

    def run_worker(self, *args: str, timeout: float = 600, cold: bool = False, **extra_env: str) -> dict:
        """Run harness/worker.py in this container; return its RESULT dict (raises with its output on failure).
        ``cold``: a fresh interpreter, never a fork server's child (what the process imports is observed)."""
        return self.run_script("worker.py", *args, timeout=timeout, cold=cold, **extra_env)

    def run_script(self, script: str, *args: str, timeout: float = 600, cold: bool = False, **extra_env: str) -> dict:
        """Run ``harness/<script>`` in this container; return the dict of its last ``RESULT`` line (raises with
        its output on failure)."""
        proc = self.run([str(self.harness / "harness" / script), *args], env=self.env(**extra_env), timeout=timeout,
                        cold=cold)
        return _result(proc.returncode, proc.stdout, proc.stderr)

    def run(self, argv: List[str], env: Dict[str, str], timeout: float = 600, cold: bool = False,
            cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
        """``[python, *argv]`` (a script or ``-m MODULE``, then arguments) run in this container, in ``cwd``, as
        ``subprocess.run(capture_output=True, text=True)`` runs it: forked from a fork server where the suite
        uses them and the environment allows (never with ``cold``), else started as a fresh interpreter."""
        cwd = str(cwd or os.getcwd())
        if _FORK_SERVERS is not None and not cold and self.python == sys.executable and self.harness == REPO:
            try:
                return _FORK_SERVERS.run(self.python, argv, env, cwd, timeout)
            except forkserver.Unavailable:
                pass
        return subprocess.run([self.python, *argv], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)

    def start_worker(self, *args: str, **extra_env: str) -> subprocess.Popen:
        """Start harness/worker.py with ``--linger`` in this container: ``read_result`` it, then ``stop_worker`` it."""
        return subprocess.Popen(self._worker_cmd((*args, "--linger")), env=self.env(**extra_env), text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    @staticmethod
    def read_result(proc: subprocess.Popen) -> dict:
        """The RESULT of a started worker, read while it stays alive (raises with its output if it exits first)."""
        seen = []
        for line in proc.stdout:  # stdout and stderr together
            if line.startswith("RESULT "):
                return _result(0, line, "".join(seen))
            seen.append(line)
        proc.wait()
        return _result(proc.returncode, "".join(seen), "")

    @staticmethod
    def stop_worker(proc: subprocess.Popen, timeout: float = 60) -> int:
        """Let a started worker exit (close its stdin) and return its exit status."""
        proc.stdin.close()
        try:
            return proc.wait(timeout=timeout)
        finally:
            proc.stdout.close()

    def _worker_cmd(self, args) -> list:
        return [self.python, str(self.harness / "harness" / "worker.py"), *args]  # run_script's, for worker.py


def _result(returncode: int, stdout: str, stderr: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            result["stderr"] = stderr[-4000:]
            return result
    raise RuntimeError(f"worker failed ({returncode}):\n{stdout[-3000:]}\n{stderr[-6000:]}")
