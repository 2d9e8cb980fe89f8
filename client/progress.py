"""Progress for long transfers: a tqdm bar on a terminal, log lines otherwise.

Log lines carry files, bytes and seconds, every ``interval`` seconds and at
the end, so a container log shows how a restore went.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Optional

from tqdm import tqdm


def human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} GB"


class Progress:
    """Thread-safe counter of files and bytes. Use as a context manager."""

    def __init__(self, what: str, total_files: int, total_bytes: int, log: logging.Logger,
                 interval: float = 5.0, bar: Optional[bool] = None):
        self.what, self.total_files, self.total_bytes, self.log = what, total_files, total_bytes, log
        self.files = self.bytes = 0
        self.interval = interval
        self._lock = threading.Lock()
        self._start = self._last = time.monotonic()
        show_bar = sys.stderr.isatty() if bar is None else bar
        self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc=what, leave=False) if show_bar else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.close()

    def advance(self, files: int, nbytes: int) -> None:
        with self._lock:
            self.files += files
            self.bytes += nbytes
            now = time.monotonic()
            due = now - self._last >= self.interval
            if due:
                self._last = now
        if self._bar is not None:
            self._bar.update(nbytes)
        if due:
            self.log.info("%s: %d/%d files, %s/%s, %.1f s", self.what, self.files, self.total_files,
                          human(self.bytes), human(self.total_bytes), now - self._start)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self._start
