"""``CompiledModel``: what ``compile()`` returns; a hit's runner, else torch.compile, and the publish after a miss."""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any, Dict, Mapping, Optional

from . import publisher as publisher_mod, spec as spec_mod, support
from .runner import Runner, live_constants
from ..errors import CacheClientError
from ..fingerprint import shape_signature

log = logging.getLogger("cachesvc_client")


def _options_digest(mode: Optional[str], kwargs: Mapping[str, Any]) -> str:
    text = repr((mode or "default", sorted((k, repr(v)) for k, v in kwargs.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class CompiledModel:
    """What ``compile()`` returns. ``route``: aoti | torch; ``source``: artifact (a hit) | compiled."""

    def __init__(self, model: Any, example_inputs: tuple, *, name: str, mode: Optional[str], client: Any,
                 tags: Optional[Mapping[str, str]], publish: Optional[bool], torch_compile_kwargs: Dict[str, Any]):
        import torch

        from ..client import CacheClient

        self.model, self.example_inputs, self.name, self.mode = model, example_inputs, name, mode
        self.kwargs = torch_compile_kwargs
        self.client = client if client is not None else CacheClient()
        self.device = str(example_inputs[0].device) if example_inputs and isinstance(
            example_inputs[0], torch.Tensor) else "cpu"
        self.shape = shape_signature(*example_inputs)
        self.route, self.route_reason = support.choose_route(example_inputs, torch_compile_kwargs)
        #: reduce-overhead on a GPU: a hit replays the package's run from a CUDA graph (graph.py)
        self.cuda_graph = support.wants_cuda_graph(mode, self.device)
        self.tags = {**dict(tags or {}), "mode": mode or "default", "compile": self.route,
                     "structure": spec_mod.structure_fingerprint(model),
                     "options": _options_digest(mode, torch_compile_kwargs)}
        self.spec = spec_mod.InputSpec(example_inputs, bool(model.training))
        self.source, self.miss_reason, self.report = "compiled", "", None
        self.load_seconds = 0.0
        self._runner: Optional[Runner] = None
        self._compiled: Any = None
        self._logged: set = set()
        #: calls served by the precompiled artifact / by torch.compile
        self.calls = {"artifact": 0, "torch.compile": 0}
        self._publish = bool(self.client.token) if publish is None else publish
        self._publisher: Optional[publisher_mod.Publisher] = None
        self._lock = threading.Lock()
        if self.route == "aoti":
            self._try_artifact()
        if self._runner is None:
            self._restore_snapshot()

    # -- a hit -------------------------------------------------------------------------------------

    def _try_artifact(self) -> None:
        started = time.monotonic()
        report = self.client.restore(self.name, self.shape, self.tags, kind=support.KIND)
        self.report = report
        if not report.hit:
            self.miss_reason = report.reason or "no published artifact for this key"
            return
        why = support.check_host(report.meta, self.device)
        if why is None:
            try:
                self._runner = Runner(report.artifacts[0], live_constants(self.model),
                                                 self.device, cuda_graph=self.cuda_graph)
            except CacheClientError as exc:
                why = exc.message
        if why:
            self.miss_reason = why
            log.warning("cachesvc compile %s: not using the published artifact: %s; compiling", self.name, why)
            return
        self.source, self.load_seconds = "artifact", time.monotonic() - started
        log.info("cachesvc compile %s: loaded the precompiled artifact (version %s) in %.2f s",
                 self.name, report.version_id, self.load_seconds)

    def _restore_snapshot(self) -> None:
        """A miss: bring back the key's snapshot (a previous publish's kernels) so torch.compile hits it.
        Not when the artifact's restore found the service down: a second try would cost the process
        the same wait (a refused connection's seconds, a stalled service's deadline) and log it again."""
        if self.report is not None and self.report.service_down:
            self.snapshot = self.report
            return
        self.snapshot = self.client.restore(self.name, self.shape, self.tags)

    # -- calls -------------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        runner = self._runner
        if runner is not None:
            why = self.spec.mismatch(args, kwargs, self.model) or spec_mod.grad_wanted(args, self.model)
            if why is None:
                self.calls["artifact"] += 1
                return runner(*args)
            self._log_fallback(why)
        first = self._compiled is None
        self.calls["torch.compile"] += 1
        out = self._torch_compiled()(*args, **kwargs)
        if first and self._runner is None and self._publish:
            self._start_publish()
        return out

    def _torch_compiled(self) -> Any:
        if self._compiled is None:
            with self._lock:
                if self._compiled is None:
                    import torch

                    self._compiled = torch.compile(self.model, mode=self.mode, **self.kwargs)
        return self._compiled

    @property
    def capture_seconds(self) -> Optional[float]:
        """How long the hit's CUDA-graph capture took (reduce-overhead on a GPU), once it ran; else None."""
        return self._runner.capture_seconds if self._runner is not None else None

    def _log_fallback(self, why: str) -> None:
        if why not in self._logged:
            self._logged.add(why)
            log.warning("cachesvc compile %s: this call runs torch.compile, not the precompiled artifact: %s",
                        self.name, why)

    # -- publish after a miss ----------------------------------------------------------------------

    def _start_publish(self) -> None:
        try:
            key = self.client.key(self.name, self.shape, self.tags)
        except Exception as exc:  # noqa: BLE001 - e.g. a bad env file: the call's result is still good
            log.warning("cachesvc compile %s: not publishing: %s", self.name, exc)
            return
        self._publisher = publisher_mod.Publisher(self, key)
        # the export here, in the thread that made the first call, not in the background beside later calls
        self._publisher.export()
        self._publisher.start()

    def wait_published(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """Wait for the background publish; return {"snapshot": report dict, "artifact": report dict or error}.

        None when nothing is being published (a hit, no write token, or before the first call).
        """
        return self._publisher.wait(timeout) if self._publisher is not None else None

    def __getattr__(self, attr: str) -> Any:  # model attributes, as torch.compile's OptimizedModule offers
        if attr == "model":
            raise AttributeError(attr)
        return getattr(self.model, attr)
