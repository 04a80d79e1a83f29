#!/usr/bin/env bash
# Set up a virtual environment with every extra the tests need (the exact versions of constraints/ci.txt),
# then run the whole test suite, one pytest-xdist worker per core (at most 4; SM120KIT_TEST_WORKERS=N sets
# the number, 0 runs in this process). Work units (--dist loadgroup: a test file, or one release of the
# patched-release audits; tests/support/work_units.py) go out heaviest first (--no-loadscope-reorder keeps
# that order); a file's module and session fixtures (patched trees, probe results) are made once per worker.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SM120KIT_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -c constraints/ci.txt -e '.[test,audit,build]'
export SM120KIT_CACHE_DIR=${SM120KIT_CACHE_DIR:-$PWD/.cache/sm120kit}
workers=${SM120KIT_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
[ "$workers" -le 4 ] || workers=4
parallel=()
for arg in "$@"; do  # the caller's own -n / -p no:xdist / --collect-only win
  case $arg in -n|-n*|--numprocesses*|no:xdist|--co|--collect-only|--pdb) workers=0 ;; esac
done
[ "$workers" -le 1 ] || parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
exec "$VENV/bin/python" -m pytest ${parallel[@]+"${parallel[@]}"} "$@"
