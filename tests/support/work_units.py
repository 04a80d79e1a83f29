"""How ``scripts/test.sh`` deals the suite out to its pytest-xdist workers.

scripts/test.sh runs ``--dist loadgroup --no-loadscope-reorder``: a worker takes one work unit at a time, in the
order of the collection; :func:`scheduler` (the ``pytest_xdist_make_scheduler`` of tests/conftest.py) says
which tests make a unit. :func:`deal` (called from
tests/conftest.py) gives each test its unit and sorts the collection heaviest unit first, so that the longest
units start at once and the short ones fill the gaps at the end (longest-processing-time order), instead of
xdist's default order (most tests first), which started the patched-release audits, few tests but the
longest of all, in the middle of the run and left one worker alone with them at the end.

The units:

* by default a test file (as ``--dist loadfile``): its module and session fixtures are made once per worker
  that runs the file;
* the tests of a :data:`SPLIT` file one unit per parametrize id (each is minutes long and shares nothing
  with the others but a module fixture that is cheap to make again);
* the files of :data:`JOIN` run in the unit named there, after its own tests, because they audit the same
  tree content: the audit's results cache (``$SM120KIT_CACHE_DIR/triton-audit``, keyed by content) then
  answers them instead of compiling the same kernels a second time on the other worker.

The weights are seconds measured on the 2-core machine with an empty cache (docs/benchmarks.md, "CI time");
a unit not listed weighs by its test count. A stale weight costs balance, never coverage.
"""

from __future__ import annotations

from collections.abc import Iterable

# Unit -> seconds: the clean-clone run of 2026-12-04 (b35de29; both workers busy, empty cache), adjusted where a
# later change moved a unit (docs/benchmarks.md, "CI time").
WEIGHTS: dict[str, float] = {
    "tests/audit/test_audit_patched_releases.py[0.5.23]": 315,  # 295 + the Dockerfile test, which joins it
    "tests/kernels/test_mla_kernels.py": 300,
    "tests/series/test_series_gating.py": 175,
    "tests/audit/test_audit_patched_releases.py[0.5.10]": 150,  # 265 for 12.0 and 12.1; 12.0 only since
    "tests/audit/test_smem_audit.py": 145,
    "tests/audit/test_backend_audit.py": 125,
    "tests/series/test_patched_identity.py": 100,  # 125 before its copies were hard links
    "tests/patching/test_apply_safety.py": 105,
    "tests/kernels/test_pcie_allreduce_patch.py": 90,
    "tests/series/test_series_kernels.py": 90,
    "tests/patching/test_apply.py": 80,
    "tests/audit/test_audit_patched_releases.py[0.5.4]": 65,  # 115 for 12.0 and 12.1
    "tests/serve/test_recipes.py": 65,
    "tests/series/test_series_audit.py": 60,
    "tests/audit/test_backend_audit_splits.py": 60,
    "tests/upstream/test_upstream_main.py": 60,
    "tests/kernels/test_moe_down_config.py": 60,
    "tests/tune/test_bench_allreduce.py": 45,
    "tests/audit/test_explain_slow.py": 40,
    "tests/audit/test_lora_limits.py": 40,
    "tests/verify/test_allreduce_findings.py": 35,
    "tests/patching/test_apply_untrusted.py": 30,
    "tests/hardware/test_fatbin.py": 30,
    "tests/kernel/test_build_kernel.py": 30,
}
# Files whose parametrized tests are units of their own, one per id.
SPLIT: frozenset[str] = frozenset({"tests/audit/test_audit_patched_releases.py"})
# File -> the unit it runs in (after that unit's own tests).
JOIN: dict[str, str] = {"tests/serve/test_dockerfile.py": "tests/audit/test_audit_patched_releases.py[0.5.23]"}

SLOW_TEST_S = 3.0  # the weight of a slow test of a file not in WEIGHTS
QUICK_TEST_S = 0.5


def unit_of(nodeid: str) -> str:
    """The work unit of a test, from its node id: its file, ``file[id]`` for a :data:`SPLIT` file (the
    parametrize id), the unit a :data:`JOIN` file joins."""
    path, _, name = nodeid.partition("::")
    if path in JOIN:
        return JOIN[path]
    if path in SPLIT and name.endswith("]") and "[" in name:
        return f"{path}[{name[name.index('[') + 1 : -1]}]"
    return path


def order(tests: Iterable[tuple[str, float]]) -> list[str]:
    """Units in the order to send them: heaviest first (by :data:`WEIGHTS`, else the sum of the tests' own
    weights), ties by name; ``tests`` are (unit, weight of the test) pairs."""
    summed: dict[str, float] = {}
    for unit, weight in tests:
        summed[unit] = summed.get(unit, 0.0) + weight
    return sorted(summed, key=lambda u: (-WEIGHTS.get(u, summed[u]), u))


def deal(items: list) -> None:
    """Sort ``items`` in place, heaviest unit first; within a unit the collection order stays (a joining
    file's tests come after the unit's own). Each worker collects, and so sorts, the same way."""
    units = []
    for index, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        weight = SLOW_TEST_S if item.get_closest_marker("slow") else QUICK_TEST_S
        units.append((unit_of(item.nodeid), path in JOIN, index, weight))
    rank = {u: i for i, u in enumerate(order((u[0], u[3]) for u in units))}
    keyed = sorted(zip(units, items), key=lambda t: (rank[t[0][0]], t[0][1], t[0][2]))
    items[:] = [item for _, item in keyed]


def scheduler(config, log):
    """pytest-xdist's scheduler for ``--dist loadgroup`` with the units above: xdist's own group marks
    (``xdist_group``) do not reach its scheduler with pytest 9.2 (the group is appended to ``Item._nodeid``,
    which pytest no longer reads), so the unit is found from the node id here."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return WorkUnitScheduling(config, log)
