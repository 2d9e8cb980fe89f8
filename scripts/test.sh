#!/usr/bin/env bash
# Run the test suite:  scripts/test.sh [pytest args...]
#
# Installs what is needed into ./.venv on first use (scripts/_venv.sh), then
# runs pytest. Needs PostgreSQL at 127.0.0.1:5432 (or CACHESVC_TEST_PG=skip).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_venv.sh
# --durations: every run names its slowest tests (the suite is kept under 30 minutes on a 2-core VM)
exec "$PY" -m pytest -q --durations=25 "$@"
