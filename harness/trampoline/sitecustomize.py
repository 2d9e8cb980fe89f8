"""Imported at the start of every Python process whose PYTHONPATH starts with this folder (harness/forkserver.py
and harness/containers.py put it there): one that runs a command the fork server forks too is handed to it.

Kept to a check of two values for every other process; forkserver.trampoline says what happens then. The
harness is loaded from its file: at this point of a start, a process's own folder is not yet on sys.path."""
import os
import sys

if os.environ.get("TEST_FORK_SOCKET") and sys.orig_argv[1:2] == ["-m"]:
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "harness_forkserver_trampoline", os.path.join(os.path.dirname(os.path.dirname(__file__)), "forkserver.py"))
    _forkserver = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_forkserver)
    _forkserver.trampoline(sys.orig_argv[1:])
