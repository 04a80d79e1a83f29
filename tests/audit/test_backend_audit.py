"""Backend-choice audit: SGLang's own server-argument resolution, run on real PyPI releases.

No GPU is used: every resolution runs against a faked device (torch reports the capability under test,
nvidia-smi answers from the same faked device), and the CUDA-only libraries ``sgl_kernel`` and
``torchvision`` (plus ``flashinfer``/``deep_gemm`` where a test says they are installed) are stand-ins.
Everything else is the release's own code.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sm120kit.audit import backend_support
from sm120kit.audit import backends as backend_audit
from sm120kit.audit.backends import audit_backends, resolve, resolve_many
from sm120kit.errors import UsageError
from sm120kit.ui import render_table

# -- the rule table and input checks (no SGLang needed) -----------------------------------------------------


def test_rules_are_versioned_and_sourced():
    """Every rule names a source and a reason; release ranges decide where it applies."""
    assert all(rule.reason and rule.source for rule in backend_support.UNSUPPORTED)
    decode = {"attention_prefill": "flashinfer", "attention_decode": "trtllm_mha"}
    assert backend_support.unsupported_choices("0.5.9", "12.0", decode)
    assert not backend_support.unsupported_choices("0.5.10", "12.0", decode)  # XQA decode from 0.5.10
    prefill = {"attention_prefill": "trtllm_mha", "attention_decode": "flashinfer"}
    assert backend_support.unsupported_choices("0.5.18", "12.1", prefill)
    assert not backend_support.unsupported_choices("0.5.19", "12.1", prefill)  # fmha_v2 prefill from 0.5.19
    fa3 = {"attention_prefill": "fa3", "attention_decode": "fa3"}
    assert len(backend_support.unsupported_choices("0.5.23", "12.0", fa3)) == 2
    assert not backend_support.unsupported_choices("0.5.23", "9.0", fa3)  # fine on Hopper
    assert backend_support.unsupported_choices("0.5.12", "12.0", {"deep_gemm": "on"})
    assert not backend_support.unsupported_choices("0.5.20", "12.0", {"deep_gemm": "on"})  # SM120 entry probe
    assert backend_support.unsupported_choices("0.5.20", "12.1", {"deep_gemm": "on"})  # 12.1 not gated yet
    assert not backend_support.unsupported_choices("0.5.23", "12.1", {"deep_gemm": "on"})


def test_backends_from_raw_falls_back_to_the_base_attention_backend():
    raw = {
        "attention_backend": "triton",
        "decode_attention_backend": "flashinfer",
        "moe_runner_backend": "auto",
        "enable_flashinfer_cutlass_moe": True,
    }
    backends = backend_audit.backends_from_raw(raw, deep_gemm=False)
    assert backends["attention_prefill"] == "triton"
    assert backends["attention_decode"] == "flashinfer"
    assert backends["moe_runner"] == "flashinfer_cutlass"  # the pre-0.5.3 switch
    assert backends["deep_gemm"] == "off"


def test_bad_model_and_capability_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="config.json"):
        backend_audit.model_dir(tmp_path)
    with pytest.raises(UsageError, match="7.5"):
        backend_audit.check_capability("7.5")
    assert backend_audit.check_capability("sm_120a") == "12.0"
    for name in backend_audit.BUNDLED_MODELS:
        config = json.loads((backend_audit.model_dir(name) / "config.json").read_text())
        assert config["architectures"]


# -- real releases ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def audit_0523(release_dir):
    """0.5.23, three models x four faked capabilities, flashinfer installed (4 probe interpreters; the
    flashinfer-absent case runs through the CLI test)."""
    return audit_backends(
        release_dir("0.5.23"),
        models=["llama-mha", "deepseek-v2-lite-mla", "deepseek-v3-mla"],
        capabilities=("12.0", "12.1", "9.0", "10.0"),
        flashinfer=(True,),
    )


def _pick(result, model, capability, flashinfer=True):
    (found,) = [
        r for r in result.resolutions if r.model == model and r.capability == capability and r.flashinfer == flashinfer
    ]
    return found


@pytest.mark.slow
def test_0523_matches_the_measured_choices(audit_0523):
    """Faked devices: Llama 12.0 -> flashinfer (triton without flashinfer: test_explain_cli); MLA on 12.x -> triton;
    9.0 -> fa3; 10.0 -> trtllm_mha (MHA) / flashinfer (DeepSeek-V2 MLA; V3 has its own trtllm_mla override)."""
    result = audit_0523
    assert all(r.status == "resolved" for r in result.resolutions), [r.error for r in result.resolutions]
    assert _pick(result, "llama-mha", "12.0").attention == "flashinfer"
    assert _pick(result, "deepseek-v3-mla", "12.0").attention == "triton"
    assert _pick(result, "deepseek-v3-mla", "12.1").attention == "triton"
    assert _pick(result, "llama-mha", "9.0").attention == "fa3"
    assert _pick(result, "deepseek-v3-mla", "9.0").attention == "fa3"
    assert _pick(result, "llama-mha", "10.0").attention == "trtllm_mha"
    assert _pick(result, "deepseek-v2-lite-mla", "10.0").attention == "flashinfer"
    assert _pick(result, "deepseek-v2-lite-mla", "12.0").attention == "triton"
    assert _pick(result, "deepseek-v3-mla", "10.0").attention == "trtllm_mla"  # DeepseekV3 override on SM100
    # fa3 on 9.0, never on 12.x
    on_12x = [r for r in result.resolutions if r.capability.startswith("12.")]
    assert on_12x and not any(
        "fa3" in (r.backends["attention_prefill"], r.backends["attention_decode"]) for r in on_12x
    )
    assert not result.flagged and result.ok
    assert any("sgl_kernel" in s for s in result.stand_ins)
    data = result.to_json()
    assert data["device"].startswith("faked device") and data["summary"]["resolutions"] == 12
    assert "0.5.23" in result.summary() and "trtllm_mha" in render_table(result.HEADERS, result.rows())


@pytest.mark.slow
def test_0523_explicit_arguments(release_dir):
    """Faked 12.0 device: an explicit fa3 is accepted at argument time by 0.5.23 (its check runs when the
    model runner starts) and flagged; an unknown backend is rejected by SGLang's argument parser."""
    fa3, bogus = resolve_many(
        release_dir("0.5.23"),
        [("llama-mha", ["--attention-backend", "fa3"]), ("llama-mha", ["--attention-backend", "no-such-backend"])],
        "12.0",
    )
    assert fa3.ok and fa3.status == "resolved"
    assert {"attention_prefill=fa3", "attention_decode=fa3"} <= set(fa3.flagged)
    assert all("SM" in d.reason or "sm_" in d.reason for d in fa3.details)
    assert not bogus.ok and bogus.status == "rejected"
    assert "no-such-backend" in bogus.error


