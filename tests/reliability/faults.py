"""Fault injectors for the reliability tests: a slow TCP proxy, a private PostgreSQL, process kills.

Everything here is a real process or a real socket; nothing patches the code under test.

    SlowProxy(target_port, delay=0.2, chunk=1024)  delays every chunk the server sends
    PrivatePostgres(tmp_dir)                       initdb + pg_ctl on a free port; stop/start under load
    kill_tree(pid)                                 SIGKILL a process and every descendant (gunicorn)
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

from harness.containers import inherited_env
from harness.service import free_port


class SlowProxy:
    """A TCP proxy on a free loopback port in front of ``127.0.0.1:target_port``.

    Bytes from the client go through at once; bytes from the server are sent
    on ``chunk`` at a time with ``delay`` seconds before each, so a transfer
    trickles but never stalls (the case a read timeout cannot catch).
    ``delay=0`` forwards at full speed. Thread per connection; for tests only.
    """

    def __init__(self, target_port: int, delay: float = 0.2, chunk: int = 1024):
        self.target_port, self.delay, self.chunk = target_port, delay, chunk
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = False
        self._socks: List[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name=f"slow-proxy-{self.port}").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._socks += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, 0.0, 65536), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, self.delay, self.chunk), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, delay: float, chunk: int) -> None:
        try:
            while True:
                data = src.recv(chunk)
                if not data:
                    break
                if delay:
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for s in self._socks:
            s.close()

    def __enter__(self) -> "SlowProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def postgres_bin() -> Optional[Path]:
    """The newest PostgreSQL server binaries on this machine (Debian layout), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


class PrivatePostgres:
    """A PostgreSQL cluster of this test's own (initdb in ``root``, a free port), safe to stop and start.

    The machine's shared server stays untouched. PostgreSQL refuses to run as
    root, so as root the commands run as the ``postgres`` user (``su``), in a
    folder of its own under the system temp dir (pytest's are private to root).
    """

    def __init__(self):
        self.bin = postgres_bin()
        if self.bin is None:
            raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql")
        self.root = Path(tempfile.mkdtemp(prefix="cachesvc-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            os.chmod(self.root, 0o755)

    def _run(self, *args: str, timeout: float = 60) -> None:
        cmd = " ".join(str(a) for a in args)
        argv = ["su", "postgres", "-s", "/bin/sh", "-c", cmd] if os.geteuid() == 0 else ["/bin/sh", "-c", cmd]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{cmd} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")

    def init(self) -> "PrivatePostgres":
        self._run(self.bin / "initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync")
        return self.start()

    def start(self) -> "PrivatePostgres":
        opts = f"'-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off'"
        self._run(self.bin / "pg_ctl", "-D", self.data, "-o", opts, "-l", self.root / "log", "-w", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """``fast``: connections are cut (what a restart does to the service); ``immediate``: a crash."""
        self._run(self.bin / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def create_database(self, name: str) -> str:
        self._run(self.bin / "createdb", "-h", "127.0.0.1", "-p", self.port, "-U", "postgres", name)
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def close(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass  # already down
        shutil.rmtree(self.root, ignore_errors=True)


def children(pid: int) -> List[int]:
    """Every descendant of ``pid`` (from /proc), deepest last."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for k in map(int, kids):
            found.append(k)
            todo.append(k)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants at once (a crash of the whole service: gunicorn master and workers)."""
    for p in [pid, *children(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def client_env(base: Dict[str, str], root: Path, **extra: str) -> Dict[str, str]:
    """A process environment of a fresh container rooted at ``root`` (own HOME, TMPDIR, cache dir)."""
    env = inherited_env(("CACHESVC_", "TORCHINDUCTOR_", "TRITON_"))
    for sub in ("home", "tmp", "cache"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(root / "home"), TMPDIR=str(root / "tmp"), TORCHINDUCTOR_CACHE_DIR=str(root / "cache"))
    env.update(base)
    env.update(extra)
    return env
