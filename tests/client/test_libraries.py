"""cuDNN, readied beside the proof for a hit's package that convolves (client/one_call/libraries.py): which kinds
a package's wrapper names, and that the warm-up's own calls work and never raise into the caller."""
from __future__ import annotations

import logging
import zipfile

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.one_call import libraries  # noqa: E402

WRAPPER = b"""
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cuda_mm_out(buf3, buf2, arg1_1));
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cuda__scaled_dot_product_flash_attention(buf5, buf6, buf7, 0.0, 1, 0, 0));
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_convolution(buf8, arg2_1, nullptr, ...));
    aoti_torch_get_data_ptr(buf3, &ptr);  // not a library call
"""


def package(tmp_path, files):
    path = tmp_path / "package.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return str(path)


def test_the_kinds_are_read_from_the_wrapper_the_package_carries(tmp_path):
    named = package(tmp_path, {"package/data/aotinductor/model/cabc.wrapper.cpp": WRAPPER,
                               "package/data/aotinductor/model/cabc.so": b"\x7fELF"})
    assert libraries.kinds_called(named) == {"convolution"}  # a matmul or an attention: not warmed (see the module)
    no_conv = package(tmp_path, {"package/data/aotinductor/model/w.wrapper.cpp": WRAPPER.replace(b"convolution", b"relu")})
    assert libraries.kinds_called(no_conv) == frozenset()
    # a .cpp outside the package's aotinductor folder is not the wrapper
    assert libraries.kinds_called(package(tmp_path, {"extra/notes.cpp": WRAPPER})) == frozenset()


def test_a_package_that_is_not_a_zip_readies_nothing(tmp_path, caplog):
    bad = tmp_path / "package.pt2"
    bad.write_bytes(b"not a zip at all")
    with caplog.at_level(logging.DEBUG, logger="cachesvc_client"):
        assert libraries.kinds_called(str(bad)) == frozenset()
        assert libraries.kinds_called(str(tmp_path / "missing.pt2")) == frozenset()
    assert "no library warm-up" in caplog.text


def test_on_a_cpu_nothing_starts_and_the_wait_returns(tmp_path):
    warmup = libraries.Warmup()
    warmup.start(package(tmp_path, {"p/data/aotinductor/model/w.cpp": WRAPPER}), [torch.ones(2)], "cpu")
    assert warmup._thread is None and warmup.seconds is None
    warmup.wait()


def test_the_warm_up_call_runs_in_each_floating_dtype():
    # on this CPU (a GPU runs the same code): a call that broke would ready nothing
    for dtype in (torch.float32, torch.bfloat16):
        libraries._CALLS["convolution"](torch, dtype, "cpu")


def test_a_failing_call_or_device_is_logged_at_debug_and_the_thread_still_ends(monkeypatch, caplog):
    def boom(*_):
        raise RuntimeError("no such kernel on this GPU")

    monkeypatch.setitem(libraries._CALLS, "convolution", boom)
    warmup = libraries.Warmup()
    warmup.kinds = frozenset({"convolution"})
    with caplog.at_level(logging.DEBUG, logger="cachesvc_client"):
        warmup._run([torch.float32], "cuda:7" if not torch.cuda.is_available() else "cuda")
    assert warmup.seconds is not None
    assert "no convolution warm-up in torch.float32: no such kernel on this GPU" in caplog.text
