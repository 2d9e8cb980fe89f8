"""What a restore that did not hit is: a key, the service or its storage, this container's disk, a bug in the
client, or the process exiting under it; and what a required hit says when there is none."""
from __future__ import annotations

import logging
import sys

from .. import settings
from ..settings import REQUIRE_HIT_VAR  # noqa: F401 - named here too (the CLI and the one call import it from here)
from ..shared import keys
from ..errors import CacheClientError, Forbidden, HitRequired, ServiceUnavailable, Unauthorized
from ..report import RestoreReport

log = logging.getLogger("cachesvc_client")

def service_down(exc: BaseException) -> bool:
    """The restore failed at the service or its storage, not at the key: no or a malformed URL, nothing
    answering, 5xx or a deadline (ServiceUnavailable), or a token it refused."""
    return isinstance(exc, (ServiceUnavailable, Unauthorized, Forbidden)) or getattr(exc, "code", "") == "bad_url"


def why(exc: BaseException) -> str:
    """A failed restore's reason. CacheClientError: its message; InvalidKey: the name, shape or tags the
    caller gave, or (EnvError) the deployment's env file or variables; OSError: the container's own disk
    (full, read-only); anything else is a bug in this client, named as one (the log has the traceback)."""
    if isinstance(exc, CacheClientError):
        return exc.message
    if isinstance(exc, keys.InvalidKey):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc}"
    return f"unexpected {type(exc).__name__} in cachesvc-client (a bug; please report it): {exc}"




def require_hit_from_env() -> bool:
    """``$CACHESVC_REQUIRE_HIT`` is 1, true or yes (any case): a restore that misses must fail."""
    return settings.current().require_hit


def required(report: RestoreReport) -> str:
    return f"a hit is required (require_hit or ${REQUIRE_HIT_VAR}) and {report.summary()}"


def exiting(exc: BaseException) -> bool:
    """Whether ``exc`` is the interpreter shutting down under a restore still in flight (a short-lived process
    that exits during the one call's background snapshot restore): its thread pools refuse new work."""
    import concurrent.futures.thread as pools

    if sys.is_finalizing():
        return True
    # "cannot schedule new futures after [interpreter] shutdown": the pools' exit hook has run
    return isinstance(exc, RuntimeError) and "cannot schedule new futures" in str(exc) and \
        bool(getattr(pools, "_shutdown", False))


def failed(exc: Exception, report: RestoreReport, *, require: bool) -> RestoreReport:
    """A restore that raised ``exc``: logged, and the miss ``report`` returned (HitRequired when required).
    A restore cut short by the process exiting is not a failure: one debug line."""
    if exiting(exc):
        log.debug("cachesvc restore of %s stopped: the process is exiting (%s)", report.name, exc)
        report.reason = "stopped: the process is exiting"
        return report
    log.warning("cachesvc restore of %s failed (a miss): %s", report.name, why(exc),
                exc_info=not isinstance(exc, (CacheClientError, OSError, keys.InvalidKey)))
    if require:
        raise HitRequired(required(report), report) from exc
    return report
