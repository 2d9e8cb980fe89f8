"""One model's calls per input shape and how each was served, counted on the call path.

``count`` is what a served call pays: a dict lookup and an increment under a lock (the shape's text is
made once, the first time a shape is seen, by the caller's ``describe``). What the reporter sends is the
difference since its last report (``take``); what ``totals`` shows is everything since the start.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Hashable, List, Mapping

#: how a call was served: by the package, by torch.compile (the fallback), by the model itself
SERVED = ("package", "compile", "eager")
#: distinct shapes one model counts in a process; calls of any shape beyond are counted as ``overflow``
MAX_SHAPES = 256


class Tally:
    """Counts for one model (one key family: its name, tags and the client's environment)."""

    def __init__(self, client: Any, name: str, tags: Mapping[str, str]):
        self.client, self.name, self.tags = client, name, dict(tags)
        #: calls of shapes past MAX_SHAPES (not reported: a process that sees that many shapes is not a fleet's)
        self.overflow = 0
        self._lock = threading.Lock()
        #: token -> [shape text, package, compile, eager]: the counts since the start
        self._rows: Dict[Hashable, list] = {}
        #: shape text -> [package, compile, eager] already handed to the reporter
        self._sent: Dict[str, List[int]] = {}

    def count(self, token: Hashable, served: int, describe: Callable[[], str]) -> None:
        """One call of the shape ``token`` stands for (``describe()`` makes its text), served as ``SERVED[served]``."""
        with self._lock:
            row = self._rows.get(token)
            if row is None:
                if len(self._rows) >= MAX_SHAPES:
                    self.overflow += 1
                    return
                row = self._rows[token] = [describe(), 0, 0, 0]
            row[1 + served] += 1

    def totals(self) -> Dict[str, Dict[str, int]]:
        """``{shape: {"package": n, "compile": n, "eager": n}}`` since the start (tokens of one text merged)."""
        with self._lock:
            merged = self._merged()
        return {shape: dict(zip(SERVED, counts)) for shape, counts in merged.items()}

    def take(self) -> Dict[str, List[int]]:
        """The counts since the last ``take`` (shapes with none left out), now counted as reported."""
        with self._lock:
            merged = self._merged()
            new = {}
            for shape, counts in merged.items():
                before = self._sent.get(shape, [0, 0, 0])
                delta = [now - then for now, then in zip(counts, before)]
                if any(delta):
                    new[shape] = delta
                self._sent[shape] = counts
        return new

    def give_back(self, counts: Mapping[str, List[int]]) -> None:
        """Counts ``take`` handed out that did not reach the service: the next ``take`` has them again."""
        with self._lock:
            for shape, delta in counts.items():
                sent = self._sent.get(shape)
                if sent is not None:
                    self._sent[shape] = [max(0, a - b) for a, b in zip(sent, delta)]

    def _merged(self) -> Dict[str, List[int]]:
        merged: Dict[str, List[int]] = {}
        for text, *counts in self._rows.values():
            into = merged.setdefault(text, [0, 0, 0])
            for i, n in enumerate(counts):
                into[i] += n
        return merged


def served_index(how: str) -> int:
    return SERVED.index(how)


__all__ = ["MAX_SHAPES", "SERVED", "Tally", "served_index"]
