"""The GPU model and compute capability are part of the key (fingerprint faked, so it runs anywhere)."""
from __future__ import annotations

import pytest

from cachesvc_client import CacheClient, environment

H100 = {"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "cuda-13.0", "python": "3.12",
        "device": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}


def fake_gpu(monkeypatch, **fields):
    for k, v in {**H100, **fields}.items():
        monkeypatch.setenv(f"CACHESVC_ENV_{k.upper()}", v)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
def test_a_cache_published_on_one_gpu_model_is_not_restored_on_another(live_server, tmp_path, monkeypatch):
    src = tmp_path / "src"
    (src / "triton/0/K").mkdir(parents=True)
    (src / "triton/0/K/kernel.cubin").write_bytes(b"sass for sm_90 on H100")
    fake_gpu(monkeypatch)
    assert environment()["device"] == "NVIDIA H100 80GB HBM3"
    CacheClient(live_server.url).publish("resnet50", "f32[8,3,224,224]", roots={"inductor": str(src)})

    def restore(**fields):
        fake_gpu(monkeypatch, **fields)
        dest = tmp_path / f"dest-{len(list(tmp_path.iterdir()))}"
        return CacheClient(live_server.url, cache_dir=str(dest)).restore("resnet50", "f32[8,3,224,224]")

    assert not restore(device="NVIDIA H200").hit
    assert not restore(arch="sm_100").hit
    assert not restore(device="NVIDIA A100-SXM4-80GB", arch="sm_80").hit
    same = restore()
    assert same.hit and same.files == 1
