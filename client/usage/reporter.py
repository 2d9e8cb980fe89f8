"""The background reporter: every model's tally sent to its service, batched and bounded, never on a call.

A daemon thread wakes every ``CACHESVC_USAGE_INTERVAL_S`` (60 s), takes what each tally counted since
its last report and sends it, 16 models and 64 shapes per model to a request (the service's limits), with
the client each model was compiled with. A process that exits sends what is left, within
``CACHESVC_USAGE_AT_EXIT_S`` (2 s), so a short-lived process's calls count too.

What goes wrong stays here, one log line per cause: a service that is down or busy (5xx, 429,
unreachable) gets the counts again at the next report, after a longer wait (doubling up to 10 minutes);
a service without the endpoint (an older cachesvc, 404) or a token it refuses (401/403) is not asked
again by this process; a report it calls malformed (4xx) is dropped.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from .. import settings
from ..errors import CacheClientError
from ..process.exits import at_exit
from ..shared import keys
from .tally import SERVED, Tally

log = logging.getLogger("cachesvc_client")

INTERVAL_S = 60.0
#: the shortest wait between reports, whatever is set (a test sets less than a second)
MIN_INTERVAL_S = 0.2
AT_EXIT_S = 2.0
MAX_BACKOFF_S = 600.0
#: the longest time a report says its counts cover (the service's bound)
MAX_WINDOW_S = 86400.0
#: a request's bounds, the service's: models (key families) per report, shapes per model
FAMILIES_PER_REPORT = 16
SHAPES_PER_REPORT = 64
#: models one process reports for (each compile() is one); more are served but not counted
MAX_TALLIES = 64


def _seconds(given: Optional[str], default: float, var: str) -> float:
    try:
        return max(0.0, float(given)) if given is not None else default
    except ValueError:
        log.warning("cachesvc usage: %s=%r is not a number of seconds; using %.0f", var, given, default)
        return default


class Reporter:
    """The process's one reporter (``REPORTER``): ``track`` a model's tally; the rest happens in the background."""

    def __init__(self) -> None:
        self._tallies: List[Tally] = []
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # the thread's flush and the exit's never interleave
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        #: id(client) -> why this process no longer reports to that client's service
        self._refused: Dict[int, str] = {}
        self._backoff = 0.0
        self._since = time.monotonic()
        self._logged: set = set()
        #: requests that reached the service, and counts given back for a later report (tests, logs)
        self.sent = self.retried = 0

    def track(self, client: Any, name: str, tags: Dict[str, str]) -> Optional[Tally]:
        """A tally for one model, reported with ``client``; None when usage is off or there is nowhere to send."""
        if not settings.current().usage or not getattr(client, "url", ""):
            return None
        tally = Tally(client, name, tags)
        with self._lock:
            if len(self._tallies) >= MAX_TALLIES:
                self._once("tallies", "cachesvc usage: this process already counts %d models; %s is not counted",
                           MAX_TALLIES, name)
                return None
            self._tallies.append(tally)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cachesvc-usage", daemon=True)
                self._thread.start()
                at_exit(self._at_exit)
        return tally

    def flush(self, budget: Optional[float] = None) -> None:
        """Send what every tally counted since its last report (``budget``: at most that many seconds)."""
        until = time.monotonic() + budget if budget is not None else None
        with self._flushing:
            seconds, self._since = time.monotonic() - self._since, time.monotonic()
            with self._lock:
                tallies = list(self._tallies)
            for client, pieces in _by_client(tallies, self._refused):
                self._send_all(client, pieces, seconds, until)

    # -- the thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            interval = _seconds(settings.current().usage_interval, INTERVAL_S, settings.USAGE_INTERVAL_VAR)
            self._wake.wait(max(interval, self._backoff, MIN_INTERVAL_S))
            self._wake.clear()
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - statistics: never the serving process's trouble
                self._once(("thread", type(exc)), "cachesvc usage: a report failed: %s: %s", type(exc).__name__, exc)

    def _at_exit(self) -> None:
        budget = _seconds(settings.current().usage_at_exit, AT_EXIT_S, settings.USAGE_AT_EXIT_VAR)
        if budget > 0:
            try:
                self.flush(budget)
            except Exception as exc:  # noqa: BLE001 - an exiting process is not stopped by statistics
                log.info("cachesvc usage: the last report failed: %s: %s", type(exc).__name__, exc)

    # -- sending ---------------------------------------------------------------------------------------

    def _send_all(self, client: Any, pieces: List[Tuple[Tally, dict, Dict[str, List[int]]]], seconds: float,
                  until: Optional[float]) -> None:
        batches = _batches(pieces)
        for at, batch in enumerate(batches):
            left = None if until is None else until - time.monotonic()
            if left is not None and left <= 0.05:
                self._give_back(batches[at:])
                return
            try:
                client.report_usage([report for _, report, _ in batch], seconds=min(seconds, MAX_WINDOW_S), timeout=left)
            except CacheClientError as exc:
                if not self._failed(client, exc):
                    self._give_back(batches[at:])
                    return
                continue
            self.sent += 1
            self._backoff = 0.0

    def _failed(self, client: Any, exc: CacheClientError) -> bool:
        """Handle a refused report; True when its counts are dropped (the next batch may still go)."""
        status = exc.status
        if status is None or status >= 500 or status == 429:
            interval = _seconds(settings.current().usage_interval, INTERVAL_S, settings.USAGE_INTERVAL_VAR)
            self._backoff = min(MAX_BACKOFF_S, max(interval, self._backoff * 2 or interval))
            self._once(("busy", status), "cachesvc usage: the service cannot take the report now (%s); counts are "
                       "kept for the next one, in %.0f s", exc.message, self._backoff)
            return False
        if status in (401, 403, 404):
            self._refused[id(client)] = exc.message
            why = ("the service has no usage endpoint (a cachesvc older than this client)" if status == 404
                   else "the service refuses this token")
            log.warning("cachesvc usage: not reporting the shapes served to %s: %s (%s)", client.url, why, exc.message)
            return True
        self._once(("refused", status), "cachesvc usage: the service refused a report, dropped: %s", exc.message)
        return True

    def _give_back(self, batches: List[list]) -> None:
        for batch in batches:
            for tally, _, counts in batch:
                tally.give_back(counts)
                self.retried += 1

    def _once(self, cause: Any, message: str, *args: Any) -> None:
        if cause not in self._logged:
            self._logged.add(cause)
            log.warning(message, *args)


def _by_client(tallies: List[Tally], refused: Dict[int, str]) -> List[Tuple[Any, list]]:
    """``[(client, [(tally, report, counts)...])]``: what each client's service is to be sent, one report per
    model and at most SHAPES_PER_REPORT shapes (a model with more makes several)."""
    grouped: Dict[int, Tuple[Any, list]] = {}
    for tally in tallies:
        if id(tally.client) in refused:
            continue
        family = _family(tally)
        counts = tally.take() if family is not None else {}
        shapes = sorted(counts.items(), key=lambda item: -sum(item[1]))
        for at in range(0, len(shapes), SHAPES_PER_REPORT):
            part = dict(shapes[at:at + SHAPES_PER_REPORT])
            report = {"key": family, "shapes": [{"shape": shape, "served": dict(zip(SERVED, n))}
                                                for shape, n in part.items()]}
            grouped.setdefault(id(tally.client), (tally.client, []))[1].append((tally, report, part))
    return list(grouped.values())


def _batches(pieces: list) -> List[list]:
    return [pieces[at:at + FAMILIES_PER_REPORT] for at in range(0, len(pieces), FAMILIES_PER_REPORT)]


def _family(tally: Tally) -> Optional[dict]:
    """The model's key without its shape (name, tags, the client's environment), made once; None when the
    environment cannot be read (that model is then not reported, with one log line)."""
    family = getattr(tally, "family", None)
    if family is None and not getattr(tally, "family_failed", False):
        try:
            family = {"name": keys.check_name(tally.name), "tags": keys.check_tags(tally.tags),
                      "env": keys.check_env(tally.client.environment())}
        except Exception as exc:  # noqa: BLE001 - e.g. a bad env file: the model is served, not reported
            tally.family_failed = True
            log.warning("cachesvc usage: not reporting %s: %s", tally.name, getattr(exc, "message", exc))
            return None
        tally.family = family
    return family


REPORTER = Reporter()