@pytest.mark.slow
def test_056post2_picks_trtllm_mha_on_sm120(release_dir):
    """Faked 12.0 device: 0.5.6.post2 picks trtllm_mha for an MHA model and then rejects its own choice
    (the upstream regression fixed in 0.5.7); the audit reports the rejection and flags the choice."""
    result = resolve(release_dir("0.5.6.post2"), "llama-mha", "12.0")
    assert not result.ok and result.status == "rejected"
    assert "attention_decode=trtllm_mha" in result.flagged
    assert "TRTLLM MHA backend is only supported on Blackwell GPUs (SM100)" in result.error
    assert "transformers==4.57.1" in result.overlay  # the release's own pin


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.2", "0.5.8", "0.5.17"])
def test_older_releases_resolve(release_dir, version):
    """Faked 12.0 device: older releases resolve (0.5.2 picks its default attention backend in
    ModelRunner.model_specific_adjustment, which the probe runs); DeepGEMM is flagged where the release
    turns it on for 12.0 without SM120 kernels."""
    llama, mla = resolve_many(release_dir(version), [("llama-mha", ()), ("deepseek-v3-mla", ())], "12.0")
    assert llama.status == "resolved" and mla.status == "resolved", (llama.error, mla.error)
    assert llama.attention == "flashinfer" and mla.attention == "triton"
    if version == "0.5.2":
        assert "ModelRunner.model_specific_adjustment" in llama.method
    expected_deep_gemm = "off" if version == "0.5.17" else "on"
    assert llama.backends["deep_gemm"] == expected_deep_gemm
    assert ("deep_gemm=on" in llama.flagged) == (expected_deep_gemm == "on")


@pytest.mark.slow
def test_052_hopper_picks_fa3_through_model_runner(release_dir):
    """Faked 9.0 device: 0.5.2's ModelRunner default is fa3 for an MHA model."""
    assert resolve(release_dir("0.5.2"), "llama-mha", "9.0").attention == "fa3"


@pytest.mark.slow
def test_unresolvable_release_says_why(release_dir):
    """Faked 12.0 device: 0.5.17 imported with the installed transformers (5.19) instead of its pin (5.12.1)
    cannot even import its server arguments; the result says so instead of guessing."""
    result = resolve(release_dir("0.5.17"), "llama-mha", "12.0", release_pins=False)
    assert not result.ok and result.status == "not-run"
    assert "importing sglang.srt.server_args failed" in result.error
    assert "qwen3_asr" in result.error  # transformers refuses the config name SGLang registers
    assert not any(result.backends.values())


@pytest.mark.slow
def test_explain_cli(release_dir):
    """Faked 12.0 device through the CLI, flashinfer not installed: 0.5.23 picks triton for Llama and exits 0
    with a table; an explicit fa3 exits 13 with the flag in the JSON (and the error object after it)."""
    root = str(release_dir("0.5.23"))
    base = [
        sys.executable,
        "-m",
        "sm120kit",
        "explain",
        root,
        "--model",
        "llama-mha",
        "--capability",
        "12.0",
        "--flashinfer",
        "no",
    ]
    clean = subprocess.run(base, capture_output=True, text=True, timeout=600)
    assert clean.returncode == 0, clean.stderr
    (row,) = [line for line in clean.stdout.splitlines() if line.startswith("llama-mha ")]
    assert row.split()[1:4] == ["12.0", "no", "triton"], row
    assert "faked device" in clean.stdout
    bad = subprocess.run(
        base + ["--json", "--", "--attention-backend", "fa3"], capture_output=True, text=True, timeout=600
    )
    assert bad.returncode == 13, bad.stderr
    data = json.loads(bad.stdout)  # one document: the result, with the verdict in "ok"
    assert data["ok"] is False and data["summary"]["flagged_on_12x"] == 1
    (entry,) = data["resolutions"]
    assert entry["args"] == ["--attention-backend", "fa3"]
    assert {f["value"] for f in entry["flagged"]} == {"fa3"}
    assert "no SM120 code" in bad.stderr


@pytest.mark.slow
def test_git_clone_layout(git_clone_tree):
    """Faked 12.1 device: a git clone (python/sglang) resolves like the installed package."""
    result = resolve(git_clone_tree("0.5.23"), "deepseek-v3-mla", "12.1", flashinfer=False)
    assert result.status == "resolved" and result.release == "0.5.23"
    assert result.attention == "triton" and not result.flagged
