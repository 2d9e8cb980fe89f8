#!/usr/bin/env bash
# Run the test suite:  scripts/test.sh [pytest args...]
#
# Uses ./.venv (created with $PYTHON, default python3, if missing) and installs
# the project with its test extra and the pinned torch when pyproject.toml has
# changed since the last install; otherwise it goes straight to pytest.
# Needs PostgreSQL at 127.0.0.1:5432 (or CACHESVC_TEST_PG=skip).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv
PY=$VENV/bin/python
[[ -x $PY ]] || "${PYTHON:-python3}" -m venv "$VENV"

# What was last installed; .ci/run writes the same stamp after its install.
STAMP=$VENV/.installed-pyproject.toml
installed() {
    cmp -s pyproject.toml "$STAMP" && "$PY" - <<'PY' 2>/dev/null
import importlib.metadata as md
md.version("cachesvc")
assert md.version("torch").startswith("2.13.0"), md.version("torch")
PY
}
if ! installed; then
    # torch is pinned: never let pip pick another (CUDA) build.
    "$PY" -m pip install -q -e '.[test]' torch==2.13.0
    cp pyproject.toml "$STAMP"
fi

exec "$PY" -m pytest -q "$@"
