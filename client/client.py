"""``CacheClient``: the public entry point of the client library."""
from __future__ import annotations

import atexit
import logging
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import onefile, settings, usage
from .process import envfiles, keyenv, roots as roots_mod, torch_fixes
from .shared import keys, signing
from .check import CheckReport, check as _check
from .errors import CacheClientError, HitRequired
from .process.fingerprint import environment
from .publish.onefile import publish_file
from .publish.keying import keying_warnings
from .publish.snapshot import admit, own_roots, publish as _publish
from .report import PublishReport, RestoreReport
from .restore.onefile import fetch as _fetch
from .restore.snapshot import restore as _restore
from .transport import CONNECT_TIMEOUT, ServiceAPI
from .verdicts import REPORTED, Verdict, judge, record_verdict, stamped_report

log = logging.getLogger("cachesvc_client")
#: marks the log record of a report's summary: `cachesvc-client` prints the summary itself, on stdout, and drops it
SUMMARY = {"cachesvc_summary": True}


def torch_compile_seconds() -> Optional[float]:
    """Seconds torch.compile spent in this process, as torch itself recorded them (None if unknown)."""
    utils = sys.modules.get("torch._dynamo.utils")
    metrics = getattr(utils, "compilation_time_metrics", None) if utils else None
    if not metrics:
        return None
    values = metrics.get("_compile.compile_inner")
    return round(sum(values), 3) if values else None


def _compile_seconds(given: Optional[float]) -> Optional[float]:
    return given if given is not None else torch_compile_seconds()


from .restore.outcome import (REQUIRE_HIT_VAR, failed as _failed, require_hit_from_env,  # noqa: E402,F401
                              required as _required, service_down as _service_down, why as _why)


def _published(report: PublishReport, *more_warnings: Optional[str]) -> PublishReport:
    """Log a published state's report, with the settings that key it apart (``keying_warnings``)."""
    report.warnings = keying_warnings() + [w for w in more_warnings if w]
    log.info("%s", report.summary(), extra=SUMMARY)
    for warning in report.warnings:
        log.warning("cachesvc publish: %s", warning)
    return report


