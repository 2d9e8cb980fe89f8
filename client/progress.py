"""Progress of a restore or a publish: a tqdm bar on a terminal, a periodic log line otherwise.

Both count the same thing, **bytes on the wire** (as stored: zstd-compressed where that
saved space), which is what takes the time and what the summaries call "transferred"
(restore) and "uploaded" (publish); the items are the restore's files and the publish's
blobs, as their summaries count them. The bar is drawn only when stderr is a terminal;
while it is, log lines of this process go through ``tqdm.write`` (tqdm's logging
redirect), so none is written onto the bar. Without a terminal (an init container, a
CI log) there is no bar: a log line every ``interval`` seconds says how far it got.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from typing import Optional

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from .shared.units import format_size


class Progress:
    """Thread-safe counter of items and wire bytes. Use as a context manager.

    ``what`` ("restore mlp"), ``items`` (the noun: "files" or "blobs"), ``total_items`` and
    ``total_bytes``; ``bytes_bound``: the total is an upper bound that ``adjust_total`` lowers
    as the exact sizes become known (a publish learns each blob's compressed size when it
    compresses it). ``bar``: force the bar on or off (default: stderr is a terminal).
    """

    def __init__(self, what: str, total_items: int, total_bytes: int, log: logging.Logger, *, items: str = "files",
                 interval: float = 5.0, bar: Optional[bool] = None, bytes_bound: bool = False):
        self.what, self.items, self.log, self.interval = what, items, log, interval
        self.total_items, self.total_bytes, self.bytes_bound = total_items, total_bytes, bytes_bound
        self.done_items = self.bytes = 0
        self._lock = threading.Lock()
        self._start = self._last = time.monotonic()
        show_bar = _stderr_is_terminal() if bar is None else bar
        self._bar = (tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1000, leave=False,
                          desc=f"{what} (bytes on the wire)", file=sys.stderr) if show_bar else None)
        self._redirect = contextlib.ExitStack()

    def __enter__(self) -> "Progress":
        if self._bar is not None:
            consoles = [lg for lg in (logging.root, self.log) if _writes_to_console(lg)]
            if consoles:  # a logger given without a console handler would get one (and log twice)
                self._redirect.enter_context(logging_redirect_tqdm(loggers=consoles))
        return self

    def __exit__(self, *exc) -> None:
        self._redirect.close()
        if self._bar is not None:
            self._bar.close()

    def advance(self, items: int, nbytes: int) -> None:
        """``items`` more done and ``nbytes`` more moved (either may be 0)."""
        with self._lock:
            self.done_items += items
            self.bytes += nbytes
            now = time.monotonic()
            due = self._bar is None and now - self._last >= self.interval
            if due:
                self._last = now
            if self._bar is not None:
                if items:  # drawn by the update below
                    self._bar.set_postfix_str(f"{self.done_items}/{self.total_items} {self.items}", refresh=False)
                self._bar.update(nbytes)
        if due:
            self.log.info("%s", self.line(now))

    def adjust_total(self, delta: int) -> None:
        """Change the byte total by ``delta`` (an upper bound meeting the exact size)."""
        with self._lock:
            self.total_bytes += delta
            if self._bar is not None:
                self._bar.total = self.total_bytes
                self._bar.refresh()

    def line(self, now: Optional[float] = None) -> str:
        """``restore mlp: 7/19 files, 9.9 MB of 21.9 MB on the wire, 1.3 s``."""
        total = ("up to " if self.bytes_bound else "") + format_size(self.total_bytes)
        return (f"{self.what}: {self.done_items}/{self.total_items} {self.items}, {format_size(self.bytes)} of "
                f"{total} on the wire, {(now or time.monotonic()) - self._start:.1f} s")

    @property
    def seconds(self) -> float:
        return time.monotonic() - self._start


def _writes_to_console(logger: logging.Logger) -> bool:
    return any(isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr) for h in logger.handlers)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
