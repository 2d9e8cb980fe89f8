#!/usr/bin/env bash
# Run the test suite:  scripts/test.sh [pytest args...]
#
# Installs what is needed into ./.venv on first use (scripts/_venv.sh), then
# runs pytest. Needs PostgreSQL at 127.0.0.1:5432 (or CACHESVC_TEST_PG=skip).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_venv.sh
# --durations: every run names its slowest tests (the suite takes about 22 minutes on a 2-core VM, 21.5 measured
# with nothing else running; 10 is the aim).
# -n: one worker per core, at most 4: most tests wait on subprocesses, servers and sockets, so two
# workers on 2 cores took the suite from 32 to 17 minutes. --dist loadscope keeps a module on one
# worker, so a module's shared fixture (a service, a cold compile) is made once. `-n 0` runs serially.
# -m "not fuzz": the generated-input tests are a profile of their own, `scripts/test.sh -m fuzz`
# (a later -m replaces this one); CI runs both (.ci/run).
exec "$PY" -m pytest -q --durations=25 -n auto --maxprocesses 4 --dist loadscope -m "not fuzz" "$@"
