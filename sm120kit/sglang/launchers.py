"""Where SGLang keeps the Triton launchers the shared-memory audit runs, release by release.

Files move between releases: the attention kernels are under ``srt/layers/attention/triton_ops/`` up to
0.5.15 and under ``kernels/ops/attention/`` from 0.5.16; the fused-MoE kernels moved from
``srt/layers/moe/fused_moe_triton/`` to ``srt/layers/moe/moe_runner/triton_utils/`` and then to
``kernels/ops/moe/``. Each launcher lists its candidate modules newest first; the first one present in a
tree is the one that tree uses. This module reads files only (no import of SGLang or torch), so the
audit's cache keys can be computed without starting a probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sm120kit.errors import NotSglangTree


@dataclass(frozen=True)
class LauncherSpec:
    kind: str  # "extend" | "decode" | "prefill" | "moe" | "ds-extend" | "inkling-moe" | "tree-verify" | "mla-decode"
    #          | "lightning"
    function: str  # the launcher SGLang's backends call
    modules: tuple[str, ...]  # candidate modules defining `function`, newest layout first
    helper_modules: tuple[tuple[str, ...], ...] = ()  # more source the kernels depend on (each: candidates)
    helper_files: tuple[str, ...] = ()  # more source beside the launcher module that is no module (file names)
    policy_global: str | None = None  # the module global its block-size policy reads


CAPABILITY_HELPERS = ("sglang.srt.utils.common", "sglang.srt.utils")
"""Where ``is_cuda()`` and the capability helpers live (0.5.3 on / 0.5.2)."""


def _attention_module(name: str) -> tuple[str, str]:
    """A Triton attention module where SGLang keeps it from 0.5.16 on, then where it was up to 0.5.15."""
    return (f"sglang.kernels.ops.attention.{name}", f"sglang.srt.layers.attention.triton_ops.{name}")


# The modules sm120-mla-attention adds beside sm120_mla (the first is the CUDA kernels' launcher), and its CUDA
# source, which that launcher reads from beside itself.
MLA_HELPERS = tuple(_attention_module(name) for name in ("sm120_mla_mma", "sm120_mla_route", "sm120_mla_nvrtc"))
MLA_HELPER_FILES = ("sm120_mla_mma.cu",)

LAUNCHERS: dict[str, LauncherSpec] = {
    "extend": LauncherSpec(
        "extend",
        "extend_attention_fwd",
        _attention_module("extend_attention"),
        helper_modules=(CAPABILITY_HELPERS,),
        policy_global="CUDA_CAPABILITY",
    ),
    "decode": LauncherSpec(
        "decode",
        "decode_attention_fwd",
        _attention_module("decode_attention"),
        helper_modules=(CAPABILITY_HELPERS,),
    ),
    "prefill": LauncherSpec(
        "prefill",
        "context_attention_fwd",
        _attention_module("prefill_attention"),
        helper_modules=(CAPABILITY_HELPERS,),
        policy_global="CUDA_CAPABILITY",
    ),
    "moe": LauncherSpec(
        "moe",
        "invoke_fused_moe_kernel",
        (
            "sglang.kernels.ops.moe.fused_moe_triton_kernels",
            "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_kernels",
            "sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_kernels",
        ),
        helper_modules=(
            (
                "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config",
                "sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_config",
            ),
            CAPABILITY_HELPERS,
        ),
    ),
    # The double-sparsity backend's own copy of the extend launcher (--enable-double-sparsity; the file
    # is gone from 0.5.11).
    "ds-extend": LauncherSpec(
        "ds-extend",
        "extend_attention_fwd",
        ("sglang.srt.layers.attention.triton_ops.double_sparsity_attention",),
        helper_modules=(CAPABILITY_HELPERS,),
        policy_global="CUDA_CAPABILITY",
    ),
    # Inkling's MoE grouped GEMM (0.5.16 on; moved to kernels/ops/moe/ in 0.5.17).
    "inkling-moe": LauncherSpec(
        "inkling-moe",
        "grouped_gemm_triton",
        ("sglang.kernels.ops.moe.inkling_moe", "sglang.srt.layers.moe.moe_runner.triton_utils.inkling_moe"),
        helper_modules=(CAPABILITY_HELPERS,),
    ),
    # Lightning attention's prefill (linear attention: _fwd_diag_kernel, _fwd_kv_parallel, _fwd_kv_reduce,
    # _fwd_none_diag_kernel), run by the lightning backend when a model's config sets linear_backend
    # "minimax" (Bailing linear / MiniCPM hybrid models); under srt/layers/attention/linear/ up to 0.5.15.
    "lightning": LauncherSpec(
        "lightning",
        "lightning_attention",
        ("sglang.kernels.ops.attention.linear.lightning_attn", "sglang.srt.layers.attention.linear.lightning_attn"),
    ),
    # Added by the series' sm120-mla-attention patch (absent from unpatched releases).
    # Its sibling files (the route, the CUDA kernels' launcher, NVRTC calls and source) are helpers: their
    # source is part of the audit's cache key.
    "tree-verify": LauncherSpec(
        "tree-verify",
        "sm120_tree_verify_fwd",
        _attention_module("sm120_mla"),
        MLA_HELPERS,
        helper_files=MLA_HELPER_FILES,
    ),
    "mla-decode": LauncherSpec(
        "mla-decode",
        "sm120_mla_decode_fwd",
        _attention_module("sm120_mla"),
        MLA_HELPERS,
        helper_files=MLA_HELPER_FILES,
    ),
}

MOE_CONFIG_FUNCTION = "try_get_optimal_moe_config"


def module_file(root: Path, module: str) -> Path | None:
    """``root/sglang/a/b.py`` or ``root/sglang/a/b/__init__.py`` for ``sglang.a.b``, if present."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@dataclass(frozen=True)
class ResolvedLauncher:
    spec: LauncherSpec
    module: str | None  # None: this release has no such launcher
    files: tuple[Path, ...]  # the launcher module first, then its helper modules, then its helper files
    helpers: tuple[str, ...] = ()  # helper module names, in the order of files[1:]

    @property
    def present(self) -> bool:
        return self.module is not None

    @property
    def helper_module(self) -> str | None:
        """The first helper module found (the MoE config module for "moe")."""
        return self.helpers[0] if self.helpers else None


def resolve(root: Path, kind: str) -> ResolvedLauncher:
    """Find launcher ``kind`` in the tree whose ``sglang/`` package lies in ``root``."""
    if not (root / "sglang" / "__init__.py").is_file():
        raise NotSglangTree(f"{root} does not hold an sglang package (no sglang/__init__.py).")
    spec = LAUNCHERS[kind]
    for module in spec.modules:
        path = module_file(root, module)
        if path is None:
            continue
        files, helpers = [path], []
        for candidates in spec.helper_modules:
            for helper in candidates:
                helper_path = module_file(root, helper)
                if helper_path is not None:
                    files.append(helper_path)
                    helpers.append(helper)
                    break
        files += [path.parent / name for name in spec.helper_files if (path.parent / name).is_file()]
        return ResolvedLauncher(spec, module, tuple(files), tuple(helpers))
    return ResolvedLauncher(spec, None, ())


def resolve_all(root: Path) -> dict[str, ResolvedLauncher]:
    return {kind: resolve(root, kind) for kind in LAUNCHERS}
