# Sourced by scripts/demo.sh and scripts/test.sh: make ./.venv and install the
# project (server and test extras) with the pinned CPU torch, only when
# pyproject.toml changed since the last install. Sets $PY.
VENV=.venv
PY=$VENV/bin/python
[[ -x $PY ]] || "${PYTHON:-python3}" -m venv "$VENV"

STAMP=$VENV/.installed-pyproject.toml
_installed() {
    cmp -s pyproject.toml "$STAMP" && "$PY" - <<'PY' 2>/dev/null
import importlib.metadata as md
md.version("cachesvc")
assert md.version("torch").startswith("2.13.0"), md.version("torch")
PY
}
if ! _installed; then
    echo "installing cachesvc[server,test] and torch==2.13.0 into $VENV ..." >&2
    "$PY" -m pip install -q --upgrade pip
    # torch==2.13.0 from PyPI is the multi-GB CUDA build on Linux; the CPU build (what the tests and
    # the demo use) is on PyTorch's own index. TORCH_INDEX_URL names that index for torch alone
    # (e.g. https://download.pytorch.org/whl/cpu), everything else still comes from pip's usual
    # index. Unset, pip's own configuration decides (this machine's finds a local CPU wheel).
    if [[ -n ${TORCH_INDEX_URL:-} ]]; then
        "$PY" -m pip install -q --index-url "$TORCH_INDEX_URL" torch==2.13.0
        "$PY" -m pip install -q -e '.[server,test]'
    else
        "$PY" -m pip install -q -e '.[server,test]' torch==2.13.0
    fi
    cp pyproject.toml "$STAMP"
fi
