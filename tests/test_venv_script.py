"""scripts/_venv.sh picks the torch build: the CPU one on a machine without an NVIDIA GPU (a wheel pip's own
configuration finds, else PyTorch's CPU index, else, that index out of reach, PyPI's CUDA build, saying so), PyPI's (CUDA) one where nvidia-smi sees a GPU or
CACHESVC_TORCH=cuda asks for it, and TORCH_INDEX_URL's for torch alone when set.

Run with a stand-in for the venv's python that records how it was called (and fails the calls named in its "fail" file,
as pip does when no wheel matches), and a stand-in nvidia-smi, so nothing is installed."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDER = """#!/bin/sh
# the venv's python, standing in: record the call; answer "not installed" to the check that reads stdin
echo "$*" >> "$(dirname "$0")/calls"
printf '%s\n' "${PYTHONWARNINGS:-}" >> "$(dirname "$0")/warnings"
[ "$1" = "-" ] && exit 1
if grep -qxF -- "$*" "$(dirname "$0")/fail"; then  # as pip fails to find a wheel: its errors on stderr
    echo "ERROR: Could not find a version that satisfies the requirement torch (from versions: none)" >&2
    echo "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/" >&2
    exit 1
fi
exit 0
"""
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
UPGRADE, PROJECT = "-m pip install -q --upgrade pip", "-m pip install -q -e .[server,test]"
LOCAL_CPU = "-m pip install -q torch==2.13.0+cpu"
CPU_FROM_INDEX = f"-m pip install -q --retries 1 --timeout 30 --index-url {CPU_INDEX} torch==2.13.0+cpu"


def run_venv_script(tmp_path: Path, gpu: bool = False, ok: bool = True, fail=(), **env: str):
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(RECORDER)
    (bin_dir / "python").chmod(0o755)
    (bin_dir / "fail").write_text("".join(f"{call}\n" for call in fail))
    tools = tmp_path / "tools"  # nvidia-smi -L: lists a GPU (exit 0) or finds none (exit 6, as the real one)
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\n" + ("echo 'GPU 0: NVIDIA H200'\n" if gpu else "exit 6\n"))
    (tools / "nvidia-smi").chmod(0o755)
    out = subprocess.run(["bash", "-c", f"set -euo pipefail; source {ROOT / 'scripts/_venv.sh'}"], cwd=tmp_path,
                         env={"PATH": f"{tools}:{os.environ['PATH']}", "HOME": str(tmp_path), **env},
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode == 0) == ok, out.stderr
    called = (bin_dir / "calls").read_text().splitlines()
    calls = [line for line in called if line.startswith("-m pip install")]
    run_venv_script.warnings = dict(zip(called, (bin_dir / "warnings").read_text().splitlines()))
    return calls, out.stderr


def test_without_a_gpu_the_cpu_build_comes_from_pips_configuration_when_it_has_the_wheel(tmp_path):
    calls, _ = run_venv_script(tmp_path)
    assert calls == [UPGRADE, LOCAL_CPU, PROJECT]


def test_without_a_gpu_and_no_local_wheel_the_cpu_build_comes_from_pytorchs_cpu_index(tmp_path):
    calls, said = run_venv_script(tmp_path, fail=[LOCAL_CPU])
    assert calls == [UPGRADE, LOCAL_CPU, CPU_FROM_INDEX, PROJECT]
    assert "no NVIDIA GPU here" in said and "CACHESVC_TORCH=cuda" in said


def test_an_unreachable_cpu_index_falls_back_to_pypis_cuda_build_saying_so_and_how_to_override(tmp_path):
    """Issue 27 item 1: a fresh CPU machine with no local wheel and PyTorch's CPU index out of reach (no DNS) still
    gets a torch the suite passes with: PyPI's CUDA build, in one line that says so and what to set instead."""
    calls, said = run_venv_script(tmp_path, fail=[LOCAL_CPU, CPU_FROM_INDEX])
    assert calls == [UPGRADE, LOCAL_CPU, CPU_FROM_INDEX, "-m pip install -q torch==2.13.0", PROJECT]
    line = next(line for line in said.splitlines() if "unreachable" in line)
    assert "PyPI" in line and "CUDA build" in line, line
    assert "TORCH_INDEX_URL" in line and "PIP_FIND_LINKS" in line and "CACHESVC_TORCH=cpu" in line, line


