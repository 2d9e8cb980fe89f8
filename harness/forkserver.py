"""A fork server for the suite's simulated containers: torch imported once, each container's process forked from it.

On the suite's 2-core VM a container's process spends most of its CPU importing torch, Dynamo and Inductor
(about 4 of a small model's 5-6 CPU-seconds), and the suite starts about sixty of them. This server imports
them once, then forks a process per request, which takes the container's environment, folders, working
directory and standard streams before it runs the script as ``__main__``. It has compiled nothing, traced
nothing and loaded no cache, so each child starts as cold as a fresh interpreter; what it shares with its
siblings is what the imports computed.

Imports that read the environment are the hazard, so a child is forked only when its environment equals the
server's except for the variables in ``OWN`` (the container's folders, the service's settings, the test's
name: read after the fork), and every value the imports derived from the server's own HOME, TMPDIR or cache
dir is recomputed in the child (``rederive``). The server's folders are made read-only once it has
imported, so a value derived from them that was missed fails a child's write loudly instead of sharing
state; tests/test_fork_server.py scans a child for any trace of them. Processes of a given environment
alternate between two servers with different hash seeds, so a process and the next one (a build and its
restart) hash strings differently, as two fresh interpreters do.

A forked process's own children that run the client's torch-importing entry points (``TRAMPOLINED``: the
package build and check children, the build job's CLI) are forked from the same server too: the child puts
harness/trampoline/ on their PYTHONPATH, whose ``sitecustomize`` hands such a process's argv, environment,
folder and streams to the server and exits as the forked process does (``trampoline``). The server forks it
under the same rule, an environment equal to its own; otherwise the process starts as it would have.

Only the test suite uses it (tests/conftest.py turns it on); benchmarks start every process cold.

    python harness/forkserver.py SOCKET     # serve: print "ready" once imported, fork per request
"""
from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

PRELOAD = ("torch", "torch._dynamo", "torch._inductor.compile_fx")
#: variables a request may set to its own values: nothing the preloaded imports read
SOCKET_VAR = "TEST_FORK_SOCKET"  # a forked process's server, for its children (trampoline)
#: Inductor sets _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR to an address of its own process before it loads a
#: kernel library, which reads it then: a child inherits the parent's, and writes its own before any read.
#: COLUMNS and LINES (pytest sets them while a test runs) are read when a terminal's size is asked for;
#: TRITON_HOME (a simulated container's, tests/helpers/client.py) each time Triton's knob is read.
#: PYTHONDONTWRITEBYTECODE and PYTHONPYCACHEPREFIX the interpreter reads at its start: rederive sets them as a fresh
#: interpreter of the request's environment would have them.
OWN = ("HOME", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "PYTEST_CURRENT_TEST", "DEMO_MODEL_DIR", SOCKET_VAR,
       "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "COLUMNS", "LINES", "TRITON_HOME", "PYTHONDONTWRITEBYTECODE",
       "PYTHONPYCACHEPREFIX")
OWN_PREFIXES = ("CACHESVC_",)
MAX_MESSAGE = 1 << 20
#: ``python -m`` commands a forked process's descendants run forked too: each imports torch first thing
TRAMPOLINED = (("cachesvc_client.one_call.child",), ("cachesvc_client.cli", "build"))
TRAMPOLINE = str(Path(__file__).resolve().parent / "trampoline")  # its sitecustomize.py: trampoline()


class Unavailable(Exception):
    """The server could not take the request (it is gone): start the process cold instead."""


def own(name: str) -> bool:
    """Whether a request may set ``name`` to a value of its own."""
    return name in OWN or name.startswith(OWN_PREFIXES)


def shared(env: Dict[str, str]) -> Dict[str, str]:
    """What of ``env`` must equal the server's: all but its own variables, PYTHONPATH less the trampoline."""
    kept = {k: v for k, v in env.items() if not own(k)}
    path = os.pathsep.join(p for p in kept.pop("PYTHONPATH", "").split(os.pathsep) if p != TRAMPOLINE)
    if path:
        kept["PYTHONPATH"] = path
    return kept


