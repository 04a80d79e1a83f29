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
export SM120KIT_CACHE_DIR=${SM120KIT_CACHE_DIR:-$PWD/.cache/sm120kit}
# The cached releases are read-only input: importing SGLang from them must not leave __pycache__ folders there
# (a damaged-cache test counts the folder's contents), so no bytecode is written by imports (tests that need .pyc
# files make them explicitly).
export PYTHONDONTWRITEBYTECODE=1

# Free disk first: a run that fills its disk fails hundreds of tests at once with "No space left on device" after
# minutes of work. What a clean-clone run took (docs/benchmarks.md, "CI time"): at most TMP_MB at once in the
# temporary folder (each test's copy of a release; a passing test's folder is removed when it ends), and, where
# they are not there yet, VENV_MB for the virtual environment and CACHE_MB for the releases, wheels and compile
# caches. SM120KIT_TEST_FREE_MB=N asks for N MB in each place instead.
TMP_MB=3000 VENV_MB=3000 CACHE_MB=3500
free_mb() { df -Pm "$1" 2>/dev/null | awk 'NR == 2 { print $4 }'; }
need_space() {  # folder, MB needed, what for
  local dir=$1 need=${SM120KIT_TEST_FREE_MB:-$2} have
  while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
  have=$(free_mb "$dir")
  if [ -n "$have" ] && [ "$have" -lt "$need" ]; then
    echo "error: $dir has $have MB free; the test run needs about $need MB there ($3). Free some space (old" \
      "pytest folders under ${TMPDIR:-/tmp}/pytest-of-$(id -un) are safe to delete), or point TMPDIR or" \
      "SM120KIT_CACHE_DIR at a larger disk." >&2
    exit 28
  fi
}
need_space "${TMPDIR:-/tmp}" "$TMP_MB" "each test's copy of an SGLang release"
[ -x "$VENV/bin/python" ] || need_space "$VENV" "$VENV_MB" "a new virtual environment"
[ -d "$SM120KIT_CACHE_DIR/releases" ] || need_space "$SM120KIT_CACHE_DIR" "$CACHE_MB" "an empty release cache"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip runs again only when what it installs from changes (the pins, the extras): an editable install follows the
# source by itself, and pip's own check of 100-odd packages costs seconds of every quick loop.
stamp="$VENV/.sm120kit-installed"
inputs=$(cat constraints/ci.txt pyproject.toml | "$VENV/bin/python" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')
if [ "$(cat "$stamp" 2>/dev/null)" != "$inputs" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -c constraints/ci.txt -e '.[test,audit,build]'
  echo "$inputs" > "$stamp"
fi
workers=${SM120KIT_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
[ "$workers" -le 4 ] || workers=4
parallel=()
for arg in "$@"; do  # the caller's own -n / -p no:xdist / --collect-only win
  case $arg in -n|-n*|--numprocesses*|no:xdist|--co|--collect-only|--pdb) workers=0 ;; esac
done
[ "$workers" -le 1 ] || parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
exec "$VENV/bin/python" -m pytest ${parallel[@]+"${parallel[@]}"} "$@"
