"""scripts/survey_kernels.py: a small subset of the 0.5.23 kernel survey, compiled for sm_120 (CPU only)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import SCRIPTS_DIR

pytest.importorskip("torch")
pytest.importorskip("triton")

SCRIPT = SCRIPTS_DIR / "survey_kernels.py"


@pytest.mark.slow
def test_survey_subset_verdicts(release_dir):
    release_dir("0.5.23")  # fetched once into the sm120kit cache; the script reads it from there
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--release",
            "0.5.23",
            "--arch",
            "12.0",
            "--only",
            "chunked_sgmv_shrink.py:_chunked_lora_shrink_kernel",
            "--only",
            "dsv4_wo_a.py",
            "--only",
            "decode_attention.py:_lean",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]  # 1: something is over the limit
    out = json.loads(proc.stdout)
    assert out["limit"] == 101376
    by_shape = {(e["kernel"].rsplit(":", 1)[1], e["shape"]): e for e in out["entries"]}
    shrink = {shape: e for (name, shape), e in by_shape.items() if name == "_chunked_lora_shrink_kernel"}
    chunk16 = next(e for s, e in shrink.items() if "chunk 16," in s)
    chunk128 = next(e for s, e in shrink.items() if "chunk 128," in s)
    assert (chunk16["verdict"], chunk16["max_shared"]) == ("fits", 32768)
    assert (chunk128["verdict"], chunk128["max_shared"]) == ("over", 147456)
    assert chunk128["kernels"][0]["constexprs"]["BLOCK_M"] == 128
    wo_a = next(e for (name, _), e in by_shape.items() if name == "_wo_a_partial")
    assert (wo_a["verdict"], wo_a["max_shared"]) == ("fits", 40960)
    assert "_is_hip" in out["not_launched"]["kernels/ops/attention/decode_attention.py:_lean_attention_decode_kernel"]
