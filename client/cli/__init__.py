"""The command line, ``cachesvc-client``: restore and publish from init containers and sidecars, check a key,
see what a machine and the service hold.

    commands   the click commands (restore, check, publish, keygen, env, status, ls, stats, build) and their options
    checks     the client's option checks: key tags, torch.compile's keyword arguments (build)
    support    what both command lines share, this one and the service's ``cachesvc``: help, one-line usage
               errors, checked values (``Size``, ``rule``); click and the size units only
    inventory  what a cache dir holds (``status``) and the service's listings (``ls``, ``stats``)

The door is ``main``: the console script (``cachesvc-client = cachesvc_client.cli:main``) and
``python -m cachesvc_client.cli``. It imports the commands when called, so the service's CLI, which
imports ``support`` alone, never loads the client's commands (nor requests, nor the restore).
"""
from __future__ import annotations


def main(argv=None) -> None:
    """The console entry point (``cachesvc-client``): the commands in ``commands``."""
    from .commands import main as run  # here: importing cli.support must not load every command

    run(argv)
