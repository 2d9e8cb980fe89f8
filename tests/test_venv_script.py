"""scripts/_venv.sh installs torch from TORCH_INDEX_URL when it is set (PyTorch's CPU wheel index), and only torch.

Run with a stand-in for the venv's python that records how it was called, so no package is installed."""
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
[ "$1" = "-" ] && exit 1
exit 0
"""


def run_venv_script(tmp_path: Path, **env: str) -> list:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(RECORDER)
    (bin_dir / "python").chmod(0o755)
    out = subprocess.run(["bash", "-c", f"set -euo pipefail; source {ROOT / 'scripts/_venv.sh'}"], cwd=tmp_path,
                         env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line for line in (bin_dir / "calls").read_text().splitlines() if line.startswith("-m pip install")]


def test_torch_index_url_is_used_for_torch_only(tmp_path):
    calls = run_venv_script(tmp_path, TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu")
    assert calls == ["-m pip install -q --upgrade pip",
                     "-m pip install -q --index-url https://download.pytorch.org/whl/cpu torch==2.13.0",
                     "-m pip install -q -e .[server,test]"]


@pytest.mark.parametrize("value", [None, ""])
def test_without_it_pip_configuration_decides(tmp_path, value):
    calls = run_venv_script(tmp_path, **({} if value is None else {"TORCH_INDEX_URL": value}))
    assert calls == ["-m pip install -q --upgrade pip", "-m pip install -q -e .[server,test] torch==2.13.0"]
