"""``sm120kit tune-mla``: the plan, the rule that picks a build, the worker and the command line.

The timing needs a CUDA GPU, which this machine lacks: the worker runs for real here and must report that torch
sees none, and the command must then exit 9 and say why. The rule that turns the worker's times and errors into
what to set is arithmetic over its RESULT.json, whatever measured it, so it is tested on results written here in
that form (the GPU part, and so these figures, are not measured). The candidates' build flags are the kernels'
own: each compiles with NVRTC (tests/kernels/test_mla_kernels.py compiles the flags at both ends of their
ranges) and is one the kernels take from SGLANG_SM120_MLA_DEFINES.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sm120kit.errors import MissingDependency, ToolFailed, UsageError
from sm120kit.tune import mla as tune
from sm120kit.util.resources import data_dir


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sm120kit", "tune-mla", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_COLOR="1"),
    )


# -- the plan --------------------------------------------------------------------------------------------------------


def test_the_plan_crosses_lengths_batches_and_heads_and_leaves_out_what_the_heads_never_run():
    plan = tune.plan_tune(kv="fp8", heads=[8])
    assert [c.key for c in plan.cases] == [f"{p}x{b}x8:fp8" for b in tune.DEFAULT_BATCHES for p in tune.DEFAULT_LENGTHS]
    # 8 heads: a decode program holds 8 rows or fewer, so the two-block body's flags change nothing it runs
    assert [c.name for c in plan.candidates] == ["shipped", "fp8-mma path"]
    plan16 = tune.plan_tune(kv="fp8", heads=[16, 16, 8], lengths=[185000], batches=[4])
    assert [c.key for c in plan16.cases] == ["185000x4x16:fp8", "185000x4x8:fp8"]
    assert [c.name for c in plan16.candidates] == ["shipped", "DECODE16_MAX_SPLIT=2048", "DECODE16=0", "fp8-mma path"]
    bf16 = tune.plan_tune(kv="bf16", heads=[16])
    assert not any(c.fp8_mma for c in bf16.candidates)
    spec = plan16.spec()
    assert spec["cases"] == [[185000, 4, 16, "fp8", 0], [185000, 4, 8, "fp8", 0]] and spec["kv_scale"] == 0.5
    verify = tune.plan_tune(kv="fp8", heads=[8], lengths=[32768], batches=[1], drafts=[4, 4, 8])
    assert [(c.key, c.label) for c in verify.cases] == [
        ("32768x1x8:fp8", "32k b1"),
        ("32768x1x8d4:fp8", "32k b1 d4"),
        ("32768x1x8d8:fp8", "32k b1 d8"),
    ]
    assert spec["candidates"][1] == {
        "name": "DECODE16_MAX_SPLIT=2048",
        "defines": ["DECODE16_MAX_SPLIT=2048"],
        "fp8_mma": False,
    }


def test_every_candidates_flags_are_ones_the_kernels_take_from_the_environment():
    from sm120_attention import sm120_mla_mma as mma

    assert tune.DEFINES_ENV == mma.DEFINES_ENV and tune.FP8_MMA_ENV == mma.FP8_MMA_ENV
    for kv, candidates in tune.CANDIDATES.items():
        assert candidates[0][:3] == ("shipped", (), False), kv
        for name, defines, fp8_mma, _ in candidates:
            assert mma.parse_tunables(",".join(defines)) == defines, name
            assert not (fp8_mma and kv != "fp8"), name


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        (dict(kv="fp8", heads=[0]), "--heads 0"),
        (dict(kv="fp8", heads=[8], lengths=[0, 8192]), "--lengths 0,8192"),
        (dict(kv="fp8", heads=[8], batches=[1000]), "--batch 1000"),
        (dict(kv="fp8", heads=[]), "--heads (none)"),
        (dict(kv="fp8", heads=[8], drafts=[0]), "--drafts 0"),
    ],
)
def test_the_plan_refuses_values_the_kernels_do_not_serve(kwargs, flag):
    with pytest.raises(UsageError) as info:
        tune.plan_tune(**kwargs)
    assert info.value.message.startswith(flag + ": each value must be a whole number from"), info.value.message
    with pytest.raises(UsageError, match="--kv-dtype 'fp16'"):
        tune.plan_tune(kv="fp16", heads=[8])


# -- the rule --------------------------------------------------------------------------------------------------------


def _result(plan, times: dict[str, list[float]], errors: dict[str, list[float]], sglang=None, failed=None):
    """The worker's RESULT.json for ``plan`` with these times and errors per candidate name (one per case)."""
    failed = failed or {}
    data = {
        "error": None,
        "device": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "capability": [12, 0],
        "versions": {"torch": "2.x"},
        "sglang": {
            c.key: ({"max_abs_err": sglang[i]} if sglang and sglang[i] is not None else {"error": "no SGLang"})
            for i, c in enumerate(plan.cases)
        },
        "candidates": [
            {
                "name": cand.name,
                "error": failed.get(cand.name),
                "cases": []
                if cand.name in failed
                else [
                    {"case": c.key, "ms": times[cand.name][i], "max_abs_err": errors[cand.name][i]}
                    for i, c in enumerate(plan.cases)
                ],
            }
            for cand in plan.candidates
        ],
    }
    return tune.result_from(plan, json.loads(json.dumps(data)))


