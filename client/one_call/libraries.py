"""The GPU libraries a hit's package calls (cuBLAS, cuDNN, the attention kernels), made ready beside the proof.

A process's first matrix multiply on a GPU creates cuBLAS's handle and loads its kernels; its first
convolution, cuDNN's; its first attention, the flash or efficient kernels. A restart's first call paid that
inside the package's first run, as eager's first call does: 1.14 s of CPU for a Llama-family bf16 decoder,
0.35 s for ResNet-50, 0.14-0.20 s for BERT-large and ViT-large on an H100 (2026-12-06, ``phases["first_run"]``).
The package calls those libraries through torch's C shim, and its wrapper names each call
(``aoti_torch_cuda_mm_out``, ``aoti_torch_cuda__scaled_dot_product_flash_attention``, ...). So while compile()
loads the proof (Python, in the calling thread), a thread makes one tiny call of each kind the wrapper names,
in the model's floating dtypes, on the package's device; torch lets go of the GIL inside them, so the two
overlap. The tiny calls read nothing of the model and write nothing it holds: they cannot change an output.
The first served call waits for the thread first (a bounded wait): a CUDA graph's capture must not see another
thread's allocations. ``CACHESVC_LIBRARY_WARMUP=0`` turns it off.
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
_KINDS = {"matmul": ("mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation", "mm_dtype"),
          "flash": ("_scaled_dot_product_flash_attention", "_flash_attention_forward"),
          "efficient": ("_scaled_dot_product_efficient_attention", "_efficient_attention_forward"),
          "cudnn_attention": ("_scaled_dot_product_cudnn_attention",),
          "convolution": ("convolution", "_convolution", "cudnn_convolution")}


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


def _matmul(torch: Any, dtype: Any, device: str) -> None:
    a = torch.ones(16, 16, dtype=dtype, device=device)
    torch.mm(a, a)
    torch.addmm(a[0], a, a)
    torch.bmm(a[None], a[None])


def _attention(op: str, *extra: Any) -> Callable[[Any, Any, str], None]:
    """One causal attention through aten's ``op`` itself: ``sdpa_kernel`` would pick the backend by flags that
    are the whole process's, which the caller's own threads read."""
    def run(torch: Any, dtype: Any, device: str) -> None:
        q = torch.ones(1, 2, 16, 64, dtype=dtype, device=device)
        getattr(torch.ops.aten, op)(q, q, q, *extra, 0.0, True)
    return run


def _convolution(torch: Any, dtype: Any, device: str) -> None:
    x = torch.ones(1, 8, 16, 16, dtype=dtype, device=device)
    torch.nn.functional.conv2d(x, torch.ones(8, 8, 3, 3, dtype=dtype, device=device), padding=1)


_CALLS: Dict[str, Callable[[Any, Any, str], None]] = {
    "matmul": _matmul, "flash": _attention("_scaled_dot_product_flash_attention"),
    "efficient": _attention("_scaled_dot_product_efficient_attention", None, False),
    "cudnn_attention": _attention("_scaled_dot_product_cudnn_attention", None, False), "convolution": _convolution}
