"""Imported at the start of every Python process a forked container process starts (harness/forkserver.py puts
this folder first on their PYTHONPATH): one that runs a command the fork server forks too is handed to it.

Kept to a check of two values for every other process; forkserver.trampoline says what happens then."""
import os
import sys

if os.environ.get("TEST_FORK_SOCKET") and sys.orig_argv[1:2] == ["-m"]:
    from harness import forkserver

    forkserver.trampoline(sys.orig_argv[1:])
