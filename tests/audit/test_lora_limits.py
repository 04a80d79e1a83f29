"""LoRA kernels over 12.x's shared memory at non-default settings: the rule table names the setting and the
largest value that fits, and its figures are real Triton compiles for sm_120.

* The csgmv LoRA backend's shrink needs 147456 B at ``--max-lora-chunk-size 128`` (BLOCK_M = the chunk);
  64 is the largest chunk that fits. Where SGLang reads tuned csgmv tiles, a tile file with BLOCK_K 128 at chunk
  128 fits: SGLang's own arguments allow a fitting tile there.
* The experimental LoRA kernels (``trtllm_lora_temp``, ``SGLANG_EXPERIMENTAL_LORA_OPTI``) have fixed tiles: the
  shrink is over from rank 22 (qkv stacks 3 ranks into one power-of-two tile), the expand and the
  virtual-experts MoE shrink at rank 128; 21 is the largest ``--max-lora-rank`` that fits them all.

The figures are compiled again here from SGLang's own launchers (tests/support/lora_smem_probe.py: a faked 12.0
device stands in for the RTX PRO 6000 this machine lacks, Triton compiles for sm_120, nothing runs). The rule
conditions are evaluated on the real release source; ``explain`` runs SGLang's real argument resolution.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import SUPPORT_DIR

from sm120kit.audit import slow_settings
from sm120kit.audit.slow_settings import (
    CSGMV_LARGEST_FITTING_CHUNK,
    CSGMV_SHRINK_BYTES,
    CSGMV_TUNED_128,
    EXP_EXPAND_BYTES,
    EXP_LARGEST_FITTING_RANK,
    EXP_MOE_SHRINK_BYTES,
    EXP_SHRINK_BYTES,
    OVER_SMEM,
)
from sm120kit.hardware.arch import SM120_SHARED_MEMORY_PER_BLOCK as LIMIT

PROBE = SUPPORT_DIR / "lora_smem_probe.py"
EXPERIMENTAL = {"SGLANG_EXPERIMENTAL_LORA_OPTI": "1"}


def _find(release_dir, version: str, given: dict, env: dict | None = None, capability: str = "12.0"):
    ctx = slow_settings.Context(
        release=version,
        capability=capability,
        package_dir=release_dir(version) / "sglang",
        given=given,
        values={},
        env=env or {},
        attention="mha",
        sm_count=188,
    )
    return {f.rule: f for f in slow_settings.find(ctx) if f.severity == OVER_SMEM}


# -- the rules on real release source -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.5", "0.5.12", "0.5.23"])
def test_csgmv_chunk_rule_names_the_setting_and_the_largest_chunk_that_fits(release_dir, version):
    lora = {"lora_paths": ["adapter=/models/adapter"]}
    found = _find(release_dir, version, {**lora, "max_lora_chunk_size": 128})
    finding = found["lora-csgmv-chunk-over-smem"]
    assert (finding.setting, finding.value, finding.largest_fitting) == ("--max-lora-chunk-size", "128", "64")
    assert "147456 B" in finding.why and f"--max-lora-chunk-size {CSGMV_LARGEST_FITTING_CHUNK}" in finding.fix
    assert "found in this tree at sglang/" in finding.source and "lora_smem_probe.py" in finding.source
    assert not _find(release_dir, version, {**lora, "max_lora_chunk_size": 64})
    assert not _find(release_dir, version, {"max_lora_chunk_size": 128})  # LoRA is off: the chunk is not used
    assert not _find(release_dir, version, {**lora, "max_lora_chunk_size": 128, "lora_backend": "triton"})
    assert not _find(release_dir, version, {**lora, "max_lora_chunk_size": 128}, capability="9.0")


def test_csgmv_rule_follows_the_backend_each_release_defaults_to(release_dir):
    # 0.5.3 and 0.5.4 default --lora-backend to triton (the chunk size is unused); csgmv from 0.5.5
    assert not _find(release_dir, "0.5.3", {"lora_paths": ["a=/a"], "max_lora_chunk_size": 128})
    assert _find(release_dir, "0.5.3", {"lora_paths": ["a=/a"], "max_lora_chunk_size": 128, "lora_backend": "csgmv"})


def test_experimental_lora_rule_names_the_largest_rank_that_fits(release_dir):
    lora = {"lora_paths": ["a=/a"]}
    found = _find(release_dir, "0.5.23", {**lora, "max_lora_rank": 32}, EXPERIMENTAL)
    finding = found["lora-experimental-rank-over-smem"]
    assert (finding.setting, finding.value, finding.largest_fitting) == ("--max-lora-rank", "32", "21")
    assert "SGLANG_EXPERIMENTAL_LORA_OPTI" in finding.fix and "--max-lora-rank 21" in finding.fix
    assert not _find(release_dir, "0.5.23", {**lora, "max_lora_rank": 21}, EXPERIMENTAL)
    assert not _find(release_dir, "0.5.23", {**lora, "max_lora_rank": 32})  # the default kernels
    # 0.5.23 keeps ranks above 64 off the experimental dense path: only the virtual-experts MoE shrink is left
    assert not _find(release_dir, "0.5.23", {**lora, "max_lora_rank": 128}, EXPERIMENTAL)
    assert _find(release_dir, "0.5.23", {**lora, "max_lora_rank": 128, "lora_use_virtual_experts": True}, EXPERIMENTAL)
    # 0.5.14 has no such gate: its experimental dense shrink runs at any rank
    assert _find(release_dir, "0.5.14", {**lora, "max_lora_rank": 128}, EXPERIMENTAL)
    assert not _find(release_dir, "0.5.12", {**lora, "max_lora_rank": 128}, EXPERIMENTAL)  # no such kernels yet


# -- the figures: real compiles for sm_120 ---------------------------------------------------------------------------


def _compile(root, *cases: str) -> dict:
    proc = subprocess.run([sys.executable, str(PROBE), str(root), *cases], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    shared = {}
    for case, result in out["cases"].items():
        assert result["error"] is None and len(result["kernels"]) == 1, (case, result)
        shared[case] = result["kernels"][0]["shared"]
    return shared


@pytest.mark.slow
def test_the_recorded_figures_are_what_triton_compiles_for_sm120(release_dir):
    root = release_dir("0.5.23")
    got = _compile(
        root,
        *(f"csgmv:{c}" for c in CSGMV_SHRINK_BYTES),
        "exp-shrink:21:3",
        "exp-shrink:22:3",
        "exp-shrink:32:2",
        "exp-shrink:33:2",
        "exp-shrink:64:1",
        *(f"exp-expand:{r}" for r in EXP_EXPAND_BYTES),
        *(f"exp-moe-shrink:{r}:{t}" for r, t in EXP_MOE_SHRINK_BYTES),
    )
    assert {c: got[f"csgmv:{c}"] for c in CSGMV_SHRINK_BYTES} == CSGMV_SHRINK_BYTES
    fitting = [c for c, b in CSGMV_SHRINK_BYTES.items() if b <= LIMIT]
    assert max(fitting) == CSGMV_LARGEST_FITTING_CHUNK and CSGMV_SHRINK_BYTES[128] > LIMIT
    # the shrink tile is the next power of two of slices x rank: 64 up to qkv rank 21, 128 from 22
    assert got["exp-shrink:21:3"] == got["exp-shrink:32:2"] == got["exp-shrink:64:1"] == EXP_SHRINK_BYTES[64] <= LIMIT
    assert got["exp-shrink:22:3"] == got["exp-shrink:33:2"] == EXP_SHRINK_BYTES[128] > LIMIT
    assert EXP_LARGEST_FITTING_RANK == 21
    assert {r: got[f"exp-expand:{r}"] for r in EXP_EXPAND_BYTES} == EXP_EXPAND_BYTES
    assert EXP_EXPAND_BYTES[64] <= LIMIT < EXP_EXPAND_BYTES[128]
    assert {k: got[f"exp-moe-shrink:{k[0]}:{k[1]}"] for k in EXP_MOE_SHRINK_BYTES} == EXP_MOE_SHRINK_BYTES
    # SGLang's own tuned-tile file (its lora_tuning_config reads it) gives chunk 128 a tile that fits; SGLang
    # caches the compiled shrink by chunk, not by tile, so this case runs in an interpreter of its own
    tuned = _compile(root, "csgmv-tuned:128:128")
    assert tuned["csgmv-tuned:128:128"] == CSGMV_TUNED_128 <= LIMIT


@pytest.mark.slow
def test_the_csgmv_figures_hold_for_an_older_release(release_dir):
    """0.5.8 hard-codes the tile the later releases read from DEFAULT_SHRINK_CONFIG: the same bytes."""
    got = _compile(release_dir("0.5.8"), "csgmv:64", "csgmv:128")
    assert (got["csgmv:64"], got["csgmv:128"]) == (CSGMV_SHRINK_BYTES[64], CSGMV_SHRINK_BYTES[128])


# -- explain (SGLang's real argument resolution) -------------------------------------------------------------------


@pytest.mark.slow
def test_explain_fails_and_names_the_largest_chunk_that_fits():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sm120kit",
            "explain",
            "--release",
            "0.5.23",
            "--model",
            "llama-mha",
            "--arch",
            "12.0",
            "--flashinfer",
            "no",
            "--json",
            "--",
            "--enable-lora",
            "--max-lora-rank",
            "16",
            "--lora-target-modules",
            "all",
            "--max-lora-chunk-size",
            "128",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 13, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["summary"]["over_smem_on_12x"] == 1
    (resolution,) = doc["resolutions"]
    findings = [f for f in resolution["slow"] if f["severity"] == OVER_SMEM]
    assert [(f["rule"], f["setting"], f["value"], f["largest_fitting_value"]) for f in findings] == [
        ("lora-csgmv-chunk-over-smem", "--max-lora-chunk-size", "128", "64")
    ]
    assert "largest that fits: 64" in proc.stderr


# -- recipes --check (the serving gate) ----------------------------------------------------------------------------

LORA_RECIPE = """\
name = "lora"
title = "t"
description = "d"
sglang = ["0.5.23"]