def serve(path: str):
    """Import PRELOAD, then fork a child per request on the socket at ``path``. Returns only in a worker
    child: (request, its three file descriptors); the server itself exits when its parent does."""
    import importlib

    expected = shared(dict(os.environ))
    for name in PRELOAD:
        importlib.import_module(name)
    _freeze_own_folders()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)
    parent = os.getppid()
    print("ready", flush=True)
    while os.getppid() == parent:
        _reap()
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        with conn:
            conn.settimeout(None)
            message, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
            request, why = _request(message, fds, expected)
            print(f"{'refused' if why else 'forked'} {request.get('argv')} {why}", file=sys.stderr, flush=True)
            if why:
                for fd in fds:
                    os.close(fd)
                _answer(conn, {"refused": why})
                continue
            if os.fork() == 0:  # the child that waits for the worker and reports its exit status
                listener.close()
                worker = os.fork()
                if worker == 0:
                    request["socket"] = path
                    return request, fds
                for fd in fds:
                    os.close(fd)
                _report(conn, worker)
            for fd in fds:
                os.close(fd)
    sys.exit(0)


def _request(message: bytes, fds: list, expected: Dict[str, str]) -> Tuple[dict, str]:
    """The request, and why this server cannot fork it (empty: it can)."""
    try:
        request = json.loads(message)
        env, python = shared(request["env"]), request.get("python", sys.executable)
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}, "a malformed request"
    if len(fds) != 3:
        return request, "three streams expected"
    if python != sys.executable:
        return request, f"another interpreter ({python})"
    differ = sorted(k for k in set(env) | set(expected) if env.get(k) != expected.get(k))
    return request, f"another environment ({', '.join(differ[:5])})" if differ else ""


def _answer(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode())
    except OSError:
        pass