PLAN16 = tune.plan_tune(kv="fp8", heads=[16], lengths=[32768, 131072], batches=[1])
SHIPPED = [0.0200, 0.0450]
EXACT = [0.0010, 0.0010]


def test_a_faster_build_flag_is_picked_and_named_for_the_environment():
    result = _result(
        PLAN16,
        {
            "shipped": SHIPPED,
            "DECODE16_MAX_SPLIT=2048": [0.0190, 0.0430],
            "DECODE16=0": [0.0200, 0.0455],
            "fp8-mma path": SHIPPED,
        },
        {
            "shipped": EXACT,
            "DECODE16_MAX_SPLIT=2048": [0.0011, 0.0010],
            "DECODE16=0": EXACT,
            "fp8-mma path": [0.05, 0.05],
        },
        sglang=[0.06, 0.06],
    )
    verdicts = {v.name: v for v in result.verdicts()}
    assert verdicts["DECODE16_MAX_SPLIT=2048"].ok and verdicts["DECODE16_MAX_SPLIT=2048"].geomean == pytest.approx(
        (0.0200 / 0.0190 * 0.0450 / 0.0430) ** 0.5
    )
    assert not verdicts["DECODE16=0"].ok and "under 1.02x" in verdicts["DECODE16=0"].why
    assert not verdicts["fp8-mma path"].ok  # as fast as the shipped build: not past the margin
    assert result.pick().name == "DECODE16_MAX_SPLIT=2048"
    assert result.env() == {"SGLANG_SM120_MLA_DEFINES": "DECODE16_MAX_SPLIT=2048"}
    doc = result.to_json()
    assert doc["pick"] == "DECODE16_MAX_SPLIT=2048" and doc["sm120_card"] is True
    assert doc["env"] == {"SGLANG_SM120_MLA_DEFINES": "DECODE16_MAX_SPLIT=2048"}


def test_a_flag_slower_on_one_case_or_with_a_grown_error_is_not_picked():
    result = _result(
        PLAN16,
        {
            "shipped": SHIPPED,
            "DECODE16_MAX_SPLIT=2048": [0.0150, 0.0470],
            "DECODE16=0": [0.0150, 0.0400],
            "fp8-mma path": SHIPPED,
        },
        {"shipped": EXACT, "DECODE16_MAX_SPLIT=2048": EXACT, "DECODE16=0": [0.0010, 0.0040], "fp8-mma path": EXACT},
        sglang=[0.06, 0.06],
    )
    verdicts = {v.name: v for v in result.verdicts()}
    # 1.33x at 32k but 0.957x at 128k: the geometric mean passes, the slower case rules it out
    assert not verdicts["DECODE16_MAX_SPLIT=2048"].ok and "0.957x at 128k b1" in verdicts["DECODE16_MAX_SPLIT=2048"].why
    # flags change the order of sums only: an error of 0.004 against the shipped 0.001 is a defect
    assert "above the shipped build's bound (0.00300)" in verdicts["DECODE16=0"].why
    assert result.pick() is None and result.env() == {}


