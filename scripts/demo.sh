#!/usr/bin/env bash
# The restart demo:  scripts/demo.sh [--model mlp|encoder]
#
# Installs what is needed into ./.venv on first use, starts `cachesvc serve` on
# the embedded default, compiles a model cold in one fresh container,
# publishes, restores into a restarted container and prints both first calls.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_venv.sh
exec "$PY" demo/restart.py "$@"
