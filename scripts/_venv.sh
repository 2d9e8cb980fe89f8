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
    # torch is pinned: an unpinned torch would pull a multi-GB CUDA build.
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q -e '.[server,test]' torch==2.13.0
    cp pyproject.toml "$STAMP"
fi