def test_the_fp8_mma_path_is_picked_only_within_sglangs_own_fp8_error_on_the_same_inputs():
    times = {
        "shipped": SHIPPED,
        "DECODE16_MAX_SPLIT=2048": SHIPPED,
        "DECODE16=0": SHIPPED,
        "fp8-mma path": [0.0150, 0.0300],
    }
    errors = {"shipped": EXACT, "DECODE16_MAX_SPLIT=2048": EXACT, "DECODE16=0": EXACT, "fp8-mma path": [0.050, 0.061]}
    within = _result(PLAN16, times, errors, sglang=[0.060, 0.068])
    assert within.pick().name == "fp8-mma path" and within.env() == {"SGLANG_SM120_MLA_FP8_MMA": "1"}
    above = {v.name: v for v in _result(PLAN16, times, errors, sglang=[0.060, 0.060]).verdicts()}["fp8-mma path"]
    assert not above.ok and "(0.0610) is above SGLang's fp8 kernel's (0.0600)" in above.why
    unknown = _result(PLAN16, times, errors, sglang=None)
    assert unknown.pick() is None
    assert "SGLang's fp8 kernel's error at 32k b1 is unknown (no SGLang)" in unknown.verdicts()[-1].why


def test_nothing_is_picked_where_the_shipped_build_or_a_candidate_failed():
    errors = {name: EXACT for name in ("shipped", "DECODE16_MAX_SPLIT=2048", "DECODE16=0", "fp8-mma path")}
    fast = {
        "shipped": SHIPPED,
        "DECODE16_MAX_SPLIT=2048": [0.01, 0.02],
        "DECODE16=0": [0.01, 0.02],
        "fp8-mma path": SHIPPED,
    }
    broken = _result(PLAN16, fast, errors, sglang=[0.06, 0.06], failed={"shipped": "CompileError: no NVRTC"})
    assert broken.pick() is None
    assert {v.why for v in broken.verdicts()} == {"the shipped build was not measured on every case"}
    one = _result(PLAN16, fast, errors, sglang=[0.06, 0.06], failed={"DECODE16=0": "RuntimeError: declined"})
    assert {v.name: v.why for v in one.verdicts()}["DECODE16=0"] == "RuntimeError: declined"
    assert one.pick().name == "DECODE16_MAX_SPLIT=2048"


def test_what_stopped_the_worker_becomes_the_error_of_its_kind():
    plan = tune.plan_tune(kv="fp8", heads=[8])
    with pytest.raises(MissingDependency, match="not a 12.x card. Nothing was timed"):
        tune.result_from(
            plan,
            {"error": "the GPU is NVIDIA H200 (compute capability 9.0), not a 12.x card", "error_kind": "environment"},
        )
    with pytest.raises(ToolFailed) as info:
        tune.result_from(plan, {"error": "OutOfMemoryError: CUDA out of memory", "error_kind": "cases"})
    assert info.value.exit_code == 11 and "stopped before timing anything: OutOfMemoryError" in info.value.message


# -- the worker and the command line ---------------------------------------------------------------------------------


