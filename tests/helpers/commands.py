"""The `cachesvc` command run in this process, on an app's database and storage, and its one-line errors."""
from __future__ import annotations

import os
from typing import Dict, Optional

from click.testing import CliRunner

from cachesvc.cli import main


def settings_env(app=None, **extra) -> Dict[str, Optional[str]]:
    """The environment of a command run on ``app``'s database and storage (the developer's CACHESVC_* unset)."""
    env: Dict[str, Optional[str]] = {k: None for k in os.environ if k.startswith("CACHESVC_")}
    if app is not None:
        svc = app.extensions["cachesvc"]
        env.update(CACHESVC_DATABASE_URL=svc.settings.DATABASE_URL, CACHESVC_STORAGE_URL=svc.settings.STORAGE_URL,
                   CACHESVC_DATA_DIR=svc.settings.DATA_DIR)
    env.update(extra)
    return env


def cli(env: Dict[str, Optional[str]], *args: str):
    """Run `cachesvc ARGS` in this process; (exit code, stdout, stderr)."""
    result = CliRunner(env=env).invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def assert_one_line(stderr: str, *words: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cachesvc: ") and "Traceback" not in stderr, stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