[model]
path = "meta-llama/Llama-3.1-8B-Instruct"
architecture = "dense, grouped-query attention"
quantization = "bf16"

[gpus]
count = 1
names = ["RTX PRO 6000 Blackwell"]
capability = "12.0"

[flags]
enable-lora = true
max-lora-rank = 16
lora-target-modules = "all"
max-lora-chunk-size = {chunk}
{notes}
"""


@pytest.mark.slow
def test_recipes_check_refuses_a_chunk_size_whose_kernel_does_not_fit(tmp_path):
    notes = "".join(
        f'\n[notes.{name}]\nwhy = "w"\nsources = ["https://x.org"]\n'
        for name in ("enable-lora", "max-lora-rank", "lora-target-modules", "max-lora-chunk-size")
    )
    for chunk in (128, 64):
        folder = tmp_path / f"chunk-{chunk}"
        folder.mkdir()
        (folder / "lora.toml").write_text(LORA_RECIPE.format(chunk=chunk, notes=notes))
        proc = subprocess.run(
            [sys.executable, "-m", "sm120kit", "recipes", "--check", "--dir", str(folder), "--json"],
            capture_output=True,
            text=True,
            timeout=900,
        )
        (result,) = json.loads(proc.stdout)["checked"]
        if chunk == 64:
            assert proc.returncode == 0 and result["ok"] is True, proc.stderr[-2000:]
            continue
        assert proc.returncode == 13 and result["ok"] is False, proc.stderr[-2000:]
        error = result["error"]
        assert "lora.toml:" in error and "--max-lora-chunk-size=128" in error
        assert "the largest value that fits: 64" in error and "147456 B" in error
