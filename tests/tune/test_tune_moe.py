"""``sm120kit tune-moe``: the plan (search space cut at the clamp's shared-memory bound, destination folder and
file name), the refusal without a 12.x GPU, and writing the tuning output.

This machine has no GPU. Where a run needs one, two stand-ins take the place of the hardware and say so:
a probe answering as an RTX PRO 6000 Blackwell (12.0) would, and a fake tuning script that behaves like
SGLang's (same arguments, reads the model's config.json and the search space, writes its table into its
working folder under SGLang's file name) but picks configs instead of timing them on the card. Everything
else is real: released SGLang trees, the series, the runner and the CLI.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from sm120kit.cli import main
from sm120kit.errors import MissingDependency
from sm120kit.hardware.arch import SM120_SHARED_MEMORY_PER_BLOCK
from sm120kit.patching.series import load_series
from sm120kit.sglang.target import find_target
from sm120kit.tune import moe as tune_moe

REPO = REPO_ROOT
WORKSTATION = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
QWEN3_30B_FP8 = [
    "-E",
    "128",
    "--intermediate-size",
    "768",
    "--topk",
    "8",
    "--hidden-size",
    "2048",
    "--tp",
    "2",
    "--dtype",
    "fp8_w8a8",
    "--block-shape",
    "128,128",
]

# Stands in for SGLang's tuning script on a GPU this machine lacks: the real script's arguments and output
# file, but the "fastest" config is simply the first of the search space that the batch size can use.
FAKE_TUNING_SCRIPT = """
import argparse, json, os
DEVICE = os.environ.get("FAKE_GPU_NAME", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition")
p = argparse.ArgumentParser()
p.add_argument("--model"); p.add_argument("--tp-size", type=int); p.add_argument("--dtype", default="auto")
p.add_argument("--per-channel-quant", action="store_true"); p.add_argument("--tune", action="store_true")
p.add_argument("--batch-size", type=int); p.add_argument("--batch-sizes", type=int, nargs="+")
p.add_argument("--search-space-file")
a = p.parse_args()
cfg = json.load(open(os.path.join(a.model, "config.json")))
space = json.load(open(a.search_space_file))
sizes = a.batch_sizes or ([a.batch_size] if a.batch_size else [1, 64, 4096])
block = cfg.get("quantization_config", {}).get("weight_block_size")
name = "E=%d,N=%d,device_name=%s" % (cfg["num_local_experts"], cfg["intermediate_size"] // a.tp_size,
                                      DEVICE.replace(" ", "_"))
name += (",dtype=" + a.dtype if a.dtype != "auto" else "") + (",block_shape=%s" % block if block else "")
table = {str(m): next(c for c in space if c["BLOCK_SIZE_M"] >= min(m, 128)) for m in sizes}
print("Writing best config to %s..." % name)
json.dump(table, open(name + ".json", "w"), indent=4)
"""


def _stand_in_for_sm120_gpu(python):
    """Stands in for the probe on a 12.0 GPU (this machine has none)."""
    return tune_moe.TargetGpu(WORKSTATION, (12, 0)), None


def _stand_in_for_h200(python):
    """Stands in for the probe on a Hopper GPU (this machine has none)."""
    return tune_moe.TargetGpu("NVIDIA H200", (9, 0)), None


@pytest.fixture
def fake_script(tmp_path):
    path = tmp_path / "fake-sglang" / tune_moe.SCRIPT_IN_REPO
    path.parent.mkdir(parents=True)
    path.write_text(FAKE_TUNING_SCRIPT)
    return path


def _shape(**kw):
    base = dict(
        experts=128, intermediate_size=768, topk=8, hidden_size=2048, tp=2, dtype="fp8_w8a8", block_shape=(128, 128)
    )
    base.update(kw)
    return tune_moe.MoeShape(**base)


# -- the bound and the search space --------------------------------------------------------------------------


def test_bound_is_the_clamps_estimate():
    """The same estimate as scripts/gen_moe_configs.py and the patch's clamp, for every config of the grid."""
    spec = importlib.util.spec_from_file_location("gen_moe_configs", REPO / "scripts" / "gen_moe_configs.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.SM120_SHARED_MEMORY_PER_BLOCK == SM120_SHARED_MEMORY_PER_BLOCK
    clamp = (REPO / "patches/sglang/sm120-moe-configs/0.5.11.diff").read_text()
    assert 'copies * c["BLOCK_SIZE_K"] * rows * elem_bytes' in clamp
    for dtype in (None, "fp8_w8a8", "int8_w8a8", "float32", "int4_w4a16"):
        assert tune_moe.element_bytes(dtype) == gen.element_bytes(dtype)
        for config in tune_moe.search_space("auto", None, limit=10**9)[0][::37]:
            assert tune_moe.pipelined_shared_memory(config, dtype) == gen.pipelined_shared_memory(
                config, gen.element_bytes(dtype)
            )


def test_search_space_keeps_what_fits_and_drops_what_does_not():
    kept, over = tune_moe.search_space("auto", None)
    assert len(kept) + over == 1920  # SGLang's CUDA grid
    assert all(tune_moe.pipelined_shared_memory(c, None) <= SM120_SHARED_MEMORY_PER_BLOCK for c in kept)
    # 4 stages x K 128 x (M 128 + N 256) x 2 B = 294912 B: over. 2 stages x 64 x (64 + 128) x 2 = 24576 B: fits.
    big = {
        "BLOCK_SIZE_M": 128,
        "BLOCK_SIZE_N": 256,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 16,
        "num_warps": 8,
        "num_stages": 4,
    }
    small = {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 16,
        "num_warps": 4,
        "num_stages": 2,
    }
    assert big not in kept and small in kept
    # FP8 halves the bytes: 3 stages x 128 x (128 + 128) x 1 = 65536 B fits there, not in bf16 (131072 B).
    fp8_fit = dict(big, BLOCK_SIZE_N=128, num_stages=3)
    assert fp8_fit in tune_moe.search_space("fp8_w8a8", None)[0] and fp8_fit not in kept


# -- the plan (dry run) ----------------------------------------------------------------------------------------


def test_dry_run_plan_on_a_machine_without_gpu(release_dir, fake_script, capsys):
    """Real probe (this machine: no CUDA GPU): the plan is printed all the same, the file name waits for the GPU's."""
    tree = release_dir("0.5.23")
    with pytest.raises(SystemExit) as stop:
        main(["tune-moe", str(tree), "--script", str(fake_script), *QWEN3_30B_FP8, "--dry-run", "--json"])
    assert stop.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    plan = doc["plan"]
    assert doc["dry_run"] is True and plan["gpu"] is None and plan["gpu_problem"]
    assert plan["folder"] == "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_3_1"
    assert plan["file_name"] == "E=128,N=384,device_name=<GPU_name>,dtype=fp8_w8a8,block_shape=[128, 128].json"
    space = plan["search_space"]
    assert space["restricted"] and space["limit_bytes"] == 101376 and space["element_bytes"] == 1
    assert space["size"] == len(space["configs"]) > 0 and space["excluded_over_limit"] > 0
    assert all(c["BLOCK_SIZE_K"] in (64, 128) for c in space["configs"])  # divides the 128 quantization block
    assert all(tune_moe.pipelined_shared_memory(c, "fp8_w8a8") <= 101376 for c in space["configs"])
    over = {
        "BLOCK_SIZE_M": 256,
        "BLOCK_SIZE_N": 256,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 8,
        "num_stages": 3,
    }  # 2 x 128 x 512 x 1 = 131072 B
    fits = dict(over, BLOCK_SIZE_M=64, BLOCK_SIZE_N=64)  # 2 x 128 x 128 = 32768 B
    assert over not in space["configs"] and fits in space["configs"]
    assert "--search-space-file" in plan["command"] and "--dtype fp8_w8a8" in plan["command"]
    assert plan["command"].split()[1] == str(fake_script.resolve())


def test_plan_names_the_device_file_and_the_older_folder(release_dir, fake_script):
    """Before 0.5.11 the series writes beside fused_moe_triton/; with a 12.x GPU the file carries its name and
    matches the series' own rule-derived file, which it replaces."""
    target = find_target(release_dir("0.5.10"))
    plan = tune_moe.plan_tuning(
        target, script=fake_script, shape=_shape(tp=2, intermediate_size=768), probe=_stand_in_for_sm120_gpu
    )
    assert plan.gpu_problem is None
    assert plan.folder == "sglang/srt/layers/moe/fused_moe_triton/configs/triton_3_3_1"
    assert (
        plan.file_name
        == f"E=128,N=384,device_name={WORKSTATION.replace(' ', '_')},dtype=fp8_w8a8,block_shape=[128, 128].json"
    )
    series_paths = {p for v in load_series().get("sm120-moe-configs").variants for p in v.paths}
    assert any(p.endswith(plan.file_name) for p in series_paths)  # the series ships a file of this name


def test_old_script_without_search_space_file(release_dir, tmp_path):
    old = tmp_path / "tuning_fused_moe_triton.py"
    old.write_text("import argparse\n# an SGLang before 0.5.16: --tune, --batch-size, no search space option\n")
    plan = tune_moe.plan_tuning(
        find_target(release_dir("0.5.23")), script=old, shape=_shape(), probe=_stand_in_for_sm120_gpu
    )
    assert not plan.search_space_file and "--search-space-file" not in plan.argv("m", None)
    assert any("0.5.16" in note for note in plan.notes)


# -- the refusal ------------------------------------------------------------------------------------------------


def test_refuses_without_a_12x_gpu(release_dir, fake_script):
    """Through `python -m sm120kit`, with the real probe: this machine's torch sees no CUDA GPU."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sm120kit",
            "tune-moe",
            str(release_dir("0.5.23")),
            "--script",
            str(fake_script),
            *QWEN3_30B_FP8,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == MissingDependency.exit_code == 9, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["error"] == "missing-dependency"
    assert "compute capability 12.x" in doc["message"] and "Nothing was run or written" in doc["message"]
    assert "Traceback" not in proc.stderr and "\n\n" not in doc["message"]


def test_refuses_a_gpu_of_another_family(release_dir, fake_script):
    plan = tune_moe.plan_tuning(
        find_target(release_dir("0.5.23")), script=fake_script, shape=_shape(), probe=_stand_in_for_h200
    )
    with pytest.raises(MissingDependency, match=r"NVIDIA H200 \(9\.0\), not an SM120-family GPU"):
        tune_moe.run_tuning(plan)


# -- the run, with the stand-ins for the GPU ----------------------------------------------------------------------


def test_run_writes_measured_file_where_the_series_puts_configs(
    installed_tree, fake_script, tmp_path, monkeypatch, capsys
):
    package = installed_tree("0.5.23", link=True)  # tune-moe adds new files (write_atomic), edits none
    monkeypatch.setattr(tune_moe, "probe_gpu", _stand_in_for_sm120_gpu)
    with pytest.raises(SystemExit) as stop:
        main(
            [
                "tune-moe",
                str(package),
                "--script",
                str(fake_script.parents[3]),
                *QWEN3_30B_FP8,
                "--batch-size",
                "1",
                "--batch-size",
                "512",
                "--work-dir",
                str(tmp_path / "work"),
                "--json",
            ]
        )
    assert stop.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    name = f"E=128,N=384,device_name={WORKSTATION.replace(' ', '_')},dtype=fp8_w8a8,block_shape=[128, 128].json"
    folder = package / "srt/layers/moe/moe_runner/triton_utils/configs/triton_3_3_1"
    assert doc["dry_run"] is False and doc["written"] == str(folder / name)
    table = json.loads((folder / name).read_text())
    assert sorted(table, key=int) == ["1", "512"] and doc["batch_sizes"] == [1, 512]
    assert all(tune_moe.pipelined_shared_memory(c, "fp8_w8a8") <= 101376 for c in table.values())
    assert doc["over_limit"] == []
    provenance = json.loads((folder / (name + ".provenance")).read_text())
    assert provenance["values"] == "measured" and provenance["gpu"]["capability"] == "12.0"
    assert provenance["sglang"]["version"] == "0.5.23" and provenance["search_space"]["limit_bytes"] == 101376
    # SGLang and the audit read every *.json in the folder as a config table; the sidecar is not one.
    assert not (folder / (name + ".provenance")).name.endswith(".json")
    space = json.loads((Path(doc["work_dir"]) / "search_space.json").read_text())
    assert len(space) == doc["plan"]["search_space"]["size"]


def test_run_stops_when_the_script_writes_another_shape(installed_tree, fake_script, tmp_path, monkeypatch):
    """The model the script read disagrees with the shape options: nothing is written into the tree."""
    package = installed_tree("0.5.23", link=True)  # tune-moe adds new files (write_atomic), edits none
    monkeypatch.setenv("FAKE_GPU_NAME", "NVIDIA GeForce RTX 5090")  # the script sees another card than the probe
    plan = tune_moe.plan_tuning(
        find_target(package), script=fake_script, shape=_shape(), batch_sizes=(8,), probe=_stand_in_for_sm120_gpu
    )
    with pytest.raises(tune_moe.CheckFailed, match="not E=128,N=384"):
        tune_moe.run_tuning(plan, work_dir=tmp_path / "work")
    assert not plan.destination.exists()
