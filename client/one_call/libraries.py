"""cuDNN, which a hit's package calls for its convolutions, made ready beside the proof.

A process's first convolution on a GPU creates cuDNN's handle and loads its kernels; a restart's first call
paid that inside the package's first run, as eager's first call does (ResNet-50 on an H100, 2026-12-06:
``phases["first_run"]`` 0.33-0.39 s). The package calls cuDNN through torch's C shim, and its wrapper names the
call (``aoti_torch_cuda_convolution``). So while compile() loads the proof (Python, in the calling thread), a
thread runs one tiny convolution in each of the model's floating dtypes on the package's device; torch lets go
of the GIL inside it, so the two overlap (first run 0.18 s, the thread done within the proof). The tiny calls
read nothing of the model and write nothing it holds: they cannot change an output. The first served call
waits for the thread first (a bounded wait): a CUDA graph's capture must not see another thread's allocations.

Only convolutions: the same warm-up of cuBLAS (a tiny matmul) and of the attention kernels made a decoder's
first call slower, not faster (Llama-family bf16: the thread ran 0.7-0.9 s, the first call waited 0.4-0.6 s
for it and its run still took 0.65-0.84 s, against 0.92-0.96 s without; the first call 1.46-1.77 s against
1.31-1.40 s): the kernels a decoder's first run loads are its own shapes', which a tiny call does not load.
``CACHESVC_LIBRARY_WARMUP=0`` turns it off.
"""
from __future__ import annotations

import logging
import re
import threading
import time
import zipfile
from typing import Any, Callable, Dict, FrozenSet, Iterable, Optional

log = logging.getLogger("cachesvc_client")
#: how long the first served call waits for the libraries' thread (it has run beside the proof since compile())
JOIN_S = 10.0
#: the wrapper's calls into torch's C shim for a device (``aoti_torch_cuda_<op>``); a device-generic one is
#: ``aoti_torch_<op>``, e.g. ``aoti_torch_mm_out``
_CALL = re.compile(rb"aoti_torch_(?:cuda_)?(_?[a-z][a-z0-9_]*)\(")
#: which library a wrapper's op needs, by the op's name
_KINDS = {"convolution": ("convolution", "_convolution", "cudnn_convolution")}


def kinds_called(package: str) -> FrozenSet[str]:
    """The library kinds (``_KINDS``' keys) the package's wrapper calls; empty when it cannot be read."""
    names = set()
    try:
        with zipfile.ZipFile(package) as archive:
            for member in archive.namelist():
                if member.endswith(".cpp") and "/aotinductor/" in f"/{member}":
                    names.update(m.decode() for m in _CALL.findall(archive.read(member)))
    except (OSError, zipfile.BadZipFile, RuntimeError, ValueError) as exc:
        log.debug("cachesvc compile: the package's calls could not be read (%s): no library warm-up", exc)
        return frozenset()
    names = {n[:-4] if n.endswith("_out") else n for n in names}
    return frozenset(kind for kind, ops in _KINDS.items() if names.intersection(ops))


class Warmup:
    """``start(package, tensors, device)``; then ``wait()`` before the first served call. ``seconds``: how long
    the thread ran; ``kinds``: what it readied."""

    def __init__(self) -> None:
        self.kinds: FrozenSet[str] = frozenset()
        self.seconds: Optional[float] = None
        self._thread: Optional[threading.Thread] = None

    def start(self, package: str, tensors: Iterable[Any], device: str) -> None:
        if not device.startswith("cuda"):
            return
        self.kinds = kinds_called(package)
        dtypes = sorted({t.dtype for t in tensors if t.is_floating_point()}, key=str)
        if not self.kinds or not dtypes:
            return
        self._thread = threading.Thread(target=self._run, args=(dtypes, device), name="cachesvc-libraries",
                                        daemon=True)
        self._thread.start()

    def wait(self, timeout: float = JOIN_S) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)

    def _run(self, dtypes: list, device: str) -> None:
        import torch

        started = time.monotonic()
        try:
            with torch.no_grad():
                for kind in sorted(self.kinds):
                    for dtype in dtypes:
                        try:
                            _CALLS[kind](torch, dtype, device)
                        except Exception as exc:  # noqa: BLE001 - a kind this GPU or dtype lacks: the package's run decides
                            log.debug("cachesvc compile: no %s warm-up in %s: %s", kind, dtype, exc)
                if device.startswith("cuda"):
                    torch.cuda.synchronize(device)
        except Exception as exc:  # noqa: BLE001 - a thread of ours: nothing of it reaches the caller
            log.debug("cachesvc compile: the library warm-up stopped: %s", exc)
        self.seconds = round(time.monotonic() - started, 4)


def _convolution(torch: Any, dtype: Any, device: str) -> None:
    x = torch.ones(1, 8, 16, 16, dtype=dtype, device=device)
    torch.nn.functional.conv2d(x, torch.ones(8, 8, 3, 3, dtype=dtype, device=device), padding=1)


_CALLS: Dict[str, Callable[[Any, Any, str], None]] = {"convolution": _convolution}
