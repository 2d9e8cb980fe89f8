"""The simulated containers' environment (harness/containers.py): a fresh container inherits none of
this machine's Inductor, Triton or cachesvc settings, except the run's choices in PASSED, which are in
the FX graph key and so must be the same in every process of a run."""
from __future__ import annotations

from harness.containers import PASSED, Container, inherited_env


def test_a_container_keeps_the_runs_isa_choice_and_drops_the_machines_other_settings(tmp_path, monkeypatch):
    assert PASSED == ("TORCHINDUCTOR_VEC_ISA_OK",)
    monkeypatch.setenv("TORCHINDUCTOR_VEC_ISA_OK", "1")
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    ctr = Container(tmp_path)
    env = ctr.env()
    assert env["TORCHINDUCTOR_VEC_ISA_OK"] == "1" and env["TORCHINDUCTOR_CACHE_DIR"] == str(ctr.cache_dir)
    assert "TORCHINDUCTOR_FX_GRAPH_CACHE" not in env and "TRITON_CACHE_DIR" not in env
    own = inherited_env(("TORCHINDUCTOR_", "TRITON_"))  # what the tests' own fresh processes start from
    assert own["TORCHINDUCTOR_VEC_ISA_OK"] == "1" and "TORCHINDUCTOR_FX_GRAPH_CACHE" not in own
    monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK")
    assert "TORCHINDUCTOR_VEC_ISA_OK" not in Container(tmp_path, "bench").env()  # unset stays unset: probes run


def test_a_service_whose_port_another_service_took_starts_on_another_port(tmp_path):
    """The port is picked seconds before `cachesvc serve` binds it (the write token is made first), so another
    test's service can take it: that one then answered /healthz for ours, which failed to bind, and clients
    got 401 for a token it never made (CI, 2026-12-04). The harness now checks that the service answering
    knows its token, and starts again on another port."""
    import requests

    from harness.service import ServiceProcess

    with ServiceProcess(tmp_path / "first") as first:
        with ServiceProcess(tmp_path / "second", port=first.port) as second:
            assert second.port != first.port and second.proc.poll() is None
            got = requests.get(second.url + "/api/v1/entries", headers={"Authorization": f"Bearer {second.token}"},
                               timeout=10)
            assert got.status_code == 200, got.text


def test_a_profiled_block_writes_its_costliest_functions_and_an_unprofiled_one_writes_nothing(tmp_path):
    """harness/worker.py --profile-compile (bench/model_table.py --profile): where compile()'s seconds go."""
    from harness.worker import _profiled

    def costly_phase_of_the_call():
        return sum(i * i for i in range(20000))

    out = tmp_path / "compile.txt"
    with _profiled(str(out)):
        costly_phase_of_the_call()
    text = out.read_text()
    assert "costly_phase_of_the_call" in text and "cumulative" in text
    with _profiled(None):
        costly_phase_of_the_call()
    assert list(tmp_path.iterdir()) == [out]
