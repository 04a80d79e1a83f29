"""The backend audit's Triton decode split cap, on real releases with and without the bundled series.

Each tree's own split-cap code runs in the resolution probe under a faked device: sm120-decode-kv-splits'
functions where the tree has them, the release's ``_mla_decode_kv_splits_cap`` for MLA where present,
else ``--triton-attention-num-kv-splits``. The expected numbers below come from the formulas the patch
(patch.toml) and the release state, with the model's shape read from its config.json here; every model is
run with ``--attention-backend triton`` so that decode is Triton on every capability. No GPU is used.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from sm120kit.audit import backends as backend_audit
from sm120kit.audit.backends import audit_backends
from sm120kit.hardware.fake_device import PRESETS
from sm120kit.patching.engine import apply_series
from sm120kit.patching.series import load_series
from sm120kit.sglang import releases
from sm120kit.sglang.target import find_target

pytestmark = pytest.mark.slow

CAPS = ("12.0", "12.1", "9.0", "10.0")
GQA, MLA = "qwen3-moe", "deepseek-v2-lite-mla"
ARGS = ("--attention-backend", "triton")
MiB = 1 << 20


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _pow2_at_most(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _config(model: str) -> dict:
    return json.loads((backend_audit.model_dir(model) / "config.json").read_text())


def _shape(model: str) -> dict:
    """Heads, KV heads, value-buffer dim (the latent rank for MLA) and context length from config.json."""
    c = _config(model)
    mla = "kv_lora_rank" in c
    v = c["kv_lora_rank"] if mla else c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return {
        "heads": c["num_attention_heads"],
        "kv": c["num_key_value_heads"],
        "v": v,
        "mla": mla,
        "ctx": c["max_position_embeddings"],
    }


def patched_cap(base: int, sms: int, shape: dict) -> int:
    """patch.toml's formula: max(base, min(256, ceil(4 SMs / programs), pow2 >= ctx/256,
    pow2 <= 8 MiB / (4 B * heads * (v + 1))))."""
    heads, group = shape["heads"], max(1, shape["heads"] // shape["kv"])
    programs = heads if group == 1 else -(-heads // min(16, group))
    by_waves = -(-4 * sms // programs)
    by_context = _pow2_at_least(-(-shape["ctx"] // 256))
    by_memory = _pow2_at_most(8 * MiB // (4 * heads * (shape["v"] + 1)))
    return max(base, min(256, by_waves, by_context, by_memory))


def release_mla_cap(base: int, sms: int, ctx: int) -> int:
    """sglang #20479 (0.5.12 on): max(base, min(pow2 >= SMs, pow2 >= ctx / 32))."""
    return max(base, min(_pow2_at_least(sms), _pow2_at_least(-(-ctx // 32))))


def _tree(tmp_path_factory, version: str, patched: bool):
    if not patched:
        return releases.fetch_release(version)
    dest = tmp_path_factory.mktemp(f"splits-{version}") / "site"
    try:
        shutil.copytree(releases.fetch_release(version), dest, copy_function=os.link)
    except OSError:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(releases.fetch_release(version), dest)
    result = apply_series(find_target(dest / "sglang"), load_series())
    assert result.exit_code == 0, result.message
    assert result.statuses["sm120-decode-kv-splits"] == "applied", result.statuses
    return dest


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    done: dict = {}

    def get(version: str, patched: bool, env: dict | None = None):
        key = (version, patched, tuple(sorted((env or {}).items())))
        if key not in done:
            done[key] = audit_backends(
                _tree(tmp_path_factory, version, patched),
                models=[GQA, MLA],
                capabilities=CAPS,
                args=ARGS,
                flashinfer=(True,),
                env=env,
                jobs=2,
            )
        return done[key]

    return get


def _splits(result, model: str) -> dict[str, dict]:
    found = {}
    for r in result.resolutions:
        if r.model == model:
            assert r.status == "resolved" and r.attention == "triton", (r.capability, r.error, r.attention)
            assert r.triton_decode and "max_kv_splits" in r.triton_decode, r.triton_decode
            found[r.capability] = r.triton_decode
    assert sorted(found) == sorted(CAPS)
    return found


def _check_bytes(t: dict, shape: dict) -> None:
    assert t["bytes_per_token"] == 4 * shape["heads"] * t["max_kv_splits"] * (shape["v"] + 1)


@pytest.mark.parametrize("patched", [False, True], ids=["release", "series"])
def test_0523_gqa_and_mla(audited, patched):
    result = audited("0.5.23", patched)
    gqa, mla = _shape(GQA), _shape(MLA)
    got = _splits(result, GQA)
    for cap in CAPS:
        sms = PRESETS[cap].multi_processor_count
        raised = patched and cap.startswith("12.")
        want = patched_cap(8, sms, gqa) if raised else 8
        assert got[cap]["max_kv_splits"] == want, (cap, got[cap])
        assert got[cap]["source"] == ("_sm120_decode_kv_splits_cap" if raised else "triton_attention_num_kv_splits")
        _check_bytes(got[cap], gqa)
    assert got["12.0"]["max_kv_splits"] == (188 if patched else 8)  # 32/4 heads: one wave per SM x 4
    assert got["12.1"]["max_kv_splits"] == (48 if patched else 8)
    # MLA: the release's own cap, on every device, with or without the series
    got = _splits(result, MLA)
    for cap in CAPS:
        want = release_mla_cap(8, PRESETS[cap].multi_processor_count, mla["ctx"])
        assert got[cap]["max_kv_splits"] == want and got[cap]["source"] == "_mla_decode_kv_splits_cap", got[cap]
        _check_bytes(got[cap], mla)
    assert [got[c]["max_kv_splits"] for c in CAPS] == [256, 64, 256, 256]
    # the JSON and the table carry it
    doc = result.to_json()
    assert all("triton_decode" in r for r in doc["resolutions"])
    row = next(r for r in result.rows() if r[0].startswith(GQA) and r[1] == "12.0")
    assert row[result.HEADERS.index("kv splits")] == str(188 if patched else 8)
    assert any(line.startswith(f"kv splits: {GQA} on ") for line in result.notes())


@pytest.mark.parametrize("patched", [False, True], ids=["release", "series"])
def test_0510_gqa_and_mla(audited, patched):
    """Before 0.5.12 there is no MLA cap in the release; with the series, MLA decode on 12.x runs
    sm120-mla-attention's kernel (its own split choice), so the configured cap stays."""
    result = audited("0.5.10", patched)
    gqa = _shape(GQA)
    got = _splits(result, GQA)
    for cap in CAPS:
        raised = patched and cap.startswith("12.")
        want = patched_cap(8, PRESETS[cap].multi_processor_count, gqa) if raised else 8
        assert got[cap]["max_kv_splits"] == want, (cap, got[cap])
    assert [got[c]["max_kv_splits"] for c in CAPS] == ([188, 48, 8, 8] if patched else [8, 8, 8, 8])
    got = _splits(result, MLA)
    for cap in CAPS:
        assert got[cap]["max_kv_splits"] == 8 and got[cap]["source"] == "triton_attention_num_kv_splits", got[cap]
        kernel = patched and cap.startswith("12.")
        assert bool(got[cap]["note"]) == kernel, got[cap]


def test_0510_series_mla_without_the_mla_kernel(audited):
    """SGLANG_SM120_MLA=0 turns sm120-mla-attention's kernel off; MLA then takes the patch's cap, sized for
    the one latent KV head MLA decode reads (the backend's own num_kv_head is the config's count)."""
    result = audited("0.5.10", True, {"SGLANG_SM120_MLA": "0"})
    mla = _shape(MLA)
    got = _splits(result, MLA)
    for cap in CAPS:
        raised = cap.startswith("12.")
        want = patched_cap(8, PRESETS[cap].multi_processor_count, {**mla, "kv": 1}) if raised else 8
        assert got[cap]["max_kv_splits"] == want, (cap, got[cap])
        assert got[cap]["num_kv_head"] == mla["kv"] and got[cap]["v_head_dim"] == 512
        _check_bytes(got[cap], mla)
