"""Processes for the deploy tests: a container's bare environment, and a program whose output is
read line by line while it runs."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.containers import PASSED

BIN = Path(sys.executable).parent
#: One database and storage for tests that exercise a manifest or a recipe, not the backends.
SQLITE_LOCAL = pytest.mark.parametrize("database_url,storage_settings", [("sqlite", "local")], indirect=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Program:
    """A subprocess whose output is collected line by line, to wait for a line or for its exit."""

    def __init__(self, argv, env, cwd=None, **popen):
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     **popen)
        self.lines: list = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None or self._reader.is_alive(), f"exited {self.proc.returncode}: {self.lines}"
            assert time.monotonic() < deadline, f"no {text!r} in {timeout:.0f} s: {self.lines}"
            time.sleep(0.1)

    def wait_for_answer(self, url: str, timeout: float = 120) -> None:
        """Wait until ``url`` answers 200 (a service started by this program), while the program runs."""
        import requests

        deadline = time.monotonic() + timeout
        while True:
            try:
                if requests.get(url, timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.lines}"
            assert time.monotonic() < deadline, f"no 200 from {url} in {timeout:.0f} s: {self.lines}"
            time.sleep(0.2)

    def finish(self, timeout: float = 180) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._reader.join(10)
        self.proc.stdout.close()


def base_env(tmp_path: Path, **extra: str) -> dict:
    """A container's bare environment: PATH with this venv first, its own HOME and TMPDIR, and the run's
    choices every process of it must share (harness.containers.PASSED)."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HOME": str(home), "TMPDIR": str(tmp),
           "USER": "app", "PYTHONDONTWRITEBYTECODE": "1"}
    env.update({name: os.environ[name] for name in PASSED if name in os.environ})
    env.update(extra)
    return env