class CacheClient:
    """Publish and restore torch.compile state through a cachesvc service.

    Args:
        url: the service, default ``$CACHESVC_URL``.
        token: bearer token, default ``$CACHESVC_TOKEN``.
        cache_dir: Inductor's cache dir, default ``$TORCHINDUCTOR_CACHE_DIR``, else torch's own default.
        timeout: seconds to resolve a key (restore) or make one API call (publish), however the
            service answers (a server that trickles its answer is cut off).
        connect_timeout: seconds all attempts to connect may take: a service that refuses or cannot
            be reached costs this much (default 1.5 s), not ``timeout``.
        stall_timeout: seconds a blob transfer may go without a byte before it is abandoned.
        workers: parallel transfers.
        budget: seconds a whole restore may take; past it, transfers still running are cut off
            and what they would have brought is left out (a miss if nothing was restored).
        env_file: the key's environment from this file (``cachesvc-client env --json`` in the app
            image), default ``$CACHESVC_ENV_FILE``; for processes without torch or a GPU
            (``cachesvc_client.process.keyenv``). Unset: this process reads its own (``environment()``).
        trusted_keys: a file of OpenSSH ssh-ed25519 public keys, default ``$CACHESVC_TRUSTED_KEYS``: restore
            and check place only versions signed by one of them (``cachesvc_client.shared.signing``; read at each
            restore, so a rotated Secret takes effect). Unset: signatures are not required.

    Thread-safe; keep one per process.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, cache_dir: Optional[str] = None,
                 *, timeout: float = 30.0, stall_timeout: float = 30.0, workers: int = 16,
                 budget: Optional[float] = 300.0, env_file: Optional[str] = None,
                 connect_timeout: float = CONNECT_TIMEOUT, trusted_keys: Optional[str] = None):
        given = settings.current()  # the environment as it is now: a later change is read by the next client
        self.url = url or given.url
        self.token = token or given.token
        self._cache_dir_given = cache_dir or given.tool("TORCHINDUCTOR_CACHE_DIR")
        self.cache_dir = os.path.abspath(self._cache_dir_given or roots_mod.default_cache_dir())
        self.timeout, self.stall_timeout, self.workers, self.budget = timeout, stall_timeout, workers, budget
        self.env_file = env_file or given.env_file
        self.connect_timeout = connect_timeout
        self.trusted_keys = trusted_keys or given.trusted_keys
        self._api: Optional[ServiceAPI] = None
        self.last_restore: Optional[RestoreReport] = None
        self._said_nearest: Optional[tuple] = None  # the miss whose nearest entries the log named last

    @property
    def api(self) -> ServiceAPI:
        """The service's API client. Raises CacheClientError (naming it) for a missing or malformed URL."""
        if self._api is None:
            self._api = ServiceAPI(self.url, self.token, timeout=self.timeout, connect_timeout=self.connect_timeout)
        return self._api

    def environment(self) -> Dict[str, str]:
        """The environment this client's keys use: the env file (if any) under the ``CACHESVC_ENV_<FIELD>``
        overrides, else this process's ``environment()``. Raises keyenv.EnvError naming the file or variable."""
        return keyenv.key_environment(self.env_file, environment)[0]

    def key(self, name: str, shape: str, tags: Optional[Mapping[str, str]] = None,
            env: Optional[Mapping[str, str]] = None) -> dict:
        """The full cache key for this process (environment fingerprint included), validated."""
        return {"name": keys.check_name(name), "shape": keys.check_shape(shape), "tags": keys.check_tags(tags),
                "env": keys.check_env(env if env is not None else self.environment())}

    def restore(self, name: str, shape: str, tags: Optional[Mapping[str, str]] = None, *, strict: bool = False,
                env: Optional[Mapping[str, str]] = None, fallbacks: Sequence[str] = (),
                fallback_max_bytes: Optional[int] = None, verify_at_exit: bool = False,
                kind: str = keys.DEFAULT_KIND, load: bool = False, require_hit: Optional[bool] = None,
                extra_roots: Optional[Mapping[str, str]] = None) -> RestoreReport:
        """Fetch the newest version of this key and ``kind`` into the cache dir (and the other roots).

        Returns a RestoreReport; ``report.hit`` says whether anything was restored.
        On a miss, ``report.nearest`` names the closest entries and the key fields that
        differ (also logged). ``fallbacks`` lists steps tried in order when the exact key
        has no version: ``shape`` (same key, any shape), ``shapes`` (the most restored
        shapes, up to ``fallback_max_bytes``), ``name`` (same environment, any name);
        ``report.fallback`` names the step that answered. ``verify_at_exit`` runs
        ``verify()`` when the process exits and logs its verdict. ``kind`` inductor-dir (default) restores
        the folder snapshot; the other kinds (``keys.KINDS``) fetch their one file under ``<cache dir>/.cachesvc/
        artifacts/``, listed in ``report.artifacts``, its metadata in ``report.meta``. With ``load=True`` a
        mega-cache is then loaded (torch.compiler.load_cache_artifacts; ``report.loaded`` says what);
        a precompiled kind is loaded with ``cachesvc_client.load_precompiled(report)``.
        On service or storage trouble, or a blob torch cannot load, it logs a warning and returns a
        miss, so the process compiles cold; with ``strict=True`` it raises CacheClientError instead.
        ``start_restore`` runs it in the background before torch is imported.
        Sets ``TORCHINDUCTOR_CACHE_DIR`` to the restored dir when it was unset. ``env`` replaces the
        key's environment (default: ``self.environment()``; a bad env file is a miss, unless strict).
        ``require_hit`` (default ``$CACHESVC_REQUIRE_HIT``: 1, true or yes): a miss of any kind, an
        error or a refused signature included, raises HitRequired naming why (its ``report`` is the miss),
        so a rollout stops instead of serving cold. With trusted keys (``trusted_keys``), a version not
        signed by one of them is a miss before anything is written (``report.refused``).
        ``extra_roots`` (role -> folder, with ``$CACHESVC_EXTRA_ROOTS``): where extra roots go (``roots``).
        """
        keys.check_kind(kind)
        if load and kind != "mega-cache":
            raise ValueError(f"load=True loads a mega-cache; load a {kind} with cachesvc_client.load_precompiled")
        torch_fixes.apply()  # patches torch where it needs it, when torch is imported: client/process/torch_fixes.py
        started = time.monotonic()
        require = require_hit_from_env() if require_hit is None else require_hit
        try:
            key = self.key(name, shape, tags, env)  # EnvError (the deployment's env file or variables): a miss
            report = self._restore(key, kind, fallbacks=fallbacks, fallback_max_bytes=fallback_max_bytes, load=load,
                                   extra=roots_mod.extra_roots(extra_roots))  # InvalidKey: a miss naming it
        except Exception as exc:  # noqa: BLE001 - a cache never breaks the process it serves
            if strict:
                raise
            return _failed(exc, RestoreReport(hit=False, name=name, shape=shape, reason=f"error: {_why(exc)}",
                                              kind=kind, seconds=time.monotonic() - started,
                                              service_down=_service_down(exc)), require=require)
        self._use_cache_dir()
        self._explain_key(report, key, env_given=env is not None)
        self.last_restore = report
        if verify_at_exit:
            atexit.register(self.verify)
        log.info("%s", report.summary(nearest=self._first_to_name_nearest(report)), extra=SUMMARY)
        for warning in report.warnings:
            log.warning("cachesvc restore: %s", warning)
        if report.failed:
            log.warning("cachesvc restore left out %d file(s); first: %s", len(report.failed), report.failed[0])
        if strict and not report.hit:
            raise CacheClientError(report.summary(), code="miss")
        if require and not report.hit:
            raise HitRequired(_required(report), report)
        return report

    def _first_to_name_nearest(self, report: RestoreReport) -> bool:
        """False when the previous miss of this client, for the same key, named these very nearest entries
        (the one call restores its package and then its snapshot: one list in the log, not two)."""
        said = (report.name, report.shape, tuple(sorted(report.tags.items())),
                tuple((c.get("entry") or {}).get("id") for c in report.nearest[:3])) if report.nearest else None
        first = said is None or said != self._said_nearest
        self._said_nearest = said
        return first

    def _explain_key(self, report: RestoreReport, key: dict, *, env_given: bool) -> None:
        """Put the key and where its environment came from in ``report``; on a miss that only fields this
        process could not read explain (no torch, no GPU), add a warning that says how to fix it."""
        report.tags, report.env = key["tags"], key["env"]
        report.env_file = "" if env_given else (self.env_file or "")
        hint = None if report.hit else keyenv.unreadable_hint(report.env, report.env_file or None, report.nearest)
        if hint:
            report.warnings.append(hint)

    def _restore(self, key: dict, kind: str, *, fallbacks: Sequence[str], fallback_max_bytes: Optional[int],
                 load: bool, extra: Dict[str, str]) -> RestoreReport:
        trust = self.trust()
        if kind == keys.DEFAULT_KIND:
            report = _restore(self.api, key, self.cache_dir, workers=self.workers, timeout=self.timeout,
                              stall_timeout=self.stall_timeout, budget=self.budget, fallbacks=fallbacks,
                              fallback_max_bytes=fallback_max_bytes, trust=trust, extra_roots=extra)
        else:
            report = _fetch(self.api, key, kind, cache_dir=self.cache_dir, workers=self.workers,
                            timeout=self.timeout, stall_timeout=self.stall_timeout, budget=self.budget, trust=trust)
        if load and report.hit:
            self._use_cache_dir()
            report.loaded = onefile.load_mega_cache(report.artifacts[0])
        return report

    def check(self, name: str, shape: str, tags: Optional[Mapping[str, str]] = None, *,
              env: Optional[Mapping[str, str]] = None, kind: str = keys.DEFAULT_KIND,
              require_hit: Optional[bool] = None) -> CheckReport:
        """Will ``restore()`` of this key hit here? Resolves without downloading or writing anything and without
        counting as a restore (``cachesvc_client.check``): hit or miss with the restore's own reason (a refused
        signature included), the entry, version and bytes a restore would move; for a miss the nearest entry's
        differing fields and whether its version would pass ``trusted_keys``. Raises keys.InvalidKey /
        keyenv.EnvError for a bad key or env file, CacheClientError when the service cannot answer."""
        key = self.key(name, shape, tags, env)
        keys.check_kind(kind)
        return _check(self.api, key, kind=kind, trust=self.trust(),
                     require_hit=require_hit_from_env() if require_hit is None else require_hit,
                     deadline=time.monotonic() + self.timeout)

    def trust(self) -> Optional[signing.Trust]:
        """The trusted keys, read now from ``trusted_keys`` (None: signatures not required). A file that
        cannot be read, or no ``cryptography``, gives a Trust that refuses every version."""
        return signing.Trust.from_file(self.trusted_keys) if self.trusted_keys else None

    def verify(self, report: Optional[RestoreReport] = None, *, send: bool = True,
               first_call_seconds: Optional[float] = None) -> Verdict:
        """After the process compiled: did the restore (default: this client's last, else the last one into
        the cache dir, as an init container's) pay off?

        Reads torch's cache counters and the new files in the roots (see ``cachesvc_client.verdicts``),
        logs the verdict and, with ``send``, reports ``paid_off``/``partial``/``no_hits`` to the
        service, which marks versions whose restores get no hits as problems. ``first_call_seconds``
        (default: the compile time torch recorded in this process, i.e. what the restored compile
        still cost) goes with it, so the service counts the compile seconds the restore saved
        against the publisher's cold compile. Never raises on service trouble: the verdict comes back
        with ``reported=False``.
        """
        verdict = judge(report or self.last_restore or stamped_report(self.cache_dir), self.cache_dir)
        (log.warning if verdict.verdict == "no_hits" else log.info)("%s", verdict.summary())
        if send and verdict.verdict in REPORTED:
            try:
                spent = first_call_seconds if first_call_seconds is not None else torch_compile_seconds()
                self.report_verdict(verdict.versions, verdict.verdict, fallback=verdict.fallback,
                                    first_call_seconds=spent)
                verdict.reported = True
            except CacheClientError as exc:
                log.warning("cachesvc verify: could not report the verdict: %s", exc.message)
        record_verdict(self.cache_dir, verdict)  # for `cachesvc-client status`
        return verdict

    def report_verdict(self, versions: Sequence[int], verdict: str, *, fallback: str = "",
                       first_call_seconds: Optional[float] = None) -> None:
        """Tell the service how restores of ``versions`` paid off (``paid_off``, ``partial`` or ``no_hits``), as
        ``verify()`` does; ``first_call_seconds``: what the first call still cost here. The one call reports
        a package's hit through it. Raises CacheClientError when the service cannot take it."""
        self.api.verdict({"versions": list(versions), "verdict": verdict, "fallback": fallback,
                          **({"first_call_seconds": first_call_seconds} if first_call_seconds is not None else {})})

    def report_usage(self, reports: Sequence[Mapping[str, Any]], *, seconds: Optional[float] = None,
                     timeout: Optional[float] = None) -> dict:
        """``POST /api/v1/usage``, as the one call's reporter sends it (usage/reporter.py). Raises CacheClientError."""
        body = {"reports": list(reports), **({"seconds": round(seconds, 3)} if seconds is not None else {})}
        return self.api.usage(body, time.monotonic() + timeout if timeout is not None else None)

    def demand(self, name: str, tags: Optional[Mapping[str, str]] = None, *,
               env: Optional[Mapping[str, str]] = None) -> List[Dict[str, Any]]:
        """The shapes the fleet called ``name`` with here (``GET /api/v1/demand``), busiest first, of the key family
        whose tags are ``tags`` (None: all, merged): ``usage.demand_rows``. Raises CacheClientError."""
        env = keys.check_env(env if env is not None else self.environment())
        answer = self.api.demand({"name": keys.check_name(name), **env, "limit": 256})
        return usage.demand_rows(answer, keys.check_tags(tags) if tags is not None else None)

    def packages(self, name: str, tags: Mapping[str, str], *, env: Optional[Mapping[str, str]] = None,
                 limit: int = 64) -> List[str]:
        """The shapes of the key family's (name, tags, here) entries with a package (``GET /api/v1/entries``),
        most restored first. Raises CacheClientError."""
        env = keys.check_env(env if env is not None else self.environment())
        answer = self.api.entries(name=keys.check_name(name), tags=keys.canonical_tags(keys.check_tags(tags)),
                                  kind="pt2-package", sort="most_restored", limit=limit, **env)
        return usage.package_shapes(answer)

    def start_restore(self, name: str, shape: str, tags: Optional[Mapping[str, str]] = None, *,
                      strict: bool = False, require_hit: Optional[bool] = None) -> "Future[RestoreReport]":
        """``restore()`` in a background thread, so it overlaps ``import torch`` and building the model.

        Call it before importing torch: the key's environment comes from files
        (``envfiles``), not from torch. ``shape`` must then be known without the
        inputs (``shape_signature`` of them gives the same text). Wait for the
        future (``.result()``) before the first compiled call. Where only torch
        can tell the environment, the thread imports it (no overlap, same key). With an env file
        (``env_file``, ``$CACHESVC_ENV_FILE``) the key comes from it and nothing is probed.
        """
        env = None if self.env_file else envfiles.environment()  # None: restore() reads the file or torch
        future: "Future[RestoreReport]" = Future()

        def run() -> None:
            try:
                future.set_result(self.restore(name, shape, tags, strict=strict, env=env, require_hit=require_hit))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)

        future.set_running_or_notify_cancel()
        threading.Thread(target=run, name=f"cachesvc-restore-{name}", daemon=True).start()
        return future

    def _use_cache_dir(self) -> None:
        """Point torch at the dir restored into, unless the caller chose one."""
        if not self._cache_dir_given:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = self.cache_dir

    def publish(self, name: str, shape: str, tags: Optional[Mapping[str, str]] = None, *,
                compile_seconds: Optional[float] = None, env: Optional[Mapping[str, str]] = None,
                roots: Optional[Dict[str, str]] = None, min_compile_seconds: Optional[float] = None,
                merge: bool = True, extra_roots: Optional[Mapping[str, str]] = None,
                meta: Optional[Mapping[str, str]] = None) -> PublishReport:
        """Snapshot this process's compile state and publish it under the key.

        ``compile_seconds`` defaults to the compile time torch recorded in this process.
        ``roots`` (role -> folder) replaces the default roots (for tests and special layouts).
        ``extra_roots`` (role -> folder; "" for a known one's own folder) adds roots to them, as
        ``$CACHESVC_EXTRA_ROOTS`` does (``roots.extra_roots``: FlashInfer's, DeepGEMM's, torch extensions').
        Admission: when ``compile_seconds`` is under ``min_compile_seconds`` (default
        ``$CACHESVC_MIN_COMPILE_SECONDS``, else 0) nothing is sent (status ``skipped``,
        ``admitted=False``); content the service holds under another key is linked (status
        ``linked``), not uploaded. ``merge`` unions with the key's newest version (see
        ``cachesvc_client.publish.snapshot.publish``). ``meta`` adds to the version's metadata (string values up to
        1,000 characters; a restore's ``report.meta``).
        Raises CacheClientError subclasses on failure; nothing is half-published.
        """
        key = self.key(name, shape, tags, env)
        if compile_seconds is None:
            compile_seconds = torch_compile_seconds()
        if min_compile_seconds is None:
            min_compile_seconds = float(settings.current().min_compile_seconds or 0)
        why = admit(compile_seconds, min_compile_seconds)
        if why:
            report = PublishReport(status="skipped", name=name, shape=shape, admitted=False, reason=why)
            log.info("%s", report.summary(), extra=SUMMARY)
            return report
        left_out: list = []
        if roots is not None:  # chosen by the caller: published as given
            root_list = roots_mod.with_exclusions(roots_mod.Root(role, path) for role, path in
                                                  {**roots, **roots_mod.extra_roots(extra_roots)}.items())
        else:  # never a neighbour's files: the host's shared default folders stay out (own_roots)
            root_list, left_out = own_roots(roots_mod.default_roots(self.cache_dir, roots_mod.extra_roots(extra_roots)))
        report = _publish(self.api, key, root_list, workers=min(self.workers, 8), compile_seconds=compile_seconds,
                          merge=merge, meta=dict(meta) if meta else None)
        return _published(report, keyenv.disagreement(key["env"], self.env_file if env is None else None), *left_out)

    def publish_mega_cache(self, name: str, shape: str, tags: Optional[Mapping[str, str]] = None, *,
                           compile_seconds: Optional[float] = None,
                           env: Optional[Mapping[str, str]] = None) -> PublishReport:
        """Publish this process's Mega-Cache (torch.compiler.save_cache_artifacts()) as a mega-cache version.

        Call it after the compiles to share. Raises Unsupported when torch lacks the API,
        CacheClientError when there is nothing to save or the publish fails.
        """
        key = self.key(name, shape, tags, env)
        data, counts = onefile.save_mega_cache()
        meta = dict(onefile.artifact_meta("mega-cache"),
                    contents=",".join(f"{t}={n}" for t, n in sorted(counts.items())))
        with tempfile.TemporaryDirectory(prefix="cachesvc-mega-") as tmp:
            path = os.path.join(tmp, onefile.FILENAMES["mega-cache"])
            with open(path, "wb") as f:
                f.write(data)
            report = publish_file(self.api, key, "mega-cache", path=path, meta=meta, workers=min(self.workers, 8),
                                  compile_seconds=_compile_seconds(compile_seconds))
        return _published(report)

    def publish_precompiled(self, name: str, shape: str, path: str, kind: str,
                            tags: Optional[Mapping[str, str]] = None, *, example_inputs: Sequence[Any] = (),
                            device: str = "", compile_seconds: Optional[float] = None,
                            env: Optional[Mapping[str, str]] = None,
                            meta: Optional[Mapping[str, str]] = None) -> PublishReport:
        """Publish a precompiled artifact file (``kind`` aot-function or pt2-package) with its metadata.

        Make the file with ``cachesvc_client.precompile_function`` / ``precompile_package`` (or torch's
        own APIs). ``example_inputs`` (stored as their ``shape_signature``) and ``device`` describe what
        it was compiled for; they go into the version's metadata with the torch version, which
        ``load_precompiled`` checks with the device (torch's own guards check the inputs). ``meta`` adds to
        that metadata (string values up to 1,000 characters; a restore's ``report.meta``), as for ``publish``.
        """
        if kind not in onefile.PRECOMPILED:
            raise ValueError(f"kind must be one of {', '.join(onefile.PRECOMPILED)}, got {kind!r}")
        key = self.key(name, shape, tags, env)
        made = dict(onefile.artifact_meta(kind, example_inputs, device), **(meta or {}))
        report = publish_file(self.api, key, kind, path=path, meta=made, workers=min(self.workers, 8),
                              compile_seconds=_compile_seconds(compile_seconds))
        log.info("%s", report.summary(), extra=SUMMARY)
        return report

