"""Which SGLang backend choices have no SM120 code, by release: the one table the backend audit reads.

A rule names a setting (a key of :attr:`sm120kit.audit.backends.Resolution.backends`), the value
that cannot run on compute capability 12.x, the releases in which that holds (``None`` for all), why, and
where the fact comes from. "Read from the wheel" means the SGLang release's own source, as published on
PyPI, was read at the path given.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from sm120kit.hardware.arch import SM12X_LABELS

SM12X = SM12X_LABELS


@dataclass(frozen=True)
class UnsupportedChoice:
    setting: str  # "attention_prefill", "attention_decode", "moe_runner", "fp8_gemm", "fp4_gemm", "deep_gemm" ...
    value: str  # the backend name SGLang reports ("fa3", "trtllm_mha", "on" for deep_gemm)
    reason: str
    source: str
    releases: str | None = None  # a version specifier (">=0.5.2,<0.5.10"); None: every release
    capabilities: tuple[str, ...] = SM12X

    def applies(self, release: str | None, capability: str) -> bool:
        if capability not in self.capabilities:
            return False
        if self.releases is None or release is None:
            return True
        try:
            return Version(release) in SpecifierSet(self.releases)
        except InvalidVersion:
            return True

    def to_json(self) -> dict:
        return {
            "setting": self.setting,
            "value": self.value,
            "releases": self.releases or "all",
            "capabilities": list(self.capabilities),
            "reason": self.reason,
            "source": self.source,
        }


_FA3 = (
    "FlashAttention 3 kernels exist for sm_80-sm_90 only; the backend asserts "
    "'FlashAttention v3 Backend requires SM>=80 and SM<=90' and sgl-kernel's flash_ops holds no sm_120 code."
)
_FA3_SRC = (
    "read from the wheels: the check is in srt/model_executor/model_runner.py (0.5.2) and "
    "srt/layers/attention/attention_registry.py (0.5.23); sgl-kernel 0.3.21/0.4.10 flash_ops hold "
    "sm_80/86/90a cubins only"
)
_TRTLLM_MLA = (
    "trtllm_mla passes SGLang's is_blackwell_supported() check on 12.x and then calls trtllm-gen kernels "
    "built for SM100 only."
)
_TRTLLM_MLA_SRC = "sglang issue #24633; FlashInfer trtllm-gen MLA decode is sm100a/sm103a code"
_CUTLASS_MLA = "The CUTLASS MLA decode kernel requires SM100 (tcgen05/TMEM); the backend was removed by 0.5.20."
_CUTLASS_MLA_SRC = (
    "sgl-kernel's cutlass_mla_decode is an SM100 kernel; srt/layers/attention/cutlass_mla_backend.py "
    "is in the 0.5.19 wheel and gone from 0.5.20"
)
_FLASHMLA = "FlashMLA ships sm_90a/sm_100a/sm_103a code only."
_FLASHMLA_SRC = "sgl-kernel 0.3.21/0.4.10 wheels: flashmla_ops cubins sm_90a/100a/103a (cuobjdump)"

UNSUPPORTED: tuple[UnsupportedChoice, ...] = (
    UnsupportedChoice("attention_prefill", "fa3", _FA3, _FA3_SRC),
    UnsupportedChoice("attention_decode", "fa3", _FA3, _FA3_SRC),
    UnsupportedChoice(
        "attention_decode",
        "trtllm_mha",
        "Before 0.5.10 trtllm_mha decodes with trtllm-gen kernels only (SM100); the XQA path that runs on SM120 "
        "arrived in 0.5.10. Users saw 'TRTLLM MHA backend is only supported on Blackwell GPUs (SM100)'.",
        "read from the wheels: srt/layers/attention/trtllm_mha_backend.py gains is_sm120_supported() "
        "(is_xqa_impl) in 0.5.10; 0.5.6.post1/post2 regression fixed by sglang PR #14842",
        releases="<0.5.10",
    ),
    UnsupportedChoice(
        "attention_prefill",
        "trtllm_mha",
        "Before 0.5.19 trtllm_mha prefill uses trtllm-gen kernels only (SM100); the fmha_v2 prefill kernel "
        "for SM90/SM120 arrived in 0.5.19.",
        "read from the wheels: srt/layers/attention/trtllm_mha_backend.py 'fmha_v2 prefill kernel supports "
        "SM90 and SM120' first in 0.5.19",
        releases="<0.5.19",
    ),
    UnsupportedChoice("attention_prefill", "trtllm_mla", _TRTLLM_MLA, _TRTLLM_MLA_SRC),
    UnsupportedChoice("attention_decode", "trtllm_mla", _TRTLLM_MLA, _TRTLLM_MLA_SRC),
    UnsupportedChoice("attention_prefill", "cutlass_mla", _CUTLASS_MLA, _CUTLASS_MLA_SRC),
    UnsupportedChoice("attention_decode", "cutlass_mla", _CUTLASS_MLA, _CUTLASS_MLA_SRC),
    UnsupportedChoice("attention_prefill", "flashmla", _FLASHMLA, _FLASHMLA_SRC),
    UnsupportedChoice("attention_decode", "flashmla", _FLASHMLA, _FLASHMLA_SRC),
    UnsupportedChoice(
        "deep_gemm",
        "on",
        "Up to 0.5.12 SGLang turns DeepGEMM on for 12.0 whenever it is importable, without checking that the "
        "installed DeepGEMM has SM120 kernels, so FP8 GEMMs and MoE run DeepGEMM's SM90/SM100 paths "
        "(wgmma/tcgen05), which SM120 lacks. Set SGLANG_ENABLE_JIT_DEEPGEMM=0.",
        "read from the wheels: srt/layers/deep_gemm_wrapper/configurer.py has no SM120 check up to 0.5.12, "
        "returns False for sm 120 in 0.5.13-0.5.19, and from 0.5.20 enables it on 120 only when DeepGEMM has "
        "the SM120 entry points (DeepGEMM PR #324)",
        releases="<0.5.13",
        capabilities=("12.0",),
    ),
    UnsupportedChoice(
        "deep_gemm",
        "on",
        "Before 0.5.21 SGLang's DeepGEMM gate tests for sm 120 only, so on 12.1 (DGX Spark) DeepGEMM is on "
        "whenever importable and runs its SM90/SM100 paths. Set SGLANG_ENABLE_JIT_DEEPGEMM=0.",
        "read from the wheels: srt/layers/deep_gemm_wrapper/configurer.py checks 'sm_version == 120' in "
        "0.5.13-0.5.20 and 'sm_version in (120, 121)' from 0.5.21",
        releases="<0.5.21",
        capabilities=("12.1",),
    ),
    UnsupportedChoice(
        "fp8_gemm",
        "deep_gemm",
        "An explicit DeepGEMM FP8 GEMM runs DeepGEMM's SM90/SM100 kernels where SGLang has no SM120 DeepGEMM "
        "path (12.0 before 0.5.20, 12.1 before 0.5.21).",
        "read from the wheels: srt/layers/deep_gemm_wrapper/configurer.py (0.5.20: SM120 entry-point probe for "
        "120; 0.5.21: for 120 and 121)",
        releases="<0.5.20",
        capabilities=("12.0",),
    ),
    UnsupportedChoice(
        "fp8_gemm",
        "deep_gemm",
        "An explicit DeepGEMM FP8 GEMM runs DeepGEMM's SM90/SM100 kernels where SGLang has no SM120 DeepGEMM "
        "path (12.0 before 0.5.20, 12.1 before 0.5.21).",
        "read from the wheels: srt/layers/deep_gemm_wrapper/configurer.py (0.5.20: SM120 entry-point probe for "
        "120; 0.5.21: for 120 and 121)",
        releases="<0.5.21",
        capabilities=("12.1",),
    ),
    UnsupportedChoice(
        "fp8_gemm",
        "flashinfer_trtllm",
        "FlashInfer's trtllm-gen FP8 GEMM is SM100-family code.",
        "read from the 0.5.23 wheel: srt/layers/quantization/fp8_utils.py raises unless is_sm100 for "
        "--fp8-gemm-backend=flashinfer_trtllm",
    ),
    UnsupportedChoice(
        "fp4_gemm",
        "flashinfer_trtllm",
        "FlashInfer's mm_fp4 rejects the trtllm backend on SM120 ('mm_fp4 does not support backend 'trtllm' "
        "with capability 120'); use flashinfer_cutlass or SGLANG_USE_CUTLASS_BACKEND_FOR_FP4_GEMM=1.",
        "user reports of FlashInfer's mm_fp4 error on RTX PRO 6000 / RTX 5090 (FlashInfer's backend check)",
    ),
    UnsupportedChoice(
        "moe_runner",
        "flashinfer_trtllm",
        "trtllm-gen fused MoE kernels are built for SM100/SM103 only.",
        "read from the wheels: srt/layers/moe/moe_runner/flashinfer_trtllm.py has no SM120 branch (0.5.8-0.5.23)",
    ),
    UnsupportedChoice(
        "moe_runner",
        "flashinfer_mxfp4",
        "Before 0.5.17 the flashinfer_mxfp4 MoE runner has no SM120 kernel (it calls trtllm-gen SM100 MoE); "
        "0.5.17 added the CUTLASS SM120 path.",
        "read from the wheels: srt/layers/quantization/mxfp4.py gains _fi_kernel = 'cutlass_sm120' in 0.5.17",
        releases="<0.5.17",
    ),
)


def unsupported_choices(
    release: str | None, capability: str, backends: dict[str, str | None]
) -> tuple[UnsupportedChoice, ...]:
    """The rules that ``backends`` (one resolution's choices) break on ``capability`` in ``release``."""
    return tuple(
        rule for rule in UNSUPPORTED if backends.get(rule.setting) == rule.value and rule.applies(release, capability)
    )


def flag_text(rule: UnsupportedChoice) -> str:
    return f"{rule.setting}={rule.value}"
