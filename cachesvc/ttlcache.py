"""A small in-process cache whose values live a fixed number of seconds (token lookups, presigned URLs)."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Hashable, Optional


class TTLCache:
    """``get_or_make(key, make)``: a value made less than ``ttl`` seconds ago, or a fresh one from ``make()``.

    ``put`` and ``get_or_make`` take a ``ttl`` of their own for that value. At
    most ``size`` values are kept (least recently used go first). A ``ttl`` <= 0
    caches nothing. ``make`` runs outside the lock, so two threads may both make
    a value for a new key (the last one stays); a ``make`` that raises caches
    nothing. Thread-safe.
    """

    def __init__(self, ttl: float, size: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self.ttl, self.size, self._clock = float(ttl), size, clock
        self._items: "OrderedDict[Hashable, tuple[float, Any]]" = OrderedDict()  # key -> (deadline, value)
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Optional[Any]:
        """The live value for ``key``, or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            if self._clock() >= item[0]:
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return item[1]

    def put(self, key: Hashable, value: Any, ttl: Optional[float] = None) -> None:
        ttl = self.ttl if ttl is None else ttl
        if ttl <= 0:
            return
        with self._lock:
            self._items[key] = (self._clock() + ttl, value)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get_or_make(self, key: Hashable, make: Callable[[], Any], ttl: Optional[float] = None) -> Any:
        value = self.get(key)
        if value is None:
            value = make()
            self.put(key, value, ttl)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
