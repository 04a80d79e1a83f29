"""The shared-memory audit reports a fused-MoE case SGLang's own weight loader refuses as not applicable.

SGLang's FP8 block-quantized MoE loader (``Fp8MoEMethod.create_weights`` in srt/layers/quantization/fp8.py)
raises when the intermediate size per partition is not a multiple of block_n (and, with tensor parallelism,
of block_k). Config files such as ``E=128,N=192,...,block_shape=[128, 128]`` describe such a shape: the audit
once reported each of their cases as a compile error (the launcher's scale-shape assertion), 108 of them on
the patched 0.5.23. The rule is read from each release's own fp8.py. Releases are the real ones from PyPI;
no case here reaches a compile (not-applicable cases start no probe).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from sm120kit.audit import moe_loader
from sm120kit.sglang import launchers, releases

pytest.importorskip("torch")
pytest.importorskip("triton")

from sm120kit.cli import main as cli_main  # noqa: E402

FP8_BLOCK_FILE = (
    "E=128,N=192,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition,dtype=fp8_w8a8,"
    "block_shape=[128, 128].json"
)
CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}


@pytest.mark.parametrize("version", ["0.5.2", "0.5.8", "0.5.17", "0.5.23"])
def test_the_rule_is_read_from_each_releases_loader(version):
    root = releases.fetch_release(version)
    rule = moe_loader.fp8_block_rule(root)
    assert rule is not None and rule.block_k_needs_tp
    lines = (root / moe_loader.FP8_METHOD_FILE).read_text().splitlines()
    assert "% block_n != 0" in lines[rule.block_n_line - 1] and "% block_k != 0" in lines[rule.block_k_line - 1]
    reason = rule.rejection(192, [128, 128])
    assert f"fp8.py:{rule.block_n_line}" in reason and "192" in reason and "block_n = 128" in reason
    for fits in (128, 256, 384, 768, 2048):
        assert rule.rejection(fits, [128, 128]) is None
    assert rule.rejection(192, None) is None  # not block-quantized: the loader does not check
    assert rule.rejection(192, [64, 128]) is None  # block_n 64 divides 192; block_k only matters at TP > 1


def test_a_tree_without_the_check_or_with_an_unsafe_file_rules_nothing_out(tmp_path):
    root = tmp_path / "site"
    target = root / moe_loader.FP8_METHOD_FILE
    target.parent.mkdir(parents=True)
    assert moe_loader.fp8_block_rule(root) is None  # no fp8.py
    target.write_text("def create_weights(intermediate_size_per_partition):\n    pass\n")
    assert moe_loader.fp8_block_rule(root) is None  # the check is gone: cases run, the launcher decides
    real = tmp_path / "elsewhere.py"
    shutil.copy(releases.fetch_release("0.5.23") / moe_loader.FP8_METHOD_FILE, real)
    target.unlink()
    target.symlink_to(real)
    assert moe_loader.fp8_block_rule(root) is None  # a link is not followed
    target.unlink()
    os.mkfifo(target)
    assert moe_loader.fp8_block_rule(root) is None  # nor a FIFO read (it would block)


def _tree_with_only(tmp_path: Path, version: str, files: dict[str, dict]) -> Path:
    """A copy of ``version`` whose only fused-MoE config files for 12.x device names are ``files``."""
    site = tmp_path / "site-packages"
    shutil.copytree(releases.fetch_release(version), site)
    folder = launchers.resolve(site, "moe").files[1].parent / "configs"
    for path in folder.rglob("*.json"):
        if any(name in path.name for name in ("Blackwell", "RTX_5090", "GB10")):
            path.unlink()
    for name, table in files.items():
        (folder / "triton_3_3_1").mkdir(exist_ok=True)
        (folder / "triton_3_3_1" / name).write_text(json.dumps(table))
    return site


def test_audit_reports_the_refused_shape_as_not_applicable_and_passes(tmp_path, capsys):
    site = _tree_with_only(tmp_path, "0.5.2", {FP8_BLOCK_FILE: {"1": CONFIG, "64": CONFIG}})
    matrix = tmp_path / "m.toml"
    matrix.write_text(
        '[[moe]]\nname = "glm-air-tp4"\nnum_experts = 128\ntop_k = 8\nhidden_size = 4096\n'
        'intermediate_size = 352\nquantizations = ["fp8_block"]\ntokens = [16]\n'
    )
    with pytest.raises(SystemExit) as audited:
        cli_main(
            [
                "audit",
                str(site / "sglang"),
                "--arch",
                "12.0",
                "--launcher",
                "moe",
                "--matrix",
                str(matrix),
                "--only",
                "glm-air-tp4",
                "--tuned-moe-configs",
                "--json",
            ]
        )
    doc = json.loads(capsys.readouterr().out)
    assert audited.value.code == 0 and doc["ok"] is True
    assert doc["summary"]["not_applicable"] == 3 == len(doc["cases"]) and doc["summary"]["errors"] == 0
    assert doc["summary"]["compiled"] == 0 and doc["summary"]["kernels"] == 0  # no probe was started
    by_model = {c["model"]: c for c in doc["cases"]}
    assert set(by_model) == {"tuned-E128-N192", "glm-air-tp4"}
    for case in doc["cases"]:
        assert case["status"] == "not-applicable" and not case["kernels"] and case["error"] is None
        assert "sglang/srt/layers/quantization/fp8.py:556" in case["note"]  # 0.5.2's line
    assert "intermediate size per partition of 192" in by_model["tuned-E128-N192"]["note"]
    assert "intermediate size per partition of 352" in by_model["glm-air-tp4"]["note"]

    with pytest.raises(SystemExit) as table:
        cli_main(
            [
                "audit",
                str(site / "sglang"),
                "--arch",
                "12.0",
                "--launcher",
                "moe",
                "--matrix",
                str(matrix),
                "--only",
                "glm-air-tp4",
                "--tuned-moe-configs",
            ]
        )
    out = capsys.readouterr().out
    assert table.value.code == 0
    assert "not-applicable: SGLang's FP8 block-quantized MoE loader refuses" in out
    assert out.rstrip().splitlines()[-1].startswith("PASS: 0 kernel(s) from 3 launcher call(s) on 12.0")
    assert "3 not applicable (SGLang's loader refuses the shape)" in out
