"""``CacheClient``: the public entry point of the client library."""
from __future__ import annotations

import logging
import os
import sys
import tempfile
from typing import Any, Dict, Mapping, Optional, Sequence

from . import artifacts, keys, roots as roots_mod
from .errors import CacheClientError
from .fingerprint import environment
from .http import ServiceAPI
from .publish import publish as _publish
from .report import PublishReport, RestoreReport
from .restore import restore as _restore

log = logging.getLogger("cachesvc_client")


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


class CacheClient:
    """Publish and restore torch.compile state through a cachesvc service.

    Args:
        url: the service, default ``$CACHESVC_URL``.
        token: bearer token, default ``$CACHESVC_TOKEN``.
        cache_dir: Inductor's cache dir, default ``$TORCHINDUCTOR_CACHE_DIR``, else torch's own default.
        timeout: seconds to reach the service and resolve a key (restore) or make one API call (publish).
        stall_timeout: seconds a blob transfer may go without a byte before it is abandoned.
        workers: parallel transfers.

    Thread-safe; keep one per process.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, cache_dir: Optional[str] = None,
                 *, timeout: float = 30.0, stall_timeout: float = 30.0, workers: int = 16):
        self.url = url or os.environ.get("CACHESVC_URL", "")
        self.token = token or os.environ.get("CACHESVC_TOKEN") or None
        self._cache_dir_given = cache_dir or os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        self.cache_dir = os.path.abspath(self._cache_dir_given or roots_mod.default_cache_dir())
        self.timeout, self.stall_timeout, self.workers = timeout, stall_timeout, workers
        self._api: Optional[ServiceAPI] = None

    @property
    def api(self) -> ServiceAPI:
        if self._api is None:
            self._api = ServiceAPI(self.url, self.token, timeout=self.timeout)
        return self._api

    def key(self, name: str, shape: str, tags: Optional[Mapping[str, str]] = None,
            env: Optional[Mapping[str, str]] = None) -> dict:
        """The full cache key for this process (environment fingerprint included), validated."""
        return {"name": keys.check_name(name), "shape": keys.check_shape(shape), "tags": keys.check_tags(tags),
                "env": keys.check_env(env if env is not None else environment())}

    def restore(self, name: str, shape: str, tags: Optional[Mapping[str, str]] = None, *, strict: bool = False,
                env: Optional[Mapping[str, str]] = None, kind: str = keys.DEFAULT_KIND,
                load: bool = False) -> RestoreReport:
        """Fetch the newest version of this key and ``kind`` into the cache dir (and the other roots).

        ``kind`` inductor-dir (default) restores the folder snapshot; the other kinds
        (``keys.KINDS``) fetch their one file under ``<cache dir>/.cachesvc/artifacts/`` and list it in
        ``report.artifacts``, with the version's metadata in ``report.meta``. With ``load=True`` a
        mega-cache is then loaded (torch.compiler.load_cache_artifacts; ``report.loaded`` says what);
        a precompiled kind is loaded with ``cachesvc_client.load_precompiled(report)``.
        Returns a RestoreReport; ``report.hit`` says whether anything was restored (and loaded).
        On service or storage trouble, or a blob torch cannot load, it logs a warning and returns a
        miss, so the process compiles cold; with ``strict=True`` it raises CacheClientError instead.
        Sets ``TORCHINDUCTOR_CACHE_DIR`` to the restored dir when it was unset.
        """
        key = self.key(name, shape, tags, env)
        keys.check_kind(kind)
        if load and kind != "mega-cache":
            raise ValueError(f"load=True loads a mega-cache; load a {kind} with cachesvc_client.load_precompiled")
        try:
            if kind == keys.DEFAULT_KIND:
                report = _restore(self.api, key, self.cache_dir, workers=self.workers, timeout=self.timeout,
                                  stall_timeout=self.stall_timeout)
            else:
                report = artifacts.fetch(self.api, key, kind, self.cache_dir, workers=self.workers,
                                         timeout=self.timeout, stall_timeout=self.stall_timeout)
            if load and report.hit:
                self._use_cache_dir()
                report.loaded = artifacts.load_mega_cache(report.artifacts[0])
        except CacheClientError as exc:
            if strict:
                raise
            log.warning("cachesvc restore of %s failed, compiling cold: %s", name, exc.message)
            return RestoreReport(hit=False, name=name, shape=shape, reason=f"error: {exc.message}", kind=kind)
        self._use_cache_dir()
        log.info("%s", report.summary())
        for warning in report.warnings:
            log.warning("cachesvc restore: %s", warning)
        if report.failed:
            log.warning("cachesvc restore left out %d file(s); first: %s", len(report.failed), report.failed[0])
        if strict and not report.hit:
            raise CacheClientError(report.summary(), code="miss")
        return report

    def _use_cache_dir(self) -> None:
        """Point torch at the dir restored into, unless the caller chose one."""
        if not self._cache_dir_given:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = self.cache_dir

    def publish(self, name: str, shape: str, tags: Optional[Mapping[str, str]] = None, *,
                compile_seconds: Optional[float] = None, env: Optional[Mapping[str, str]] = None,
                roots: Optional[Dict[str, str]] = None) -> PublishReport:
        """Snapshot this process's compile state and publish it under the key.

        ``compile_seconds`` defaults to the compile time torch recorded in this process.
        ``roots`` (role -> folder) replaces the default roots (for tests and special layouts).
        Raises CacheClientError subclasses on failure; nothing is half-published.
        """
        key = self.key(name, shape, tags, env)
        root_list = (roots_mod.with_exclusions(roots_mod.Root(role, path) for role, path in roots.items())
                     if roots is not None else roots_mod.default_roots(self.cache_dir))
        report = _publish(self.api, key, root_list, workers=min(self.workers, 8),
                          compile_seconds=_compile_seconds(compile_seconds))
        log.info("%s", report.summary())
        return report

    def publish_mega_cache(self, name: str, shape: str, tags: Optional[Mapping[str, str]] = None, *,
                           compile_seconds: Optional[float] = None,
                           env: Optional[Mapping[str, str]] = None) -> PublishReport:
        """Publish this process's Mega-Cache (torch.compiler.save_cache_artifacts()) as a mega-cache version.

        Call it after the compiles to share. Raises Unsupported when torch lacks the API,
        CacheClientError when there is nothing to save or the publish fails.
        """
        key = self.key(name, shape, tags, env)
        data, counts = artifacts.save_mega_cache()
        meta = dict(artifacts.artifact_meta("mega-cache"),
                    contents=",".join(f"{t}={n}" for t, n in sorted(counts.items())))
        with tempfile.TemporaryDirectory(prefix="cachesvc-mega-") as tmp:
            path = os.path.join(tmp, artifacts.FILENAMES["mega-cache"])
            with open(path, "wb") as f:
                f.write(data)
            report = artifacts.publish_file(self.api, key, "mega-cache", path, meta, workers=min(self.workers, 8),
                                            compile_seconds=_compile_seconds(compile_seconds))
        log.info("%s", report.summary())
        return report

    def publish_precompiled(self, name: str, shape: str, path: str, kind: str,
                            tags: Optional[Mapping[str, str]] = None, *, example_inputs: Sequence[Any] = (),
                            device: str = "", compile_seconds: Optional[float] = None,
                            env: Optional[Mapping[str, str]] = None) -> PublishReport:
        """Publish a precompiled artifact file (``kind`` aot-function or pt2-package) with its metadata.

        Make the file with ``cachesvc_client.precompile_function`` / ``precompile_package`` (or torch's
        own APIs). ``example_inputs`` (stored as their ``shape_signature``) and ``device`` describe what
        it was compiled for; they go into the version's metadata with the torch version, which
        ``load_precompiled`` checks with the device (torch's own guards check the inputs).
        """
        if kind not in artifacts.PRECOMPILED:
            raise ValueError(f"kind must be one of {', '.join(artifacts.PRECOMPILED)}, got {kind!r}")
        key = self.key(name, shape, tags, env)
        meta = artifacts.artifact_meta(kind, example_inputs, device)
        report = artifacts.publish_file(self.api, key, kind, path, meta, workers=min(self.workers, 8),
                                        compile_seconds=_compile_seconds(compile_seconds))
        log.info("%s", report.summary())
        return report
