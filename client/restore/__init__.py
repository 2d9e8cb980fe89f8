"""Restore: a resolved version's files brought into local folders, as plan -> fetch -> place.

    resolve (transport.api) -> plan.py -> fetch.py (download.py per blob) -> place.py
         pipeline.run: the three steps under one deadline, for every kind
         snapshot.restore: kind inductor-dir, into this process's roots
         onefile.fetch: the one-file kinds, into <cache dir>/.cachesvc/artifacts/

``plan`` checks the manifest and decides each file's target (files already in
place are counted, not fetched); ``fetch`` runs the transfers on a thread
pool, each blob streamed through the bounded decoder into a verified temp file
(``download``); ``place`` renames it onto its targets and records what was
placed (``restored.json``), under a file lock. The door is ``pipeline.run``
(and ``snapshot.restore`` for the snapshot kind).
"""
from .pipeline import fetch_into, run
from .plan import Plan
from .snapshot import restore

__all__ = ["Plan", "fetch_into", "restore", "run"]
