"""scripts/test.sh deals the suite out in work units, heaviest first (tests/support/work_units.py).

The order is read from pytest's own collection (``--collect-only --dist loadgroup``, as the workers collect),
so what is checked is what pytest-xdist receives.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import work_units
from conftest import REPO_ROOT

AUDIT = "tests/audit/test_audit_patched_releases.py"
DOCKERFILE = "tests/serve/test_dockerfile.py"
LIGHT = "tests/project/test_lint.py"  # a file the weights do not list
FILES = (AUDIT, DOCKERFILE, "tests/audit/test_explain_slow.py", "tests/series/test_series_audit.py", LIGHT)


def _collected(*extra: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *extra, *FILES],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_the_named_files_exist():
    named = [u.split("[", 1)[0] for u in work_units.WEIGHTS] + list(work_units.SPLIT) + list(work_units.JOIN)
    named += [u.split("[", 1)[0] for u in work_units.JOIN.values()]
    assert [n for n in named if not (REPO_ROOT / n).is_file()] == []


def test_test_script_deals_by_group_in_the_collection_order():
    script = (REPO_ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert "--dist loadgroup --no-loadscope-reorder" in script


@pytest.mark.slow  # two collections that import torch and Triton
def test_units_go_out_heaviest_first_and_each_unit_is_contiguous():
    order = _collected("--dist", "loadgroup")
    units = [work_units.unit_of(n) for n in order]
    runs = [u for i, u in enumerate(units) if i == 0 or units[i - 1] != u]
    assert len(runs) == len(set(runs)), runs  # a unit's tests are sent together
    # the patched-release audits are units of their own, the heaviest first, then the 0.5.23 audit with the
    # Dockerfile test that audits the same patched 0.5.23 (answered from the audit's results cache)
    assert set(runs[:2]) == {f"{AUDIT}[0.5.10]", f"{AUDIT}[0.5.23]"}, runs
    first_docker = next(i for i, n in enumerate(order) if n.startswith(DOCKERFILE))
    assert order[first_docker - 1] == f"{AUDIT}::test_audit_of_the_patched_release_exits_0[0.5.23]"
    assert all(u == f"{AUDIT}[0.5.23]" for n, u in zip(order, units) if n.startswith(DOCKERFILE))
    weights = [work_units.WEIGHTS.get(u) for u in runs]
    listed = [w for w in weights if w is not None]
    assert listed == sorted(listed, reverse=True) and weights.index(None) == len(listed), list(zip(runs, weights))
    assert runs[-1] != LIGHT or len(runs) > 3
    # nothing is lost or repeated
    assert sorted(order) == sorted(_collected())


@pytest.mark.slow
def test_any_other_run_keeps_the_collection_order():
    order = _collected()
    files = [n.split("::", 1)[0] for n in order]
    assert [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f] == list(FILES)


@pytest.mark.slow  # starts two pytest-xdist workers
def test_a_unit_runs_on_one_worker():
    files = ("tests/hardware/test_arch_parse.py", "tests/project/test_docs.py")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2", "--dist", "loadgroup"]
        + ["--no-loadscope-reorder", "-m", "not slow", *files],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("[gw") and " PASSED " in line:
            worker, nodeid = line.split("]", 1)[0][1:], line.split(" PASSED ", 1)[1].strip()
            workers.setdefault(nodeid.split("::", 1)[0], set()).add(worker)
    assert sorted(workers) == sorted(files) and all(len(w) == 1 for w in workers.values()), workers
