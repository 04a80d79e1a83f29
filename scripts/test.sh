#!/usr/bin/env bash
# Set up a virtual environment with every extra the tests need (the exact versions of constraints/ci.txt),
# then run the whole test suite.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SM120KIT_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -c constraints/ci.txt -e '.[test,audit,build]'
export SM120KIT_CACHE_DIR=${SM120KIT_CACHE_DIR:-$PWD/.cache/sm120kit}
exec "$VENV/bin/python" -m pytest "$@"
