"""``sm120kit bench-allreduce``: the measurement, the variants, the search, the recipe it writes.

The measurement machinery runs for real on this machine's CPUs (the tests marked slow): the worker starts
2 or 4 processes that join a ``torch.distributed`` gloo group and all-reduce (a real collective; the GPUs
and NCCL it times on a serving machine are not here). FlashInfer's PCIe-IPC all-reduce is the stand-in of
``tests/data/flashinfer-standin`` (its sum is the gloo all-reduce). The search's choices are tested with a
cost table in place of the timings (that part is arithmetic over results, whatever measured them), and the
command line is run as a subprocess: with no GPU here it must exit 9 and say why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import DATA_DIR

from sm120kit.errors import MissingDependency, RecipeError
from sm120kit.serve import recipe_edit
from sm120kit.serve.recipe import find_recipe, load_recipe
from sm120kit.tune import allreduce as bench
from sm120kit.tune.allreduce_worker import bus_bandwidth, percentile

STANDIN = DATA_DIR / "flashinfer-standin"
KIMI = "kimi-k2-thinking-8x-rtx-pro-6000"


CPU_PROBE = {"gpus": [], "sglang_custom_ar": "not timed on CPUs", "pcie_ipc": "not timed here"}


def cpu_plan(world: int = 2, **kw) -> bench.BenchPlan:
    """A plan for ``world`` CPU processes in a gloo group (the probe is run only where a test asks for it)."""
    args = dict(
        hidden=512,
        tokens=(1, 16),
        world=world,
        backend="gloo",
        device="cpu",
        dtype="bfloat16",
        warmup=3,
        samples=12,
        inner=4,
        quick_samples=3,
        topology={"summary": "CPU processes"},
        probe_result=CPU_PROBE,
    )
    args.update(kw)
    return bench.plan_bench(**args)


# -- the worker: real gloo collectives --------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_time_a_real_all_reduce_per_size():
    plan = cpu_plan(environ=dict(os.environ, NCCL_ALGO="Tree", NCCL_P2P_DISABLE="0"))
    assert plan.removed_env == {"NCCL_ALGO": "Tree"} and "NCCL_ALGO" not in plan.base_env
    assert plan.base_env["NCCL_NVLS_ENABLE"] == "0" and plan.problem is None
    variant = bench.nccl_variant({"NCCL_PROTO": "LL"}, "test")
    result = bench.run_variant(plan, variant)
    assert result.status == "measured", result.error
    assert [e["tokens"] for e in result.sizes] == [1, 16]
    for entry in result.sizes:
        assert entry["check"] == "ok" and entry["served"] and entry["timing"] == "wall"
        assert entry["samples"] == 12 and 0 < entry["p50_us"] <= entry["p99_us"]
        assert entry["bytes"] == entry["tokens"] * 512 * 2
        assert entry["busbw_gbps"] == pytest.approx(bus_bandwidth(entry["bytes"], entry["p50_us"] / 1e6, 2))
    assert result.geomean(plan.tokens) > 0


@pytest.mark.slow
def test_each_variant_runs_in_fresh_processes_with_its_own_environment(tmp_path):
    plan = cpu_plan(tokens=(2,), samples=4)
    seen = []
    for variant in (
        bench.nccl_variant({"NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": "2"}, "a"),
        bench.nccl_variant({}, "b"),
    ):
        spec = tmp_path / f"{len(seen)}.json"
        spec.write_text(json.dumps(plan.spec(variant, None)))
        out = tmp_path / f"{len(seen)}-out.json"
        env = dict(plan.base_env, **variant.env_dict(), **bench._worker_env(tmp_path))
        proc = subprocess.run(
            [plan.python, "-m", bench.WORKER, "measure", str(spec), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen.append(json.loads(out.read_text()))
    first, second = seen
    assert first["env"]["NCCL_PROTO"] == "Simple" and first["env"]["NCCL_MAX_NCHANNELS"] == "2"
    assert "NCCL_PROTO" not in second["env"] and "NCCL_MAX_NCHANNELS" not in second["env"]
    assert first["env"]["NCCL_NVLS_ENABLE"] == second["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert len(set(first["pids"])) == 2 and not set(first["pids"]) & set(second["pids"])
    assert os.getpid() not in first["pids"] + second["pids"]


@pytest.mark.slow
def test_a_hopeless_variant_stops_after_its_quick_look():
    plan = cpu_plan(samples=50, quick_samples=3)
    variant = bench.nccl_variant({}, "test")
    dropped = bench.run_variant(plan, variant, thresholds={1: 0.001, 16: 0.001})  # nothing is that fast
    assert dropped.status == "dropped" and all(e["samples"] == 3 for e in dropped.sizes)
    assert dropped.geomean(plan.tokens) is None
    kept = bench.run_variant(plan, variant, thresholds={1: 1e9, 16: 1e9})
    assert kept.status == "measured" and all(e["samples"] == 50 for e in kept.sizes)


@pytest.mark.slow
def test_the_pcie_ipc_variant_serves_up_to_its_workspace_and_a_missing_one_fails_clearly(monkeypatch):
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(STANDIN / "with-pcie-ipc"), os.environ.get("PYTHONPATH", "")])
    )
    plan = cpu_plan(probe_result=None)  # the probe finds the stand-in
    (ipc,) = [v for v in plan.extra if v.impl == "pcie-ipc"]
    result = bench.run_variant(plan, ipc)
    assert result.status == "measured", result.error
    assert result.impl_info == {"tuned": 1} and all(e["check"] == "ok" for e in result.sizes)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(STANDIN / "without-pcie-ipc"), os.environ.get("PYTHONPATH", "")])
    )
    plan = cpu_plan(probe_result=None)
    assert [v.impl for v in plan.extra] == []
    skipped = dict(plan.skipped)
    assert "cannot be imported" in skipped["FlashInfer's PCIe-IPC all-reduce"]
    failed = bench.run_variant(plan, ipc)
    assert failed.status == "failed" and "PcieIpcAllReduceWorkspace" in failed.error


@pytest.mark.slow
def test_four_processes():
    plan = cpu_plan(world=4, tokens=(1, 8, 64))
    result = bench.run_variant(plan, bench.nccl_variant({}, "test"))
    assert result.status == "measured", result.error
    assert all(e["check"] == "ok" for e in result.sizes)
    entry = result.sizes[-1]
    assert entry["busbw_gbps"] == pytest.approx(entry["bytes"] / (entry["p50_us"] / 1e6) * 2 * 3 / 4 / 1e9)


def test_percentiles_and_bus_bandwidth():
    assert percentile([3, 1, 2, 4], 50) == 2.5 and percentile([5], 99) == 5
    assert percentile(list(range(101)), 99) == 99
    assert bus_bandwidth(1e9, 1.0, 2) == 1.0 and bus_bandwidth(1e9, 1.0, 8) == 1.75


# -- the search (a cost table in place of the timings) -------------------------------------------------------------


COST = {
    "NCCL_PROTO": {"LL": 0.5, "LL128": 0.9, "Simple": 3.0},
    "NCCL_ALGO": {"Ring": 0.9, "Tree": 1.2},
    "NCCL_MAX_NCHANNELS": {"2": 0.8, "16": 1.1},
    "NCCL_NTHREADS": {"256": 1.05},
    "NCCL_P2P_LEVEL": {"SYS": 0.95},
}


class Table:
    """Times from ``COST`` (a base time per size, times a factor per setting), recording what was asked."""

    def __init__(self, extra: dict | None = None, fail: str | None = None) -> None:
        self.asked: list[tuple[str, dict | None]] = []
        self.extra = extra or {}
        self.fail = fail

    def __call__(self, plan, variant, thresholds):
        self.asked.append((variant.name, thresholds))
        factor = self.extra.get(variant.impl, 1.0)
        for key, value in variant.env:
            factor *= COST.get(key, {}).get(value, 1.0)
        if variant.name == self.fail:
            return bench.VariantResult(variant, "failed", error="NCCL error: invalid usage")
        sizes = [
            {
                "tokens": t,
                "served": True,
                "p50_us": 10.0 * (1 + t / 64) * factor,
                "p99_us": 12.0 * (1 + t / 64) * factor,
            }
            for t in plan.tokens
        ]
        hopeless = thresholds and all(s["p50_us"] > thresholds[s["tokens"]] for s in sizes)
        return bench.VariantResult(variant, "dropped" if hopeless else "measured", sizes)


def table_plan(**kw) -> bench.BenchPlan:
    probe = {
        "gpus": [
            {"index": i, "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "capability": "12.0"}
            for i in range(2)
        ],
        "torch": "2.14.1+cu130",
        "nccl": "2.28.3",
        "sglang": "0.5.23",
        "flashinfer": "0.7.2",
        "sglang_custom_ar": None,
        "pcie_ipc": None,
    }
    args = dict(
        hidden=7168,
        tokens=(1, 8, 64),
        probe_result=probe,
        environ={},
        topology={"summary": "2 GPU(s); links PHB (PCIe only); peer access between every pair", "all_nvlink": False},
    )
    args.update(kw)
    return bench.plan_bench(**args)


def test_the_staged_search_walks_the_settings_and_drops_the_hopeless():
    table = Table(extra={"sglang-custom": 0.6, "pcie-ipc": 0.3})
    result = bench.run_bench(table_plan(), run=table)
    names = [name for name, _ in table.asked]
    assert names[:4] == ["NCCL defaults", "PROTO=LL", "PROTO=LL128", "PROTO=Simple"]
    assert names[4:6] == ["SGLang's custom all-reduce", "FlashInfer's PCIe-IPC all-reduce"]
    assert names[6:] == [
        "PROTO=LL ALGO=Ring",
        "PROTO=LL ALGO=Tree",
        "PROTO=LL ALGO=Ring MAX_NCHANNELS=2",
        "PROTO=LL ALGO=Ring MAX_NCHANNELS=16",
        "PROTO=LL ALGO=Ring MAX_NCHANNELS=2 NTHREADS=256",
        "PROTO=LL ALGO=Ring MAX_NCHANNELS=2 P2P_LEVEL=SYS",
    ]
    assert table.asked[0][1] is None  # the first has nothing to compare with
    assert table.asked[1][1] == {t: bench.DROP_FACTOR * 10.0 * (1 + t / 64) for t in (1, 8, 64)}
    assert {r.variant.name: r.status for r in result.results}["PROTO=Simple"] == "dropped"
    assert result.pick().variant.name == "PROTO=LL ALGO=Ring MAX_NCHANNELS=2 P2P_LEVEL=SYS"
    assert result.recipe_settings() == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_MAX_NCHANNELS": "2",
        "NCCL_NTHREADS": None,
        "NCCL_P2P_LEVEL": "SYS",
    }
    assert {t: r.variant.name for t, (r, _) in result.best_per_size().items()} == {
        t: "FlashInfer's PCIe-IPC all-reduce" for t in (1, 8, 64)
    }
    doc = result.to_json()
    assert doc["pick"]["variant"]["env"]["NCCL_PROTO"] == "LL" and doc["exhaustive"] is None
    assert [b["variant"] for b in doc["best_per_size"]] == ["FlashInfer's PCIe-IPC all-reduce"] * 3
    assert json.loads(json.dumps(doc))["plan"]["base_env"] == {"NCCL_NVLS_ENABLE": "0"}


def test_exhaustive_sweep_and_the_staged_pick_within_5_percent():
    table = Table()
    result = bench.run_bench(table_plan(exhaustive=True), run=table)
    ex = result.exhaustive
    assert ex["variants"] == 4 * 3 * 3 * 2 * 2
    assert ex["best"]["name"] == "PROTO=LL ALGO=Ring MAX_NCHANNELS=2 P2P_LEVEL=SYS"
    assert ex["within_5_percent"] is True and ex["staged_over_best"] == pytest.approx(1.0)
    assert len({name for name, _ in table.asked}) == len(table.asked)  # nothing timed twice
    assert all(th is None for name, th in table.asked[ex["staged_variants"] :])  # the sweep drops nothing


def test_peer_access_off_skips_sglang_and_the_p2p_level():
    plan = table_plan(environ={"NCCL_P2P_DISABLE": "1"})
    assert plan.peer_disabled and plan.extra == ()
    assert all("NCCL_P2P_DISABLE is set" in why for _, why in plan.skipped)
    table = Table()
    bench.run_bench(plan, run=table)
    assert not any("P2P_LEVEL" in name for name, _ in table.asked)
    assert any("stand-in" in note for note in plan.notes)


def test_the_budget_stops_the_search_and_a_failed_variant_is_reported():
    table = Table(fail="PROTO=LL128")
    result = bench.run_bench(table_plan(budget_s=1e-9), run=table)
    assert result.stopped_at_budget and [name for name, _ in table.asked] == ["NCCL defaults"]
    result = bench.run_bench(table_plan(), run=Table(fail="PROTO=LL128"))
    failed = {r.variant.name: r for r in result.results}["PROTO=LL128"]
    assert failed.status == "failed" and failed.error == "NCCL error: invalid usage"


def test_without_two_gpus_nothing_runs():
    plan = table_plan(probe_result={"gpus": [], "why_no_gpu": "torch.cuda.is_available() is False"})
    assert plan.problem == f"0 CUDA GPU(s) visible to {sys.executable} (torch.cuda.is_available() is False)"
    with pytest.raises(MissingDependency, match="two or more CUDA GPUs") as info:
        bench.run_bench(plan, run=Table())
    assert info.value.exit_code == 9


# -- writing the pick into a recipe -------------------------------------------------------------------------------


def test_the_pick_is_written_into_the_recipe_with_its_provenance(tmp_path):
    path = tmp_path / f"{KIMI}.toml"
    original = find_recipe(KIMI).path.read_text()
    path.write_text(original)
    recipe = load_recipe(path)
    result = bench.run_bench(table_plan(recipe_env={s.name: s.value for s in recipe.env}), run=Table())
    update = recipe_edit.plan_env_update(recipe, result.recipe_settings(), result.recipe_notes())
    assert path.read_text() == original  # planning writes nothing
    assert update.set == {"NCCL_MAX_NCHANNELS": "2"} and update.removed == ("NCCL_NTHREADS",)
    assert set(update.unchanged) == {"NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL"}
    backup = recipe_edit.write_env_update(update)
    assert backup.read_text() == original
    written = load_recipe(path)
    env = {s.name: s.value for s in written.env}
    assert env["NCCL_PROTO"] == "LL" and env["NCCL_MAX_NCHANNELS"] == "2" and "NCCL_NTHREADS" not in env
    assert env["NCCL_BUFFSIZE"] == "16777216" and env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    measured = written.notes["NCCL_PROTO"].measured
    assert measured.startswith("measured by sm120kit ") and "bench-allreduce on 20" in measured
    for part in (
        "2x NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "links PHB (PCIe only)",
        "NCCL 2.28.3",
        "torch 2.14.1+cu130",
        "SGLang 0.5.23",
        "FlashInfer 0.7.2",
        "1, 8, 64 tokens x 7168",
        "NCCL_NVLS_ENABLE=0",
    ):
        assert part in measured, part
    assert written.notes["NCCL_BUFFSIZE"].measured.startswith("not measured")  # not varied: left as it was
    assert "NCCL_NTHREADS" not in written.notes
    assert "# DeepSeek-V3-class MLA + MoE model" in path.read_text()  # comments stay


def test_a_recipe_update_that_would_not_load_writes_nothing(tmp_path):
    path = tmp_path / f"{KIMI}.toml"
    path.write_text(find_recipe(KIMI).path.read_text())
    recipe = load_recipe(path)
    with pytest.raises(RecipeError, match="No note was given for NCCL_PROTO"):
        recipe_edit.plan_env_update(recipe, {"NCCL_PROTO": "LL"}, {})
    bad = {"NCCL_PROTO": {"why": "x", "sources": ["http://not-https"], "measured": "m"}}
    with pytest.raises(RecipeError, match="would leave a recipe that does not load"):
        recipe_edit.plan_env_update(recipe, {"NCCL_PROTO": "LL"}, bad)
    link = tmp_path / "link" / f"{KIMI}.toml"
    link.parent.mkdir()
    link.symlink_to(path)
    update = recipe_edit.plan_env_update(load_recipe(link), {"NCCL_ALGO": None}, {})
    with pytest.raises(RecipeError, match="symbolic link"):
        recipe_edit.write_env_update(update)
    assert load_recipe(path).env == recipe.env


# -- the command line ------------------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sm120kit", "bench-allreduce", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_COLOR="1"),
    )


@pytest.mark.slow
def test_the_command_exits_9_without_two_gpus_and_plans_anywhere():
    proc = _cli("--recipe", KIMI, "--json")
    assert proc.returncode == 9, proc.stderr[-2000:]
    error = json.loads(proc.stdout)
    assert error["error"] == "missing-dependency" and "0 CUDA GPU(s) visible to" in error["message"]
    assert "Nothing was run" in error["message"] and "error: bench-allreduce times all-reduces" in proc.stderr
    plan = json.loads(_cli("--recipe", KIMI, "--dry-run", "--json").stdout)["plan"]
    assert plan["hidden"] == 7168 and plan["tokens"] == [1, 8, 64]
    assert plan["bytes"] == {"1": 14336, "8": 114688, "64": 917504}
    assert plan["extra"][0]["env"]["NCCL_PROTO"] == "LL" and plan["base_env"]["NCCL_NVLS_ENABLE"] == "0"
    assert plan["problem"].startswith("0 CUDA GPU(s)")
    usage = _cli("--write-recipe", "--hidden", "4096")
    assert usage.returncode == 2 and "--write-recipe needs --recipe" in usage.stderr
    assert _cli("--tokens", "1,x").returncode == 2
