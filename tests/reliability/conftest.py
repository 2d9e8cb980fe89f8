"""Fixtures of the reliability tests: services as real processes, an S3 server of the test's own.

    own_s3        an rclone S3 server for this test alone (tests stop and start it)
    start_service start_service(name, env, workers=2) -> a running `cachesvc serve` process; all stopped at the end

The files these tests publish and restore, and the checks of a restored cache dir, are
``tests.helpers.restores`` (the client tests use them too: a test file imports no conftest).
"""
from __future__ import annotations

from typing import Callable, Dict, Iterator, List

import pytest

from harness.s3server import S3Server
from harness.service import ServiceProcess


@pytest.fixture
def own_s3(tmp_path) -> Iterator[S3Server]:
    server = S3Server(tmp_path / "s3").start()
    yield server
    server.stop()


@pytest.fixture
def start_service(tmp_path) -> Iterator[Callable[..., ServiceProcess]]:
    started: List[ServiceProcess] = []

    def start(name: str = "svc", env: Dict[str, str] = None, workers: int = 2) -> ServiceProcess:
        svc = ServiceProcess(tmp_path / name, env=env or {}, workers=workers)
        started.append(svc)
        return svc.start()

    yield start
    for svc in reversed(started):
        svc.stop()
