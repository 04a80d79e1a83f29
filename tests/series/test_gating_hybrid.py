"""sm120-backend-gating on hybrid GDN models: every model each release counts as hybrid GDN gets triton.

Releases 0.5.3 to 0.5.9 assert in their attention registry that a hybrid GDN model runs on triton (or
trtllm_mha) when ``is_blackwell()`` is true (from 0.5.10 flashinfer is accepted too), which
the series' capability patch makes true on 12.x. Which models are hybrid GDN is the release's own list:
architectures in ``ModelRunner.is_hybrid_gdn`` (0.5.3) or config classes in ``hybrid_gdn_config``
(later). For every release on PyPI the list is read from the release's source and each model on it is
checked against the gate module the patch's variant for that release creates; the first test resolves
a Falcon-H1 model folder with SGLang's own argument resolution on a faked 12.0 device (no GPU here).
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from packaging.version import Version

from sm120kit.patching.series import load_series
from sm120kit.sglang import releases

PATCH_DIR = REPO_ROOT / "patches" / "sglang"
GATE = "sglang/srt/sm12x_backend_gate.py"
# The releases whose assertion leaves out flashinfer (from 0.5.10 it allows flashinfer and fa4 too).
ASSERTION = re.compile(
    r"triton (?:or trtllm_mha )?backends? (?:is|are) the only supported backends? on "
    r"Blackwell GPUs for hybrid GDN"
)
_PREDICATE_FILES = ("sglang/srt/model_executor/model_runner.py", "sglang/srt/configs/hybrid_arch.py")

FALCON_H1 = {  # the shape of tiiuae/Falcon-H1-0.5B-Instruct's config.json (attention and mamba fields)
    "architectures": ["FalconH1ForCausalLM"],
    "model_type": "falcon_h1",
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "num_hidden_layers": 36,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 32784,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-05,
    "rope_theta": 100000000000.0,
    "mamba_d_ssm": 1536,
    "mamba_n_heads": 24,
    "mamba_d_head": 64,
    "mamba_d_state": 128,
    "mamba_n_groups": 1,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 128,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "mamba_rms_norm": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _function_body(text: str, name: str) -> str | None:
    match = re.search(rf"\n(\s*)def {name}\(.*?\n(.*?)(?=\n\1(?:def |@)|\n\S|\Z)", text, re.S)
    return match.group(2) if match else None


def hybrid_gdn_models(root: Path) -> tuple[set[str], set[str]]:
    """(architectures, config class names) the release at ``root`` counts as hybrid GDN."""
    for rel in _PREDICATE_FILES:
        path = root / rel
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        body = _function_body(text, "is_hybrid_gdn")
        if body is not None:
            return set(re.findall(r'"([A-Za-z0-9_]+For[A-Za-z0-9_]+)"', body)), set()
        body = _function_body(text, "hybrid_gdn_config")
        if body is not None:
            names = set()
            for group in re.findall(r"isinstance\(\s*\w+,\s*\(?([^)]*)\)", body):
                names.update(n.strip() for n in re.split(r"[|,]", group) if n.strip())
            return set(), names
    return set(), set()


def _gate(variant) -> types.ModuleType:
    (created,) = [f for f in variant.files if f.path == GATE]
    module = types.ModuleType("sm12x_backend_gate")
    exec(compile(created.target_text, GATE, "exec"), module.__dict__)  # noqa: S102 - the patch's own module
    return module


def _model_config(config_class: str, architecture: str | None):
    hf_config = type(config_class, (), {})()
    hf_config.architectures = [architecture] if architecture else None
    return types.SimpleNamespace(hf_config=hf_config)


def test_every_hybrid_gdn_model_of_every_release_is_recognised_by_the_gate():
    patch = load_series(PATCH_DIR).get("sm120-backend-gating")
    checked = {}
    for version in releases.parse_release_range("0.5.2..0.5.23", releases.available_releases()):
        root = releases.fetch_release(version)
        registry = root / "sglang/srt/layers/attention/attention_registry.py"
        asserts = registry.is_file() and bool(ASSERTION.search(registry.read_text(encoding="utf-8")))
        variant = patch.variant_for(version)
        gate = _gate(variant)
        if not asserts:
            assert gate.GDN_TRITON_ONLY is False or Version(version) < Version("0.5.10"), version
            continue
        assert gate.GDN_TRITON_ONLY is True, (version, variant.name)
        architectures, config_classes = hybrid_gdn_models(root)
        assert architectures or config_classes, f"{version}: no hybrid GDN list found"
        for arch in architectures:
            assert gate._is_hybrid_gdn(_model_config("PretrainedConfig", arch)), (version, variant.name, arch)
        for name in config_classes:
            assert gate._is_hybrid_gdn(_model_config(name, None)), (version, variant.name, name)
        # A plain model is not hybrid.
        assert not gate._is_hybrid_gdn(_model_config("LlamaConfig", "LlamaForCausalLM")), version
        checked[version] = sorted(architectures | config_classes)
    assert "FalconH1ForCausalLM" in checked["0.5.3"], checked.get("0.5.3")
    assert checked["0.5.3.post1"] == ["Qwen3NextConfig"]
    assert {"0.5.3", "0.5.4", "0.5.5.post1"} <= set(checked) and "0.5.10" not in checked


@pytest.mark.slow
def test_falcon_h1_on_053_resolves_to_triton_on_12x(tmp_path, capsys):
    """SGLang 0.5.3's own argument resolution (and model-runner default) for a Falcon-H1 model folder on a
    faked 12.0 device, with the series applied: triton, the backend its hybrid GDN wrapper accepts."""
    import shutil

    from sm120kit.audit.backends import resolve
    from sm120kit.cli import main as cli_main

    site = tmp_path / "site"
    shutil.copytree(releases.fetch_release("0.5.3"), site)
    with pytest.raises(SystemExit) as exc:
        cli_main(["apply", str(site / "sglang")])
    assert exc.value.code == 0, capsys.readouterr().err
    model = tmp_path / "falcon-h1"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(FALCON_H1))
    result = resolve(site, model, "12.0", flashinfer=True)
    assert result.ok, (result.status, result.error)
    assert result.backends["attention_decode"] == "triton", result.backends
    assert result.backends["attention_prefill"] == "triton", result.backends
