"""Run `cachesvc serve` as a real process on a free loopback port (demo, tests, benchmarks)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional

import requests


#: ports tried in turn when another process takes the one picked before `cachesvc serve` binds it
PORT_TRIES = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """``with ServiceProcess(data_dir) as svc: svc.url`` — the embedded default unless env says otherwise.

    Publishing needs a write token, so ``start`` makes one (``cachesvc token create`` on the
    service's database) unless ``write_token=False``. ``python``: the interpreter whose cachesvc runs (default:
    this one); every command runs in ``data_dir``, so ``python -m`` never imports a checkout it was started in. While the service runs, this process's
    ``CACHESVC_TOKEN`` is that token (restored at ``stop``), so clients started from here,
    ``Container``'s included, can publish with no extra step; ``client_env()`` names it explicitly.
    """

    def __init__(self, data_dir: Path, env: Optional[Dict[str, str]] = None, port: Optional[int] = None,
                 workers: int = 2, write_token: bool = True, python: str = sys.executable):
        self.data_dir = Path(data_dir).resolve()
        self.python = str(python)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_env = env or {}
        self.workers = workers
        self.proc: Optional[subprocess.Popen] = None
        self.token: Optional[str] = None  # a write token, when the service requires one
        self.write_token = write_token  # make one at start (`cachesvc token create`): publishing needs it

    def client_env(self) -> Dict[str, str]:
        """What a client process needs to reach this service (URL, and a token when there is one)."""
        env = {"CACHESVC_URL": self.url}
        if self.token:
            env["CACHESVC_TOKEN"] = self.token
        return env

    def start(self, timeout: float = 60) -> "ServiceProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESVC_")}
        env.update(CACHESVC_DATA_DIR=str(self.data_dir), PYTHONUNBUFFERED="1", **self.extra_env)
        if self.write_token and not self.token:
            # token names are unique in a database: services that share one each make their own
            self.token = self._create_token(env, f"demo-{self.port}")
        self.log_path = self.data_dir / "service.log"
        for _ in range(PORT_TRIES):
            if self._serve(env, timeout):
                if self.token:  # clients started from here publish with it (see the class docstring)
                    self._saved_token = os.environ.get("CACHESVC_TOKEN")
                    os.environ["CACHESVC_TOKEN"] = self.token
                return self
            self.port = free_port()  # another process took the port between its pick and the bind
            self.url = f"http://127.0.0.1:{self.port}"
        raise RuntimeError(f"cachesvc serve found its port taken {PORT_TRIES} times:\n{self.log_path.read_text()[-3000:]}")

    def _create_token(self, env: Dict[str, str], name: str) -> str:
        """A write token in the service's database: ``cachesvc token create``'s own code, in this process when
        the service runs this interpreter (it saves a Python start and the server's imports per service), as
        the command otherwise (another venv's cachesvc: the installed wheel's tests)."""
        if self.python == sys.executable:
            from cachesvc import config
            from cachesvc.cli.direct import DirectAdmin

            try:
                admin = DirectAdmin(config.load(environ=env), create=True)
                try:
                    return admin.create_token(name, "write")["token"]
                finally:
                    admin.close()
            except (Exception, SystemExit) as exc:  # the command's failures: one line, and SettingsError exits
                raise RuntimeError(f"cachesvc token create failed: {exc}") from exc
        made = subprocess.run([self.python, "-m", "cachesvc.cli", "token", "create", "--scope", "write",
                               "--name", name], env=env, cwd=self.data_dir, capture_output=True, text=True, timeout=120)
        if made.returncode != 0:
            raise RuntimeError(f"cachesvc token create failed ({made.returncode}):\n{made.stderr[-3000:]}")
        return made.stdout.strip().splitlines()[-1]

    def _serve(self, env: Dict[str, str], timeout: float) -> bool:
        """Start `cachesvc serve` on ``self.port``; True once it answers, False when what answers there is
        another service (the port was free when picked, seconds before the bind: another test's service
        can take it meanwhile, and answer /healthz for ours, which then fails to bind)."""
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.python, "-m", "cachesvc.cli", "serve", "--port", str(self.port), "--workers", str(self.workers)],
            env=env, cwd=self.data_dir, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cachesvc serve exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                if requests.get(self.url + "/healthz", timeout=1).status_code == 200:
                    if self._answers_as_ours():
                        return True
                    self._end_process()
                    return False
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"cachesvc serve did not answer within {timeout} s:\n{self.log_path.read_text()[-3000:]}")

    def _answers_as_ours(self) -> bool:
        """Whether the service on the port is this one: it knows the write token made in its database (without
        one, nothing tells them apart)."""
        if not self.token:
            return True
        got = requests.get(self.url + "/api/v1/entries", headers={"Authorization": f"Bearer {self.token}"},
                           timeout=10)
        return got.status_code != 401

    def stop(self) -> None:
        if self.token and os.environ.get("CACHESVC_TOKEN") == self.token:
            saved = getattr(self, "_saved_token", None)
            if saved is None:
                os.environ.pop("CACHESVC_TOKEN", None)
            else:
                os.environ["CACHESVC_TOKEN"] = saved
        self._end_process()

    def _end_process(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "ServiceProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
