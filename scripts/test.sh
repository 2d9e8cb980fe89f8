#!/usr/bin/env bash
# Run the test suite:  scripts/test.sh [pytest args...]
#
# Installs what is needed into ./.venv on first use (scripts/_venv.sh), then
# runs pytest. Needs PostgreSQL at 127.0.0.1:5432 (or CACHESVC_TEST_PG=skip).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_venv.sh
# --durations: every run names its slowest tests (on this 2-core VM, three workers, nothing else
# running, with the run's compiler cache, tests/compiler_cache.py: 9 minutes at 1,386 tests, 16 at 1,478,
# the one call's proof, transformers 4.x and the artifact tests added; 1,630 since the fleet's shapes:
# 15.5 min alone in CI's way, 2026-12-04; 10.8 min, 2026-12-05, once a new module no longer went out
# last (tests/scheduling.py); 16-18 at 1,734 on the VM of 2026-12-07, 13.8-14.1 once the containers were
# forked from servers that imported torch once (harness/forkserver.py); 14.6-14.7 on the VM of the next session,
# 13.9-14.1 there once the client's own build and check children were forked too; 12.6-13 on the VM of the
# session after, once a run kept its bytecode (below); 10 is the aim: docs/journal.md).
# -n: one worker more than the cores, at most 4: most tests wait on subprocesses, servers and sockets, so
# two workers on 2 cores took the suite from 32 to 17 minutes, and a third from 21.5 to 16 (960 s, the
# same results). --dist loadscope keeps a module on one worker, so a module's shared fixture (a service,
# a cold compile) is made once. `-n 0` runs serially (a later -n replaces this one).
# -m "not fuzz": the generated-input tests are a profile of their own, `scripts/test.sh -m fuzz`
# (a later -m replaces this one); CI runs both (.ci/run).
# Bytecode: where PYTHONDONTWRITEBYTECODE is set, scripts/_venv.sh keeps it under .venv/pycache instead.
workers=$(( $(nproc) + 1 ))
(( workers > 4 )) && workers=4
exec "$PY" -m pytest -q --durations=25 -n "$workers" --dist loadscope -m "not fuzz" "$@"