def _report(conn: socket.socket, worker: int) -> None:
    """In the waiting child: send the worker's pid, wait for it, send its exit status, exit. A requester that
    goes away first (killed: a trampoline's parent timed it out) takes the worker with it."""
    try:
        conn.sendall(json.dumps({"pid": worker}).encode())
        exited = os.pidfd_open(worker)
        with selectors.DefaultSelector() as selector:
            selector.register(exited, selectors.EVENT_READ)
            selector.register(conn, selectors.EVENT_READ)
            ready = {key.fileobj for key, _ in selector.select()}
        if exited not in ready and not conn.recv(1):  # the requester's end closed: nobody waits for the worker
            _kill(worker)
        _, status = os.waitpid(worker, 0)
        conn.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode())
    finally:
        os._exit(0)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _freeze_own_folders() -> None:
    """The server's HOME, TMPDIR and cache dir, read-only now that the imports made what they make."""
    for name in ("HOME", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR"):
        top = os.environ.get(name)
        if not top or not os.path.isdir(top):
            continue
        for folder, _, _ in os.walk(top):
            os.chmod(folder, 0o555)


def become(request: dict, fds) -> None:
    """In the worker child: take the request's streams, environment and folders, and run its script."""
    import runpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    rederive()
    # its children that start a TRAMPOLINED command come back here (harness/trampoline/sitecustomize.py)
    os.environ[SOCKET_VAR] = request.pop("socket")
    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join([TRAMPOLINE, *(p for p in path if p and p != TRAMPOLINE)])
    sys.harness_forked = True  # what the process imported says nothing here (harness/worker.py's "imported")
    argv = list(request["argv"])
    if argv[0] == "-m":  # python -m MODULE ARGS: argv[0] becomes the module's file, as python's own -m does
        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


#: values the preloaded imports computed from the server's folders: (module, attribute path, how to compute it
#: now). A path's links are read as they are stored (a class's descriptor, not what it answers).
def _rederived():
    import os.path as p

    def header_dir():
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        return p.join(default_cache_dir(), "precompiled_headers")

    def dynamo_cache_prefix():
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return p.join(cache_dir(), "dynamo")

    return [
        ("torch._inductor.codecache", "_HEADER_DIR", header_dir),
        ("torch._inductor.codecache", "_HEADER_LOCK_DIR", lambda: p.join(header_dir(), "locks")),
        ("torch._inductor.wrapper_benchmark", "PROFILE_DIR", tempfile.gettempdir),
        ("torch._inductor.wrapper_benchmark", "PROFILE_PATH",
         lambda: f"{tempfile.gettempdir()}/compiled_module_profile.json"),
        ("torch._dynamo.package", "DynamoCache._path_prefix", dynamo_cache_prefix),
        # where Triton is installed (torch's CUDA builds): its cache, dump and override folders hang off this
        ("triton.knobs", "cache_knobs.home_dir.default", lambda: p.expanduser("~/")),
    ]


def rederive() -> None:
    """Recompute, from this process's environment, what the imports derived from the server's."""
    import inspect
    import site

    tempfile.tempdir = None
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    prefix = os.environ.get("PYTHONPYCACHEPREFIX")
    sys.pycache_prefix = os.path.abspath(prefix) if prefix else None
    site.USER_BASE = site.USER_SITE = None
    user_site = site.getusersitepackages()
    if site.ENABLE_USER_SITE and os.path.isdir(user_site):
        site.addsitedir(user_site)
    for module_name, attribute, compute in _rederived():
        module = sys.modules.get(module_name)
        if module is None:
            continue
        owner_path, _, leaf = attribute.rpartition(".")
        owner = module
        for part in filter(None, owner_path.split(".")):
            owner = inspect.getattr_static(owner, part)
        setattr(owner, leaf, compute())


def trampoline(argv: List[str]) -> None:
    """In a descendant of a forked process, about to run ``python *argv``: where that is a TRAMPOLINED command,
    run it as a child forked from the server that forked the ancestor, and exit as that child exits (a signal
    this process gets is passed on). Returns where it is not one, or the server refuses or is gone: the
    process then starts as it would have."""
    path = os.environ.get(SOCKET_VAR)
    if not path or argv[:1] != ["-m"] or not any(tuple(argv[1:1 + len(cmd)]) == cmd for cmd in TRAMPOLINED):
        return
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(),
                                           "python": sys.executable}).encode()], [0, 1, 2])
        pid = json.loads(conn.recv(MAX_MESSAGE))["pid"]
    except (OSError, ValueError, KeyError):
        conn.close()
        return
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: _signal(pid, number))
    try:
        status = json.loads(conn.recv(MAX_MESSAGE))["status"]
    except (OSError, ValueError, KeyError):
        status = 1
    if status < 0:  # killed by a signal: so is this process
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


# --------------------------------------------------------------------------- the suite's side