def test_the_worker_runs_in_the_serving_python_and_says_it_sees_no_gpu(tmp_path):
    """The worker, started as the command starts it (its own interpreter, PYTHONPATH reaching sm120kit and the
    kernels' package), writes what stopped it: on this machine, no CUDA GPU; the run then raises MissingDependency
    (exit 9), and a bad command line gets the worker's usage (exit 2)."""
    plan = tune.plan_tune(kv="fp8", heads=[8], lengths=[8192], batches=[1], any_gpu=True)
    ticks = []
    with pytest.raises(MissingDependency) as info:
        tune.run_tune(plan, progress=lambda done, total, label: ticks.append((done, total, label)))
    assert info.value.exit_code == 9
    assert "torch sees no CUDA GPU. Nothing was timed." in info.value.message
    assert ticks == [(0, 2, "building the shipped kernels")]
    # the worker's own record: it reached the kernels' package that ships with this sm120kit
    (tmp_path / "spec.json").write_text(json.dumps(plan.spec()))
    env = dict(os.environ, **tune._worker_env(tmp_path))
    argv = [sys.executable, "-m", tune.WORKER, str(tmp_path / "spec.json"), str(tmp_path / "out.json")]
    assert subprocess.run(argv, env=env, cwd=tmp_path, timeout=300).returncode == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["error"] == "torch sees no CUDA GPU" and out["candidates"] == []
    kernels = Path(out["kernels"]).resolve()
    assert kernels == (data_dir("kernels") / "sm120_attention").resolve(), kernels
    usage = subprocess.run([sys.executable, "-m", tune.WORKER], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "usage: python -m sm120kit.tune.mla_worker" in usage.stderr


@pytest.mark.parametrize(
    "capability, sm120_mode", [((9, 0), True), ((10, 0), True), ((12, 0), False), ((12, 1), False)]
)
def test_on_a_gpu_that_is_not_12x_the_worker_holds_triton_to_mma_sync(capability, sm120_mode, tmp_path, monkeypatch):
    """--any-gpu on an H200 must time the Triton path as SM120 runs it (mma.sync, no wgmma): the worker sets
    DISABLE_MMA_V3=1 before it builds or times anything, records that it did, and the command says so. No GPU
    here: torch's device queries stand in for one of ``capability``, and the timing loop for the real one (it
    records the environment it was called in); the test says so."""
    import torch

    from sm120kit.tune import mla_worker

    # the worker sets the variable in this process's environment: setenv records the value before the test, so
    # it comes back after (left set, it would make every later Triton compile for sm_90 in this process drop wgmma)
    before = os.environ.get("DISABLE_MMA_V3")
    monkeypatch.setenv("DISABLE_MMA_V3", "")
    monkeypatch.delenv("DISABLE_MMA_V3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "stand-in GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    seen = {}

    def loop(torch_, ref, mla, spec, result, write, **kw):
        seen["env"] = os.environ.get("DISABLE_MMA_V3")

    monkeypatch.setattr(mla_worker, "time_candidates", loop)
    plan = tune.plan_tune(kv="fp8", heads=[8], lengths=[8192], batches=[1], any_gpu=True)
    (tmp_path / "spec.json").write_text(json.dumps(plan.spec()))
    mla_worker.measure(tmp_path / "spec.json", tmp_path / "out.json")
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["error"] is None and out["capability"] == list(capability)
    assert out["sm120_mode"] is sm120_mode
    assert seen["env"] == ("1" if sm120_mode else None)
    result = tune.result_from(plan, out)
    assert result.sm120_mode is sm120_mode and result.to_json()["sm120_mode"] is sm120_mode
    # the command's GPU line says where the answer came from
    from sm120kit.cli.tune import _show_tune_mla

    class Lines:
        def __init__(self):
            self.text = []

        def info(self, line):
            self.text.append(line)

        def table(self, headers, rows):
            self.text.append(" | ".join(headers))

    shown = Lines()
    _show_tune_mla(shown, result)
    gpu = shown.text[0]
    assert gpu.startswith("GPU: stand-in GPU")
    assert ("not an SM120 card: --any-gpu; Triton on mma.sync as on SM120, DISABLE_MMA_V3=1" in gpu) is sm120_mode
    assert ("not an SM120 card" in gpu) is sm120_mode
    monkeypatch.undo()
    assert os.environ.get("DISABLE_MMA_V3") == before


@pytest.mark.parametrize("kv, drafts", [("bf16", 0), ("fp8", 0), ("bf16", 3)])
def test_the_workers_cases_hold_the_values_as_a_view_of_the_keys(kv, drafts, monkeypatch):
    """As SGLang's MLA pool holds them, and as the CUDA kernels take them (a tensor of its own sends the call to
    the Triton kernels): the values are the first 512 dims of the keys' rows, for both KV dtypes, after the move
    to the device. No GPU here: a move to a device stands in as a copy, as a move to a GPU is."""
    import torch

    from sm120_attention import reference as ref
    from sm120kit.tune import mla_worker

    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        moved = real_to(self, *args, **kwargs)
        return moved.clone() if args and isinstance(args[0], torch.device) else moved

    monkeypatch.setattr(torch.Tensor, "to", to)

    c = mla_worker._case(torch, ref, 64, 2, 8, kv, drafts, 0.5, torch.device("cpu"), torch.bfloat16)
    assert c["v_pool"].data_ptr() == c["k_pool"].data_ptr() and c["v_pool"].stride() == c["k_pool"].stride()
    assert c["v_pool"].shape[-1] == 512 and c["k_pool"].dtype == (
        torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
    )


WORKER_ON_CPU = """
import json, os, sys
import torch
from sm120_attention import reference as ref
from sm120_attention import sm120_mla as mla
from sm120kit.tune import mla_worker

spec = json.loads(sys.argv[1])
result = {"error": None, "sglang": {}, "candidates": []}
installed = []

def install(defines):
    installed.append((defines, os.environ.get(mla.cuda_prefix.FP8_MMA_ENV)))

def timer(run, rep_ms):
    return 0.5

mla_worker.time_candidates(
    torch, ref, mla, spec, result, lambda: None,
    device=torch.device("cpu"), install=install, timer=timer, sync=lambda: None,
)
result["installed"] = installed
print(json.dumps(result))
"""


@pytest.mark.slow
def test_the_worker_checks_and_times_every_case_of_every_candidate_on_the_cpu(tmp_path, release_dir):
    """The worker's loop as the GPU runs it, on this machine's CPU: the decode call SGLang makes (here the kernels'
    Triton path in Triton's interpreter, as the CUDA kernels need a GPU; float16 queries, as the interpreter computes
    no bfloat16), each output against the float32 reference,
    SGLang 0.5.23's own decode kernel on the fp8 case (the release on the path, unpatched, as the worker finds it in
    a serving Python), each candidate installed in turn with its fp8-mma switch. Stand-ins,
    for the GPU this machine lacks: the build's install (recorded, not compiled and loaded) and the CUDA-graph timer
    (which gives 0.5 ms without running the call again)."""
    plan = tune.plan_tune(kv="fp8", heads=[16], lengths=[100], batches=[2], drafts=[3])
    spec = plan.spec()
    spec["cases"].append([40, 1, 8, "bf16"])  # the worker takes a case without drafts as decode
    candidates = [c for c in plan.candidates if c.name in ("shipped", "DECODE16_MAX_SPLIT=2048", "fp8-mma path")]
    spec["candidates"] = [c.to_json() for c in candidates]
    spec["dtype"] = "float16"  # Triton's interpreter computes no bfloat16 (it gives values of 1e8 and more)
    script = tmp_path / "worker_on_cpu.py"
    script.write_text(WORKER_ON_CPU)
    paths = tune._worker_env(tmp_path)["PYTHONPATH"] + os.pathsep + str(release_dir("0.5.23"))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=paths)
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(spec)], capture_output=True, text=True, env=env, timeout=1200
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[:-1] == [tune.DONE_MARK + c.name for c in candidates]
    result = json.loads(lines[-1])
    assert result["error"] is None
    assert result["installed"] == [[list(c.defines), "1" if c.fp8_mma else "0"] for c in candidates]
    keys = ["100x2x16:fp8", "100x2x16d3:fp8", "40x1x8:bf16"]
    assert keys[:2] == [c.key for c in plan.cases]
    for entry in result["candidates"]:
        assert entry["error"] is None, entry
        assert [c["case"] for c in entry["cases"]] == keys
        for case in entry["cases"]:
            assert case["ms"] == 0.5 and 0 < case["max_abs_err"] < 0.02, (entry["name"], case)
    # SGLang's own fp8 kernels (decode, and extend for verify) on the same inputs, the errors the fp8-mma path is
    # weighed against
    assert list(result["sglang"]) == keys[:2]
    for key in keys[:2]:
        assert 0 < result["sglang"][key]["max_abs_err"] < 0.05, result["sglang"]


