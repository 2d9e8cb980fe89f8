"""The usage reports' flood limit: at most ``CACHESVC_USAGE_REPORTS_PER_MINUTE`` reports a minute per sender.

A sender is a token (its id), or the client's address for an anonymous report. Each sender has a token
bucket of that many reports, refilled at that many a minute: a burst of the whole minute's reports at
once, then one report every 60/limit seconds. In memory, per process: each gunicorn worker and each
replica counts on its own, so a fleet-wide limit is the setting times their number. Behind a proxy that
does not pass the client's address (``cachesvc serve`` with nginx), anonymous senders share the proxy's.
"""
from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from typing import Callable, Optional, Tuple

from ..errors import RateLimited

#: senders tracked at once; the least recently seen is forgotten first (it then starts with a full bucket,
#: which only ever lets a report in that would have waited)
MAX_SENDERS = 4096


class ReportLimiter:
    """Per-sender token buckets. Thread-safe: one lock around a few dict operations a call. Memory is
    bounded by ``max_senders`` buckets of two floats."""

    def __init__(self, max_senders: int = MAX_SENDERS, clock: Callable[[], float] = time.monotonic):
        self._buckets: "OrderedDict[str, Tuple[float, float]]" = OrderedDict()  # sender -> (tokens, at)
        self._max_senders = max_senders
        self._clock = clock
        self._lock = threading.Lock()

    def admit(self, sender: str, per_minute: int) -> Optional[float]:
        """Count a report of ``sender`` and return None when it may go ahead; otherwise count nothing and
        return the seconds until one may. ``per_minute`` 0 or less: no limit."""
        if per_minute <= 0:
            return None
        rate = per_minute / 60.0
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.pop(sender, (float(per_minute), now))
            tokens = min(float(per_minute), tokens + (now - at) * rate)
            wait = None if tokens >= 1.0 else (1.0 - tokens) / rate
            self._buckets[sender] = (tokens - 1.0 if wait is None else tokens, now)  # the newest at the end
            while len(self._buckets) > self._max_senders:
                self._buckets.popitem(last=False)
            return wait

    def __len__(self) -> int:
        with self._lock:
            return len(self._buckets)


def check_rate(limiter: ReportLimiter, sender: str, per_minute: int) -> None:
    """Count a report of ``sender``; raise RateLimited (429, ``Retry-After`` in whole seconds) when it is one
    too many. A refused report is not counted, so a sender that waits as told gets in."""
    wait = limiter.admit(sender, per_minute)
    if wait is not None:
        retry_after = max(1, math.ceil(wait))
        raise RateLimited(f"too many usage reports from this sender: at most {per_minute} a minute "
                          f"(CACHESVC_USAGE_REPORTS_PER_MINUTE); send again in {retry_after} s",
                          {"retry_after": retry_after}, headers={"Retry-After": str(retry_after)})