class Server:
    """One server process for one environment: its own HOME, TMPDIR and cache dir under ``folder``."""

    def __init__(self, python: str, env: Dict[str, str], folder: Path):
        self.folder = folder
        self.socket = str(folder / "socket")
        own_env = {name: str(folder / name.lower()) for name in ("HOME", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR")}
        for path in own_env.values():
            os.makedirs(path)
        log = folder / "server.log"
        with open(log, "w") as stderr:
            self.process = subprocess.Popen([python, __file__, self.socket], env=dict(env, **own_env),
                                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                            text=True)
        if self.process.stdout.readline().strip() != "ready":
            self.process.wait()
            said = log.read_text()[-3000:]
            self.close()
            raise RuntimeError(f"the fork server did not start (exit {self.process.returncode}):\n{said}")

    def run(self, argv: List[str], env: Dict[str, str], cwd: str, timeout: float) -> subprocess.CompletedProcess:
        """``argv`` (a script and its arguments) run in a forked child, as ``subprocess.run(capture_output=True,
        text=True, timeout=timeout)`` would run ``[python, *argv]``."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        answer: dict = {}
        try:
            conn.connect(self.socket)
            socket.send_fds(conn, [json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()],
                            [stdin, out_w, err_w])
            conn.settimeout(60)
            answer = json.loads(conn.recv(MAX_MESSAGE))
            pid = answer["pid"]
        except (OSError, ValueError, KeyError) as exc:
            conn.close()
            for fd in (out_r, err_r):
                os.close(fd)
            raise Unavailable(f"the server refused: {answer['refused']}" if "refused" in answer else str(exc)) from exc
        finally:
            for fd in (stdin, out_w, err_w):
                os.close(fd)
        deadline = time.monotonic() + timeout
        with conn:
            out, err, timed_out = _read_both(out_r, err_r, deadline, pid)
            if timed_out:
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, out, err)
            conn.settimeout(max(1.0, deadline - time.monotonic()))
            status = json.loads(conn.recv(MAX_MESSAGE))["status"]
        return subprocess.CompletedProcess([sys.executable, *argv], status, out, err)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        for folder, _, _ in os.walk(self.folder):
            os.chmod(folder, 0o755)
        shutil.rmtree(self.folder, ignore_errors=True)


def _read_both(out_fd: int, err_fd: int, deadline: float, pid: int) -> Tuple[str, str, bool]:
    """Both pipes read to their end; past ``deadline`` the worker is killed (the pipes then read to their end)."""
    chunks = {out_fd: [], err_fd: []}
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0 and not timed_out:
                timed_out = True
                _kill(pid)
            for ready, _ in selector.select(timeout=None if timed_out else left):
                data = os.read(ready.fd, 65536)
                if data:
                    chunks[ready.fd].append(data)
                else:
                    selector.unregister(ready.fd)
                    os.close(ready.fd)
    text = {fd: b"".join(parts).decode("utf-8", "replace") for fd, parts in chunks.items()}
    return text[out_fd], text[err_fd], timed_out


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Pool:
    """The servers of this process (a pytest worker): ``each`` per environment (two: a process and the next
    differ in hash seed), taken in turn, for at most ``keep`` environments (the least recently used one's
    servers are stopped)."""

    def __init__(self, keep: int = 2, each: int = 2):
        self.keep, self.each = keep, each
        self.servers: "OrderedDict[tuple, List[Server]]" = OrderedDict()
        self.turns: Dict[tuple, int] = {}
        self.refused: set = set()  # environments whose server did not start: their processes start cold
        self.folder: Optional[Path] = None

    def run(self, python: str, argv: List[str], env: Dict[str, str], cwd: str,
            timeout: float) -> subprocess.CompletedProcess:
        key = (python, tuple(sorted((k, v) for k, v in env.items() if not own(k))))
        server = self._server(key, python, dict(key[1]))
        try:
            return server.run(argv, env, cwd, timeout)
        except Unavailable:
            for gone in self.servers.pop(key):
                gone.close()
            raise

    def _server(self, key: tuple, python: str, env: Dict[str, str]) -> Server:
        """The environment's server whose turn it is; each started at its first turn (an environment seen
        once costs one server, as much as a cold start)."""
        if key in self.refused:
            raise Unavailable("no server starts in this environment")
        if key in self.servers:
            self.servers.move_to_end(key)
        else:
            while len(self.servers) >= self.keep:
                for server in self.servers.popitem(last=False)[1]:
                    server.close()
            self.servers[key], self.turns[key] = [], -1
        turn = self.turns[key] = (self.turns[key] + 1) % self.each
        servers = self.servers[key]
        if turn == len(servers):
            if self.folder is None:
                self.folder = Path(tempfile.mkdtemp(prefix="cachesvc-test-forkserver-"))
            try:
                servers.append(Server(python, env, Path(tempfile.mkdtemp(dir=self.folder))))
            except (OSError, RuntimeError) as exc:
                self.refused.add(key)
                for server in self.servers.pop(key):
                    server.close()
                raise Unavailable(f"the fork server did not start: {exc}") from exc
        return servers[turn]

    def close(self) -> None:
        for servers in self.servers.values():
            for server in servers:
                server.close()
        self.servers.clear()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


if __name__ == "__main__":
    request, descriptors = serve(sys.argv[1])
    del sys.argv[1:]
    become(request, descriptors)