@pytest.mark.slow
def test_the_command_exits_9_without_a_12x_gpu_and_plans_anywhere():
    proc = _cli("--heads", "8", "--json")
    assert proc.returncode == 9, proc.stderr[-2000:]
    error = json.loads(proc.stdout)
    assert error["error"] == "missing-dependency" and "torch sees no CUDA GPU" in error["message"]
    plan = json.loads(_cli("--heads", "16", "--lengths", "185000", "--dry-run", "--json").stdout)["plan"]
    assert plan["cases"] == [[185000, 1, 16, "fp8", 0], [185000, 4, 16, "fp8", 0]]
    assert [c["name"] for c in plan["candidates"]] == [
        "shipped",
        "DECODE16_MAX_SPLIT=2048",
        "DECODE16=0",
        "fp8-mma path",
    ]
    bad = _cli("--heads", "8", "--lengths", "8k")
    assert bad.returncode == 2 and "--lengths '8k': expected positive integers" in bad.stderr
    bad = _cli("--heads", "8", "--batch", "1,x")  # the option as typed, not the parameter it fills
    assert bad.returncode == 2 and "--batch '1,x': expected positive integers" in bad.stderr
    assert _cli("--heads", "200").returncode == 2
    assert _cli("--lengths", "8192").returncode == 2  # --heads is required
