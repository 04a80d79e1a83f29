"""Settings that run on 12.x but slowly: the rule table, ``sm120kit explain`` and ``recipes --check``.

The rules read the release's own source (a rule about a line of SGLang fires only where that line is) and
the arguments SGLang's own parser read from the command line; resolutions run on faked devices as in
test_backend_audit.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from sm120kit.audit import slow_settings
from sm120kit.audit.backends import resolve_many
from sm120kit.errors import RecipeError
from sm120kit.serve.recipe import load_recipe

FI_MLA = "srt/layers/attention/flashinfer_mla_backend.py"


def _ctx(package_dir, **kw):
    base = dict(
        release=None,
        capability="12.0",
        package_dir=package_dir,
        given={},
        values={},
        env={},
        attention="mla",
        sm_count=188,
    )
    base.update(kw)
    return slow_settings.Context(**base)


def _rules(findings):
    return {f.rule for f in findings}


# -- the table on real release source (no resolution) -------------------------------------------------------


def test_fp8_flashinfer_mla_rule_follows_the_conversion_line(release_dir, tmp_path):
    """The whole-pool conversion is in 0.5.12 (split over lines, forward_batch.token_to_kv_pool) and 0.5.23
    (one line, self.token_to_kv_pool); a tree where the line is gone (patched or fixed upstream) passes."""
    fp8 = dict(
        given={"kv_cache_dtype": "fp8_e4m3", "attention_backend": "flashinfer"},
        values={"kv_cache_dtype": "fp8_e4m3", "attention_decode": "flashinfer"},
    )
    for version, lines in (("0.5.12", "575,639"), ("0.5.23", "761,822")):
        (finding,) = slow_settings.find(_ctx(release_dir(version) / "sglang", release=version, **fp8))
        assert finding.rule == "fp8-kv-flashinfer-mla" and finding.value == "fp8_e4m3"
        assert (
            finding.origin == "command line" and "#35322" in finding.fix and "--attention-backend triton" in finding.fix
        )
        assert f"sglang/{FI_MLA}:{lines}" in finding.source
    patched = tmp_path / "sglang"
    (patched / FI_MLA).parent.mkdir(parents=True)
    text = (release_dir("0.5.23") / "sglang" / FI_MLA).read_text()
    (patched / FI_MLA).write_text(
        text.replace("get_key_buffer(layer.layer_id).to(q.dtype)", "get_key_buffer(layer.layer_id)")
    )
    assert not slow_settings.find(_ctx(patched, release="0.5.23", **fp8))
    # bf16 KV, a non-MLA model or the triton backend: nothing
    assert not slow_settings.find(_ctx(release_dir("0.5.23") / "sglang", values={"attention_decode": "flashinfer"}))
    assert not slow_settings.find(_ctx(release_dir("0.5.23") / "sglang", attention="mha", **fp8))


def test_kv_split_rule_boundary_for_mla_is_the_release_that_raises_the_cap(release_dir, tmp_path):
    """MLA decode: a low value caps it before 0.5.12 (no _mla_decode_kv_splits_cap), not from 0.5.12 on;
    non-MLA decode: capped in 0.5.23 too, not once sm120-decode-kv-splits is applied. The wanted value follows
    the SM count (256 on 188 SMs, 64 on 48)."""
    low = dict(
        given={"triton_attention_num_kv_splits": 8},
        values={"triton_attention_num_kv_splits": 8, "attention_decode": "triton"},
    )
    assert _rules(slow_settings.find(_ctx(release_dir("0.5.11") / "sglang", **low))) == {"triton-kv-splits-low-mla"}
    assert not slow_settings.find(_ctx(release_dir("0.5.12") / "sglang", **low))
    (mha,) = slow_settings.find(_ctx(release_dir("0.5.23") / "sglang", attention="mha", **low))
    assert mha.rule == "triton-kv-splits-low" and "2.368 ms" in mha.why and "0.184 ms" in mha.why
    assert "--triton-attention-num-kv-splits 256" in mha.fix and "benchmarks.md" in mha.source
    (spark,) = slow_settings.find(
        _ctx(release_dir("0.5.23") / "sglang", attention="mha", sm_count=48, capability="12.1", **low)
    )
    assert "--triton-attention-num-kv-splits 64" in spark.fix
    patched = tmp_path / "sglang" / "srt/layers/attention/triton_backend.py"  # sm120-decode-kv-splits applied
    patched.parent.mkdir(parents=True)
    patched.write_text(
        (release_dir("0.5.23") / "sglang/srt/layers/attention/triton_backend.py").read_text()
        + "\ndef _sm120_decode_kv_splits_cap(base, sm_count, context_len):\n    return base\n"
    )
    assert not slow_settings.find(_ctx(tmp_path / "sglang", attention="mha", **low))
    enough = dict(given={"triton_attention_num_kv_splits": 256}, values={"attention_decode": "triton"})
    assert not slow_settings.find(_ctx(release_dir("0.5.23") / "sglang", attention="mha", **enough))
    # not on 9.0/10.0, and not when the default is left alone
    assert not slow_settings.find(_ctx(release_dir("0.5.23") / "sglang", attention="mha", capability="9.0", **low))
    assert not slow_settings.find(
        _ctx(
            release_dir("0.5.23") / "sglang",
            attention="mha",
            values={"triton_attention_num_kv_splits": 8, "attention_decode": "triton"},
        )
    )


def test_every_rule_has_why_source_and_fix():
    for rule in slow_settings.RULES:
        assert rule.why and rule.source and rule.fix, rule.id
        assert rule.severity in (slow_settings.SLOW, slow_settings.NO_SM120_CODE, slow_settings.OVER_SMEM)
        assert (rule.largest_fitting is not None) == (rule.severity == slow_settings.OVER_SMEM), rule.id
        if rule.severity == slow_settings.SLOW:
            assert rule.recipe_keys, rule.id  # a recipe can keep it with a note


# -- explain on 0.5.23 ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_0523_resolutions_report_each_setting_with_the_fix(release_dir):
    jobs = [
        ("llama-mha", ["--attention-backend", "triton", "--triton-attention-num-kv-splits", "8"]),
        ("deepseek-v3-mla", ["--attention-backend", "flashinfer", "--kv-cache-dtype", "fp8_e4m3"]),
        ("deepseek-v3-mla", ["--triton-attention-num-kv-splits", "8"]),
        ("deepseek-v3-mla", ["--attention-backend", "trtllm_mla"]),
        ("qwen3-moe", ["--moe-runner-backend", "flashinfer_trtllm"]),
        ("llama-mha", []),
    ]
    results = resolve_many(release_dir("0.5.23"), jobs, "12.0", flashinfer=True)
    for r in results:
        assert r.status in ("resolved", "rejected"), (r.model, r.args, r.error)
    splits, fp8, mla_splits, trtllm_mla, trtllm_moe, clean = results
    assert splits.given == {"attention_backend": "triton", "triton_attention_num_kv_splits": 8}
    assert [(f.rule, f.value, f.origin) for f in splits.slow] == [("triton-kv-splits-low", "8", "command line")]
    assert fp8.attention == "flashinfer" and fp8.attention_arch == "MLA"
    (f,) = fp8.slow
    assert (
        f.rule == "fp8-kv-flashinfer-mla" and "get_key_buffer" in f.why and "flashinfer_mla_backend.py:761" in f.source
    )
    assert mla_splits.status == "resolved" and not mla_splits.slow  # 0.5.23 raises the MLA cap itself
    assert [x.rule for x in trtllm_mla.slow] == ["trtllm-attention-explicit"] and trtllm_mla.flagged
    assert trtllm_mla.slow[0].severity == slow_settings.NO_SM120_CODE and "triton" in trtllm_mla.slow[0].fix
    if trtllm_moe.status == "resolved":
        assert [x.rule for x in trtllm_moe.slow] == ["trtllm-moe-explicit"]
    assert clean.status == "resolved" and clean.slow == () and clean.given == {}
    assert json.loads(json.dumps(fp8.to_json()))["slow"][0]["fix"] == f.fix


def _explain(*args):
    return subprocess.run(
        [sys.executable, "-m", "sm120kit", "explain", *args], capture_output=True, text=True, timeout=900
    )


@pytest.mark.slow
def test_explain_cli_warns_on_an_environment_switch_and_fails_with_error_on_slow():
    base = [
        "--release",
        "0.5.23",
        "--model",
        "deepseek-v3-mla",
        "--capability",
        "12.0",
        "--flashinfer",
        "no",
        "--env",
        "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS=1",
        "--json",
    ]
    warned = _explain(*base)
    assert warned.returncode == 0, warned.stderr[-2000:]
    doc = json.loads(warned.stdout)
    assert doc["ok"] is True and doc["error_on_slow"] is False and doc["summary"]["slow_on_12x"] == 1
    assert {r["id"] for r in doc["slow_rules"]} >= {"triton-kv-splits-low", "fp8-kv-flashinfer-mla"}
    (finding,) = doc["resolutions"][0]["slow"]
    assert set(finding) == {
        "rule",
        "setting",
        "value",
        "origin",
        "severity",
        "why",
        "source",
        "fix",
        "largest_fitting_value",
    }
    assert finding["rule"] == "static-kv-splits" and finding["origin"] == "environment"
    assert "triton_backend.py:" in finding["source"] and finding["fix"].startswith("Unset")
    assert "run slowly" in warned.stderr
    failed = _explain(*base, "--error-on-slow")
    assert failed.returncode == 13, failed.stderr[-2000:]
    assert json.loads(failed.stdout)["ok"] is False and "--error-on-slow" in failed.stderr


# -- recipes --check --------------------------------------------------------------------------------------

RECIPE = textwrap.dedent("""\
    name = "{name}"
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
    attention-backend = "triton"
    triton-attention-num-kv-splits = 8

    [notes.attention-backend]
    why = "w"
    sources = ["https://x.org"]

    [notes.triton-attention-num-kv-splits]
    why = "w"
    sources = ["https://x.org"]
    {slow}
    """)


@pytest.mark.slow
def test_recipes_check_fails_on_a_slow_setting_unless_a_note_says_why(tmp_path):
    folder = tmp_path / "serve"
    folder.mkdir()
    (folder / "planted.toml").write_text(RECIPE.format(name="planted", slow=""))
    (folder / "kept.toml").write_text(
        RECIPE.format(name="kept", slow='slow = "short prompts only; 8 splits measured fastest for them"')
    )
    kept = load_recipe(folder / "kept.toml")
    assert kept.notes["triton-attention-num-kv-splits"].slow.startswith("short prompts")
    assert kept.to_json()["notes"]["triton-attention-num-kv-splits"]["slow"]
    proc = subprocess.run(
        [sys.executable, "-m", "sm120kit", "recipes", "--check", "--dir", str(folder), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 13, proc.stderr[-2000:]
    results = {r["recipe"]: r for r in json.loads(proc.stdout)["checked"]}
    assert results["planted"]["ok"] is False
    error = results["planted"]["error"]
    assert "planted.toml:" in error and "--triton-attention-num-kv-splits=8 runs on 12.x but slowly" in error
    assert "--triton-attention-num-kv-splits 256" in error
    assert results["kept"]["ok"] is True
    assert any("kept: short prompts" in w for w in results["kept"]["warnings"])


def test_an_empty_slow_note_is_rejected(tmp_path):
    path = tmp_path / "empty.toml"
    path.write_text(RECIPE.format(name="empty", slow='slow = " "'))
    with pytest.raises(RecipeError, match="slow is empty"):
        load_recipe(path)


def test_recipe_attention_kind_and_backends_from_flags():
    assert slow_settings.attention_kind_from_text("DeepSeek-V3 class: multi-head latent attention (MLA)") == "mla"
    assert slow_settings.attention_kind_from_text("dense, grouped-query attention (MHA family)") == "mha"
    assert slow_settings.backend_values({"attention_backend": "triton", "decode_attention_backend": "flashinfer"}) == {
        "attention_prefill": "triton",
        "attention_decode": "flashinfer",
        "moe_runner": None,
    }