@pytest.mark.parametrize("torch_build", ["", "cpu"])
def test_an_unreachable_cpu_index_is_told_in_one_line_without_pips_resolution_errors(tmp_path, torch_build):
    """Issue 37: pip's "ERROR: ResolutionImpossible" (nothing found, read as a conflict) came before the script's
    own line. pip's output goes to a log the line names; the script says what happened in one line."""
    _, said = run_venv_script(tmp_path, ok=not torch_build, fail=[LOCAL_CPU, CPU_FROM_INDEX], CACHESVC_TORCH=torch_build)
    assert "ERROR" not in said and "ResolutionImpossible" not in said, said
    log = tmp_path / ".venv" / "torch-cpu-index.log"
    assert "ResolutionImpossible" in log.read_text()
    [line] = [line for line in said.splitlines() if "unreachable" in line]
    assert line.endswith("(pip's output: .venv/torch-cpu-index.log)"), line
    assert said.splitlines()[0].startswith("installing cachesvc") and len(said.splitlines()) == 3, said


def test_cachesvc_torch_cpu_stops_with_what_to_set_when_the_cpu_build_cannot_be_had(tmp_path):
    calls, said = run_venv_script(tmp_path, ok=False, fail=[LOCAL_CPU, CPU_FROM_INDEX], CACHESVC_TORCH="cpu")
    assert calls == [UPGRADE, LOCAL_CPU, CPU_FROM_INDEX], "asked for the CPU build: never the CUDA one"
    assert "TORCH_INDEX_URL" in said and "PIP_FIND_LINKS" in said


@pytest.mark.parametrize("gpu,env", [(True, {}), (False, {"CACHESVC_TORCH": "cuda"})])
def test_a_gpu_or_cachesvc_torch_cuda_gets_pypis_cuda_build(tmp_path, gpu, env):
    calls, _ = run_venv_script(tmp_path, gpu=gpu, **env)
    assert calls == [UPGRADE, "-m pip install -q torch==2.13.0", PROJECT]


def test_cachesvc_torch_cpu_wins_over_a_gpu_and_a_bad_value_is_refused(tmp_path):
    calls, _ = run_venv_script(tmp_path, gpu=True, CACHESVC_TORCH="cpu")
    assert calls == [UPGRADE, LOCAL_CPU, PROJECT]
    other = tmp_path / "other"
    other.mkdir()
    _, said = run_venv_script(other, ok=False, CACHESVC_TORCH="rocm")
    assert "CACHESVC_TORCH must be cpu or cuda" in said


def test_torch_index_url_is_used_for_torch_only(tmp_path):
    calls, _ = run_venv_script(tmp_path, gpu=True, TORCH_INDEX_URL="https://download.pytorch.org/whl/cu130")
    assert calls == [UPGRADE, "-m pip install -q --index-url https://download.pytorch.org/whl/cu130 torch==2.13.0",
                     PROJECT]


@pytest.mark.parametrize("value", [None, ""])
def test_an_empty_torch_index_url_is_unset(tmp_path, value):
    calls, _ = run_venv_script(tmp_path, **({} if value is None else {"TORCH_INDEX_URL": value}))
    assert calls == [UPGRADE, LOCAL_CPU, PROJECT]


def test_the_project_install_hides_setuptools_editable_note_and_no_other_warning(tmp_path):
    """Issue 27: recent pip shows setuptools' 10-line "Editable installation" note (InformationOnly) on every
    install; the script filters that message alone, keeping the user's own filters."""
    import sys

    run_venv_script(tmp_path, PYTHONWARNINGS="default::DeprecationWarning")
    given = run_venv_script.warnings[PROJECT]
    assert given.startswith("default::DeprecationWarning,"), given
    code = ("import warnings\nwarnings.warn('Editable installation.\\n!!\\n  Please be careful with folders', UserWarning)\n"
            "warnings.warn('a real problem', UserWarning)\n")
    shown = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONWARNINGS": given},
                           capture_output=True, text=True, check=True).stderr
    assert "Editable installation" not in shown and "a real problem" in shown, shown

