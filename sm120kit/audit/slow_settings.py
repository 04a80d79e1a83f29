"""Settings that run on 12.x but slowly (or not at all, when chosen by hand): the table ``explain`` and
``recipes --check`` read.

A rule is data: the setting a user controls (a flag, given as its server-argument destination, or an
environment variable), the conditions under which it is slow, why (with the figure or the code location it
rests on), and the fix. Conditions are small predicates over one :class:`Context`: the values SGLang's own
parser read from the command line (``given``, explicit settings only), the values after SGLang's resolution
where they are known (``values``, with the backend-audit keys ``attention_decode`` ...), the environment,
the model's attention kind, the capability, and the source of the SGLang tree itself. A code condition
reads the tree: a rule about a line of SGLang fires only where that line is still there (a patched tree or
a release with the upstream fix passes), and the finding names the file and line it found.

Severity ``slow`` is a warning (``explain --error-on-slow`` makes it an error; a recipe needs a note
saying why such a setting is there); ``no-sm120-code`` is a backend chosen by hand that has no SM120 code
in that release (:mod:`sm120kit.audit.backend_support` holds those facts; ``explain`` already fails on
them, the finding adds the fix); ``over-smem`` is a setting under which a Triton kernel SGLang launches
needs more shared memory per block than a 12.x GPU has, so the server fails at that kernel's first launch
(an error in ``explain`` and ``recipes --check``). An ``over-smem`` rule names the largest value of its
setting that fits; its figures are real Triton compiles for sm_120 of SGLang's own launchers, with their
source (tests/audit/test_lora_limits.py compiles them again).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120kit.audit import backend_support
from sm120kit.hardware.arch import SM120_SHARED_MEMORY_PER_BLOCK
from sm120kit.sglang import pcie_allreduce

SLOW = "slow"
NO_SM120_CODE = "no-sm120-code"
OVER_SMEM = "over-smem"

BENCH_MLA = (
    "docs/benchmarks.md, 'MLA attention on SM120' (H200 in SM120 mode, SGLang 0.5.23's "
    "decode_attention_fwd, MLA 576/512, 16 heads, CUDA graph replay)"
)


# -- the context a rule is evaluated in -------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    release: str | None
    capability: str  # "12.0"
    package_dir: Path | None  # the tree's sglang/ folder (None: code conditions cannot be checked)
    given: Mapping[str, Any]  # server-argument destinations set on the command line (SGLang's parser)
    values: Mapping[str, Any]  # resolved server-argument fields and backend-audit keys, where known
    env: Mapping[str, str] = field(default_factory=dict)
    attention: str | None = None  # "mla", "mha" (every non-MLA kind) or None (unknown)
    sm_count: int | None = None

    def value(self, name: str) -> Any:
        if name in self.values and self.values[name] is not None:
            return self.values[name]
        return self.given.get(name)

    def read(self, relpath: str) -> str | None:
        if self.package_dir is None:
            return None
        cache = self.__dict__.setdefault("_files", {})
        if relpath not in cache:
            path = self.package_dir / relpath
            try:
                cache[relpath] = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                cache[relpath] = None
        return cache[relpath]


# -- conditions (each returns False, or True / a code location string when it holds) ----------------------


@dataclass(frozen=True)
class Given:
    """A server argument set on the command line, with an optional test of its value."""

    dest: str
    test: Callable[[Any, Context], bool] | None = None
    text: str = ""

    def check(self, ctx: Context):
        if self.dest not in ctx.given:
            return False
        return True if self.test is None else bool(self.test(ctx.given[self.dest], ctx))


@dataclass(frozen=True)
class Value:
    """A resolved value (or, without a resolution, the given one) is one of ``choices`` / passes ``test``."""

    name: str
    choices: tuple[str, ...] = ()
    prefix: str | None = None

    def check(self, ctx: Context):
        value = ctx.value(self.name)
        if value is None:
            return False
        text = str(value)
        return text in self.choices or (self.prefix is not None and text.startswith(self.prefix))


@dataclass(frozen=True)
class Env:
    """An environment variable set to a value SGLang reads as true."""

    name: str

    def check(self, ctx: Context):
        return str(ctx.env.get(self.name, "")).strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Attention:
    kind: str  # "mla" or "mha"

    def check(self, ctx: Context):
        return ctx.attention == self.kind


@dataclass(frozen=True)
class Code:
    """The tree's ``path`` (relative to ``sglang/``) matches ``pattern`` (``present``) or does not.

    A present match yields "sglang/PATH:LINE" for the finding's source. Without a readable tree the
    condition fails either way (no finding rests on code that could not be read)."""

    path: str
    pattern: str
    present: bool = True

    def check(self, ctx: Context):
        text = ctx.read(self.path)
        if text is None:
            return False
        lines = [text.count("\n", 0, m.start()) + 1 for m in re.finditer(self.pattern, text)]
        if not self.present:
            return not lines
        return f"sglang/{self.path}:{','.join(map(str, lines))}" if lines else False


@dataclass(frozen=True)
class AnyOf:
    """At least one of ``conditions`` holds (the first that does gives the finding's location)."""

    conditions: tuple

    def check(self, ctx: Context):
        for cond in self.conditions:
            got = cond.check(ctx)
            if got:
                return got
        return False


@dataclass(frozen=True)
class CodeAny:
    """:class:`Code` over the places a file has had across releases: the first of ``paths`` the tree has."""

    paths: tuple[str, ...]
    pattern: str

    def check(self, ctx: Context):
        for path in self.paths:
            if ctx.read(path) is not None:
                return Code(path, self.pattern).check(ctx)
        return False


@dataclass(frozen=True)
class NoneOf:
    """None of ``conditions`` holds."""

    conditions: tuple

    def check(self, ctx: Context):
        return not any(cond.check(ctx) for cond in self.conditions)


@dataclass(frozen=True)
class Switch:
    """An SGLang boolean switch in the environment set to true, read as SGLang's ``EnvBool`` reads it."""

    name: str

    def check(self, ctx: Context):
        return bool(pcie_allreduce.env_bool(ctx.env.get(self.name)))


@dataclass(frozen=True)
class Deterministic:
    """Deterministic collectives on: ``--enable-deterministic-inference`` or its variables (SGLang 0.5.21's
    ``_deterministic_collectives_enabled``)."""

    def check(self, ctx: Context):
        return pcie_allreduce.deterministic(ctx.env, ctx.given)


@dataclass(frozen=True)
class AnyGiven:
    """At least one of the server arguments is set on the command line to a value that is not empty/false."""

    dests: tuple[str, ...]

    def check(self, ctx: Context):
        return any(ctx.given.get(d) not in (None, False, "", [], ()) for d in self.dests)


# Where a release declares its server-argument defaults: server_args.py up to 0.5.19, the argument groups after.
_ARG_FILES = ("srt/server_args.py", "srt/arg_groups/fields/lora.py")


@dataclass(frozen=True)
class ArgumentIs:
    """The server argument ``dest`` is ``value``: as resolved or given, else the default the tree declares
    (``dest: str = "csgmv"`` or ``dest: A[..., Arg(...)] = "csgmv"``, read with a bounded pattern)."""

    dest: str
    value: str

    def check(self, ctx: Context):
        current = ctx.value(self.dest)
        if current is None:
            current = _declared_default(ctx, self.dest)
        return current is not None and str(current) == self.value


def _declared_default(ctx: Context, dest: str) -> str | None:
    """The string default the tree declares for a server argument, or None (not found, not a string)."""
    one_line = re.compile(r"(?m)^[ \t]{0,12}" + re.escape(dest) + r'[ \t]*:[^\n=]{0,80}=[ \t]*"(\w{1,40})"')
    annotated = re.compile(r"(?m)^[ \t]{0,12}" + re.escape(dest) + r"[ \t]*:[ \t]*A\[")
    closing = re.compile(r'(?m)^[ \t]{0,12}\][ \t]*=[ \t]*"(\w{1,40})"')
    for path in _ARG_FILES:
        text = ctx.read(path)
        if not text:
            continue
        found = one_line.search(text)
        if found:
            return found.group(1)
        opened = annotated.search(text)
        if opened:
            found = closing.search(text, opened.end(), opened.end() + 4000)
            if found:
                return found.group(1)
    return None


@dataclass(frozen=True)
class NoSm120Code:
    """The backend-audit key's value has no SM120 code in this release (backend_support's table)."""

    key: str

    def check(self, ctx: Context):
        backends = {self.key: _str(ctx.value(self.key))}
        return bool(backend_support.unsupported_choices(ctx.release, ctx.capability, backends))


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


# -- the rules --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlowRule:
    id: str
    setting: str  # as the user writes it: "--triton-attention-num-kv-splits", "SGLANG_..."
    when: tuple
    why: str
    source: str
    fix: str
    severity: str = SLOW
    # The flags (without dashes) or environment variables a recipe note may carry `slow` on to keep it.
    recipe_keys: tuple[str, ...] = ()
    value_of: str | None = None  # the destination or variable whose value the finding shows
    capabilities: tuple[str, ...] = backend_support.SM12X
    largest_fitting: str | None = None  # over-smem: the largest value of the setting whose kernels fit

    def evaluate(self, ctx: Context) -> SlowFinding | None:
        if ctx.capability not in self.capabilities:
            return None
        where: list[str] = []
        for cond in self.when:
            got = cond.check(ctx)
            if not got:
                return None
            if isinstance(got, str):
                where.append(got)
        name = self.value_of or ""
        if name.startswith("SGLANG_"):
            value, origin = ctx.env.get(name), "environment"
        elif name in ctx.given:
            value, origin = ctx.given[name], "command line"
        else:
            value, origin = ctx.value(name), "SGLang's choice"
        source = self.source + (f"; found in this tree at {', '.join(where)}" if where else "")
        return SlowFinding(
            self.id,
            self.setting,
            _str(value),
            origin,
            self.severity,
            self.why.format(**_fmt(ctx)),
            source,
            self.fix.format(**_fmt(ctx)),
            self.recipe_keys,
            self.largest_fitting,
        )

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "setting": self.setting,
            "severity": self.severity,
            "why": self.why,
            "source": self.source,
            "fix": self.fix,
            "capabilities": list(self.capabilities),
            "largest_fitting_value": self.largest_fitting,
        }


@dataclass(frozen=True)
class SlowFinding:
    rule: str
    setting: str
    value: str | None
    origin: str  # "command line", "environment" or "SGLang's choice"
    severity: str
    why: str
    source: str
    fix: str
    recipe_keys: tuple[str, ...] = ()
    largest_fitting: str | None = None  # over-smem: the largest value of the setting whose kernels fit on 12.x

    def __str__(self) -> str:
        return f"{self.setting}={self.value}" if self.value is not None else self.setting

    def to_json(self) -> dict:
        return {
            "rule": self.rule,
            "setting": self.setting,
            "value": self.value,
            "origin": self.origin,
            "severity": self.severity,
            "why": self.why,
            "source": self.source,
            "fix": self.fix,
            "largest_fitting_value": self.largest_fitting,
        }


def wanted_splits(sm_count: int | None) -> int:
    """The split cap SGLang's own MLA code picks on a device: the next power of two of its SM count (the
    context-length term only lowers it for short contexts); 256 on a 188-SM RTX PRO 6000 Blackwell."""
    if not sm_count or sm_count <= 0:
        return 256
    return 1 << (sm_count - 1).bit_length()


def _fmt(ctx: Context) -> dict:
    return {"wanted": wanted_splits(ctx.sm_count), "sm": ctx.sm_count or "its"}


def _low_splits(value: Any, ctx: Context) -> bool:
    try:
        return int(value) < wanted_splits(ctx.sm_count)
    except (TypeError, ValueError):
        return False


_TRITON_BACKEND = "srt/layers/attention/triton_backend.py"
# A tree whose Triton backend raises the split cap from the SM count for every model: sm120kit's
# sm120-decode-kv-splits patch, or the upstream form its patch.toml marker matches (sglang PR #21775).
_SPLITS_RAISED = (
    Code(_TRITON_BACKEND, r"_sm120_decode_kv_splits_cap\(", present=False),
    Code(_TRITON_BACKEND, r"(?m)^        self\.max_kv_splits = max\([^\n]*device_core_count", present=False),
)
_FLASHINFER_MLA = "srt/layers/attention/flashinfer_mla_backend.py"

_SPLITS_WHY = (
    "The Triton decode kernel splits each request's KV into at most this many parts; with few splits a "
    "batch-1 long-context decode keeps only a few of the GPU's {sm} SMs busy. Measured per layer at 185k "
    "context, batch 1: 8 splits 2.368 ms, 64 splits 0.327 ms, 256 splits 0.184 ms (12.9x between 8 and 256)."
)
_SPLITS_FIX = (
    "Give --triton-attention-num-kv-splits {wanted} (the next power of two of the SM count, the cap SGLang "
    "0.5.12 and later give MLA decode themselves). SGLang still picks fewer splits per request at "
    "short contexts; the cap sizes a float32 buffer of batch x heads x splits x (value dims + 1) values "
    "for the largest CUDA-graph batch."
)
_FP8_FI_WHY = (
    "With an fp8 KV cache the FlashInfer MLA backend converts the layer's whole KV pool to the query dtype "
    "on every forward (get_key_buffer(layer.layer_id).to(q.dtype), in prefill and decode): the cost grows "
    "with the pool size (every token the server can hold), not with the tokens a batch attends to."
)
_FP8_FI_FIX = (
    "Use --attention-backend triton (SGLang's default for MLA on 12.x; its MLA decode reads fp8 KV directly), "
    "or keep the KV cache in the model dtype (--kv-cache-dtype auto), or run a tree where the FlashInfer MLA "
    "backend converts only the pages a batch reads (upstream PR #35322)."
)
_TRTLLM_FIX = (
    "Choose a backend with SM120 code: --attention-backend triton or flashinfer (MLA: triton); "
    "MoE: leave --moe-runner-backend to SGLang (auto) or use triton / flashinfer_cutlass."
)


def _tp(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 1


_PARALLEL_STATE = "srt/distributed/parallel_state.py"
_TP_PCIE_IPC = Given("tp_size", lambda v, _ctx: _tp(v) in pcie_allreduce.WORLD_SIZES)
_TP_OTHER = Given("tp_size", lambda v, _ctx: _tp(v) > 1 and _tp(v) not in pcie_allreduce.WORLD_SIZES)
_HAS_PCIE_IPC = (
    Code(pcie_allreduce.UPSTREAM_MODULE, pcie_allreduce.ENABLE_VAR),
    Code(pcie_allreduce.BACKPORT_MODULE, pcie_allreduce.ENABLE_VAR),
)
_AR_WHY = (
    "No compute-capability 12.x card has NVLink, so with tensor parallelism every decode step's all-reduces "
    "(two a layer, hidden size x 2 bytes each at batch 1: 14 KiB for hidden 7168, 122 a token for 61 layers) "
    "cross PCIe, each bound by latency rather than bandwidth. SGLang's custom all-reduce refuses more than two "
    "PCIe-only GPUs and GPUs without peer access, so NCCL serves them."
)
_AR_SOURCE = (
    f"sglang 0.5.21's pcie_ipc_ar.py ({pcie_allreduce.SOURCE}), measured on an 8x SM120 host: "
    f"{pcie_allreduce.MEASURED}; custom_all_reduce_utils.py: 'not supported on more than two PCIe-only "
    "GPUs'"
)
_AR_FLASHINFER = (
    f"it needs FlashInfer {pcie_allreduce.FLASHINFER_FIRST} or newer (pcie_ipc_comm; `sm120kit "
    "verify` says whether the installed one has it) and bf16 activations"
)

# -- LoRA kernels over 12.x's shared memory at non-default settings --------------------------------------------

# The figures: metadata.shared of SGLang 0.5.23's own launchers, compiled for sm_120 by Triton 3.9.0 under a
# faked RTX PRO 6000 (tests/support/lora_smem_probe.py; tests/audit/test_lora_limits.py compiles them again and
# compares).
LORA_SOURCE = (
    "compiled for sm_120 by Triton 3.9.0 through SGLang 0.5.23's own launchers on a faked RTX PRO 6000 "
    "(Llama-3-8B shapes: K 4096, rank 64 unless said, bf16; Qwen3-30B-A3B for the MoE shrink); "
    "tests/support/lora_smem_probe.py compiles them, tests/audit/test_lora_limits.py checks these figures"
)
CSGMV_SHRINK_BYTES = {16: 32768, 32: 49152, 64: 81920, 128: 147456}  # chunk (BLOCK_M) -> bytes, default tiles
CSGMV_TUNED_128 = 73728  # chunk 128 with a tuned tile of BLOCK_K 128 (BLOCK_N 16)
CSGMV_LARGEST_FITTING_CHUNK = 64
EXP_SHRINK_BYTES = {64: 81920, 128: 147456}  # BLOCK_R (next power of two of slices x rank) -> bytes
EXP_EXPAND_BYTES = {64: 69632, 128: 139264}  # rank -> bytes (BLOCK_R = next power of two of the rank)
EXP_MOE_SHRINK_BYTES = {(64, 16): 81920, (128, 16): 147456, (128, 512): 81920}  # (rank, tokens) -> bytes
EXP_LARGEST_FITTING_RANK = 21  # qkv: next_pow2(3 x 21) = 64; 22 gives 128

_CSGMV_SHRINK = (
    "kernels/ops/lora/dense/chunked_sgmv_shrink.py",
    "kernels/ops/gemm/chunked_sgmv_shrink.py",
    "srt/lora/triton_ops/chunked_sgmv_shrink.py",
)
_CSGMV_TUNING = (
    "kernels/ops/lora/dense/lora_tuning_config.py",
    "kernels/ops/gemm/lora_tuning_config.py",
    "srt/lora/triton_ops/lora_tuning_config.py",
)
_EXP_SHRINK = (
    "kernels/ops/lora/dense/trtllm_lora_temp/sgemm_lora_a.py",
    "kernels/ops/gemm/trtllm_lora_temp/sgemm_lora_a.py",
    "srt/lora/trtllm_lora_temp/triton_ops/sgemm_lora_a.py",
)
_LORA_ON = AnyGiven(("enable_lora", "lora_paths", "max_lora_rank", "lora_target_modules"))


@dataclass(frozen=True)
class ExperimentalLoraOver:
    """With SGLang's experimental LoRA kernels (SGLANG_EXPERIMENTAL_LORA_OPTI), the given --max-lora-rank reaches
    a kernel over the limit. The dense shrink's tile is the next power of two of slices x rank (qkv 3, gate_up
    2): over from rank 22. From 0.5.16 SGLang sends a layer through the experimental dense kernels only while
    slices x rank <= 128 and rank <= 64 (``supports_two_stream_dense_lora``), so above rank 64 only the
    virtual-experts MoE shrink (``--lora-use-virtual-experts``) is left over; 0.5.13-0.5.15 have no such gate."""

    def check(self, ctx: Context):
        rank = _int(ctx.given.get("max_lora_rank"))
        if rank <= EXP_LARGEST_FITTING_RANK:
            return False
        if rank <= 64:
            return True
        gated = any(
            re.search(r"def supports_two_stream_dense_lora\(", ctx.read(p) or "")
            for p in ("srt/lora/trtllm_lora_temp/__init__.py",)
        )
        return (not gated) or bool(ctx.given.get("lora_use_virtual_experts"))


RULES: tuple[SlowRule, ...] = (
    SlowRule(
        "pcie-allreduce-off",
        pcie_allreduce.ENABLE_VAR,
        (_TP_PCIE_IPC, AnyOf(_HAS_PCIE_IPC), NoneOf((Switch(pcie_allreduce.ENABLE_VAR),))),
        _AR_WHY + " This release has FlashInfer's PCIe-IPC all-reduce for exactly these reductions, but it is "
        "off unless SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set.",
        _AR_SOURCE,
        f"Set SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 ({_AR_FLASHINFER}). Its workspace is sized for the largest "
        "captured decode batch (--cuda-graph-max-bs), so prefill-sized reductions stay on NCCL.",
        recipe_keys=(pcie_allreduce.ENABLE_VAR, "tp-size"),
        value_of=pcie_allreduce.ENABLE_VAR,
    ),
    SlowRule(
        "pcie-allreduce-deterministic",
        "--enable-deterministic-inference",
        (_TP_PCIE_IPC, AnyOf(_HAS_PCIE_IPC), Switch(pcie_allreduce.ENABLE_VAR), Deterministic()),
        "Deterministic inference keeps the PCIe-IPC all-reduce off although SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is "
        "set (its kernels choose a launch per shape, so the order of the sums would follow the batch): every "
        "decode all-reduce goes to NCCL over PCIe. " + _AR_WHY,
        _AR_SOURCE + "; pcie_ipc_ar.eligible_group returns False when deterministic",
        "Leave out --enable-deterministic-inference (and SGLANG_ENABLE_DETERMINISTIC_INFERENCE, "
        "SGLANG_USE_1STAGE_ALLREDUCE=1) unless identical outputs from run to run are required.",
        recipe_keys=("enable-deterministic-inference", pcie_allreduce.DETERMINISTIC_VAR, pcie_allreduce.ONE_STAGE_VAR),
    ),
    SlowRule(
        "pcie-allreduce-missing",
        "--tp-size",
        (_TP_PCIE_IPC, Code(_PARALLEL_STATE, r"class GroupCoordinator"), NoneOf(_HAS_PCIE_IPC)),
        _AR_WHY + " This release has no PCIe-IPC all-reduce (SGLang has it from 0.5.21 on).",
        _AR_SOURCE,
        f"Run SGLang 0.5.21 or newer and set SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 ({_AR_FLASHINFER}); on "
        f"0.5.16 to 0.5.20 `sm120kit apply` adds it (patch {pcie_allreduce.BACKPORT_PATCH}), then set the variable.",
        recipe_keys=("tp-size",),
        value_of="tp_size",
    ),
    SlowRule(
        "pcie-allreduce-tp-size",
        "--tp-size",
        (_TP_OTHER, Code(_PARALLEL_STATE, r"class GroupCoordinator")),
        _AR_WHY + " FlashInfer's PCIe-IPC all-reduce serves 2, 4 or 8 ranks only, so with this TP size no "
        "release can take them off NCCL.",
        _AR_SOURCE + "; pcie_ipc_ar._SUPPORTED_WORLD_SIZES = (2, 4, 8)",
        "Use --tp-size 2, 4 or 8 (with SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1), e.g. with pipeline or data "
        "parallelism for the remaining GPUs.",
        recipe_keys=("tp-size",),
        value_of="tp_size",
    ),
    SlowRule(
        "triton-kv-splits-low",
        "--triton-attention-num-kv-splits",
        (
            Given("triton_attention_num_kv_splits", _low_splits),
            Value("attention_decode", ("triton",)),
            Attention("mha"),
            *_SPLITS_RAISED,
        ),
        _SPLITS_WHY + " For non-MLA models the value is the cap itself in every release up to 0.5.23 "
        "(upstream PR #35801 open) unless sm120kit's sm120-decode-kv-splits patch is applied.",
        BENCH_MLA + "; sglang/srt/layers/attention/triton_backend.py: max_kv_splits = triton_attention_num_kv_splits",
        _SPLITS_FIX,
        recipe_keys=("triton-attention-num-kv-splits",),
        value_of="triton_attention_num_kv_splits",
    ),
    SlowRule(
        "triton-kv-splits-low-mla",
        "--triton-attention-num-kv-splits",
        (
            Given("triton_attention_num_kv_splits", _low_splits),
            Value("attention_decode", ("triton",)),
            Attention("mla"),
            Code(_TRITON_BACKEND, r"_mla_decode_kv_splits_cap", present=False),
            *_SPLITS_RAISED,
        ),
        _SPLITS_WHY + " This release caps MLA decode at the value too (from 0.5.12 SGLang raises the MLA "
        "cap from the SM count and context length, _mla_decode_kv_splits_cap, upstream PR #20479; then a "
        "low value is harmless for MLA).",
        BENCH_MLA + "; _mla_decode_kv_splits_cap is absent from this tree's "
        "sglang/srt/layers/attention/triton_backend.py",
        _SPLITS_FIX,
        recipe_keys=("triton-attention-num-kv-splits",),
        value_of="triton_attention_num_kv_splits",
    ),
    SlowRule(
        "fp8-kv-flashinfer-mla",
        "--kv-cache-dtype",
        (
            Value("kv_cache_dtype", prefix="fp8"),
            Value("attention_decode", ("flashinfer",)),
            Attention("mla"),
            Code(_FLASHINFER_MLA, r"get_key_buffer\(\s*layer\.layer_id\s*\)\s*\.to\(\s*q\.dtype\s*\)"),
        ),
        _FP8_FI_WHY,
        "the conversion is in every release 0.5.2-0.5.23 (forward_batch.token_to_kv_pool... up to 0.5.13, "
        "self.token_to_kv_pool... from 0.5.14); upstream PR #35322 open",
        _FP8_FI_FIX,
        recipe_keys=("kv-cache-dtype", "attention-backend"),
        value_of="kv_cache_dtype",
    ),
    SlowRule(
        "static-kv-splits",
        "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS",
        (
            Env("SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS"),
            Value("attention_decode", ("triton",)),
            Attention("mla"),
            Code(_TRITON_BACKEND, r"_mla_decode_kv_splits_cap\("),
            Code(_TRITON_BACKEND, r"SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS"),
            Code(_TRITON_BACKEND, r"num_kv_splits\.fill_\(\s*self\.max_kv_splits\s*\)"),
        ),
        "Every request decodes with the maximum split count instead of the count SGLang picks from its "
        "length and the SM count. For MLA this release raises the maximum to the next power of two of the "
        "SM count (_mla_decode_kv_splits_cap; 256 on "
        "an RTX PRO 6000 Blackwell), and at short contexts that many splits is slow: at 8k context, batch 32, "
        "256 splits took 0.389 ms per layer against 0.161 ms with 8; batch 1, 0.073 against 0.031 ms with 64.",
        BENCH_MLA + " (MLA decode, every case)",
        "Unset SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS (it is meant for debugging and determinism checks).",
        recipe_keys=("SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS",),
        value_of="SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS",
    ),
    SlowRule(
        "radix-force-miss",
        "SGLANG_RADIX_FORCE_MISS",
        (Env("SGLANG_RADIX_FORCE_MISS"), Code("srt/mem_cache/common.py", r"SGLANG_RADIX_FORCE_MISS")),
        "Every prefix-cache lookup is turned into a miss (zero_match_result), so shared prompt prefixes are "
        "prefilled again for every request.",
        "code: the match result is replaced by zero_match_result",
        "Unset SGLANG_RADIX_FORCE_MISS (a test switch); to turn the prefix cache off on purpose use "
        "--disable-radix-cache.",
        recipe_keys=("SGLANG_RADIX_FORCE_MISS",),
        value_of="SGLANG_RADIX_FORCE_MISS",
    ),
    SlowRule(
        "draft-extend-no-cuda-graph",
        "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH",
        (
            Env("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH"),
            Value("speculative_algorithm", ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "FROZEN_KV_MTP")),
            Code("srt/speculative/eagle_worker_v2.py", r"not envs\.SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH"),
        ),
        "The EAGLE draft model's extend step is not captured in a CUDA graph, so it runs eagerly, launch by "
        "launch, on every speculative step.",
        "code: the draft-extend CUDA graph runner is only built when the variable is unset",
        "Unset SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH.",
        recipe_keys=("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH",),
        value_of="SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH",
    ),
    SlowRule(
        "trtllm-attention-explicit",
        "--attention-backend",
        (
            Given("attention_backend", lambda v, _ctx: str(v) in ("trtllm_mla", "trtllm_mha")),
            NoSm120Code("attention_decode"),
        ),
        "A trtllm attention backend was chosen by hand; in this release it has no SM120 code for decode "
        "(trtllm_mla: SM100-only trtllm-gen kernels in every release; trtllm_mha: before 0.5.10).",
        "sm120kit's backend rules (explain --json 'rules'); sglang issue #24633",
        _TRTLLM_FIX,
        severity=NO_SM120_CODE,
        recipe_keys=(),
        value_of="attention_backend",
    ),
    SlowRule(
        "trtllm-attention-explicit-prefill",
        "--attention-backend",
        (Given("attention_backend", lambda v, _ctx: str(v) == "trtllm_mha"), NoSm120Code("attention_prefill")),
        "trtllm_mha was chosen by hand; before 0.5.19 its prefill uses trtllm-gen kernels only (SM100).",
        "sm120kit's backend rules (explain --json 'rules'); fmha_v2 prefill for SM120 first in 0.5.19",
        _TRTLLM_FIX,
        severity=NO_SM120_CODE,
        recipe_keys=(),
        value_of="attention_backend",
    ),
    SlowRule(
        "trtllm-moe-explicit",
        "--moe-runner-backend",
        (Given("moe_runner_backend", lambda v, _ctx: str(v) == "flashinfer_trtllm"), NoSm120Code("moe_runner")),
        "The flashinfer_trtllm MoE runner was chosen by hand; its trtllm-gen fused MoE kernels are built for "
        "SM100/SM103 only.",
        "sm120kit's backend rules (explain --json 'rules'): srt/layers/moe/moe_runner/flashinfer_trtllm.py has "
        "no SM120 branch",
        _TRTLLM_FIX,
        severity=NO_SM120_CODE,
        recipe_keys=(),
        value_of="moe_runner_backend",
    ),
    SlowRule(
        "lora-csgmv-chunk-over-smem",
        "--max-lora-chunk-size",
        (
            Given("max_lora_chunk_size", lambda v, _ctx: _int(v) > CSGMV_LARGEST_FITTING_CHUNK),
            _LORA_ON,
            ArgumentIs("lora_backend", "csgmv"),
            # the default tile: in lora_tuning_config.py where the release has it (0.5.12 on), else in the launcher
            CodeAny(
                _CSGMV_TUNING + _CSGMV_SHRINK,
                r"(?m)DEFAULT_SHRINK_CONFIG\s*=\s*\{[^}]{0,80}\"BLOCK_K\":\s*256|^[ \t]{0,8}BLOCK_K\s*=\s*256\b",
            ),
        ),
        "SGLang's csgmv LoRA backend runs its shrink kernel (_chunked_lora_shrink_kernel) with BLOCK_M = the chunk "
        "size, BLOCK_N 16, BLOCK_K 256 and 3 stages (unless a tuned tile file says otherwise); compiled for sm_120 "
        f"it needs {CSGMV_SHRINK_BYTES[128]} B of shared memory at chunk 128 ({CSGMV_SHRINK_BYTES[64]} B at 64, "
        f"{CSGMV_SHRINK_BYTES[32]} B at 32, {CSGMV_SHRINK_BYTES[16]} B at 16), more than the "
        f"{SM120_SHARED_MEMORY_PER_BLOCK} B a 12.x block has, so the first batch SGLang splits into 128-token "
        "chunks (256 tokens or more) fails with 'out of resource: shared memory'.",
        LORA_SOURCE,
        f"Give --max-lora-chunk-size {CSGMV_LARGEST_FITTING_CHUNK} (the largest that fits: "
        f"{CSGMV_SHRINK_BYTES[64]} B) or leave the default 16. Releases that read tuned csgmv tiles "
        "(lora_tuning_config, 0.5.12 on) also run chunk 128 within the limit with a tile file that SGLang itself "
        "loads: $SGLANG_LORA_CONFIG_DIR/csgmv_configs/triton_<version>/lora_shrink,K=<in>,R=<rank>,S=<slices>,"
        'device=<GPU name>.json with an entry "128": {{"BLOCK_N": 16, "BLOCK_K": 128}} '
        f"({CSGMV_TUNED_128} B).",
        severity=OVER_SMEM,
        recipe_keys=("max-lora-chunk-size",),
        value_of="max_lora_chunk_size",
        largest_fitting=str(CSGMV_LARGEST_FITTING_CHUNK),
    ),
    SlowRule(
        "lora-experimental-rank-over-smem",
        "--max-lora-rank",
        (Env("SGLANG_EXPERIMENTAL_LORA_OPTI"), ExperimentalLoraOver(), CodeAny(_EXP_SHRINK, r"BLOCK_K\s*=\s*256")),
        "SGLANG_EXPERIMENTAL_LORA_OPTI switches LoRA to the experimental trtllm_lora_temp kernels, whose tiles are "
        "fixed: the shrink (_sgemm_lora_a_kernel: BLOCK_S 16, BLOCK_K 256, 3 stages, BLOCK_R the next power of two "
        f"of slices x rank) needs {EXP_SHRINK_BYTES[128]} B at BLOCK_R 128 (qkv rank 22-42, gate_up rank 33-64; "
        f"{EXP_SHRINK_BYTES[64]} B at 64), the expand (_sgemm_lora_b_kernel, BLOCK_N 256) "
        f"{EXP_EXPAND_BYTES[128]} B at rank 128 ({EXP_EXPAND_BYTES[64]} B at 64), and the virtual-experts MoE "
        f"shrink (_moe_lora_shrink_splitk_kernel, BLOCK_K 256) {EXP_MOE_SHRINK_BYTES[(128, 16)]} B at rank 128 "
        f"below 512 tokens ({EXP_MOE_SHRINK_BYTES[(64, 16)]} B at rank 64), against "
        f"{SM120_SHARED_MEMORY_PER_BLOCK} B on 12.x. From 0.5.16 "
        "SGLang takes the experimental dense path only while slices x rank <= 128 and rank <= 64; above rank 64 "
        "the MoE shrink (--lora-use-virtual-experts) is what remains over.",
        LORA_SOURCE,
        f"Give --max-lora-rank {EXP_LARGEST_FITTING_RANK} or lower (the largest that fits every experimental "
        "kernel: qkv's shrink tile stays at 64; 16 among power-of-two ranks), or unset SGLANG_EXPERIMENTAL_LORA_OPTI: "
        "SGLang's default LoRA kernels fit at these ranks (csgmv shrink "
        f"{CSGMV_SHRINK_BYTES[16]} B at its default chunk 16, rank 64).",
        severity=OVER_SMEM,
        recipe_keys=("max-lora-rank", "SGLANG_EXPERIMENTAL_LORA_OPTI"),
        value_of="max_lora_rank",
        largest_fitting=str(EXP_LARGEST_FITTING_RANK),
    ),
)


def find(ctx: Context) -> tuple[SlowFinding, ...]:
    """The findings of every rule that holds in ``ctx`` (one per rule), in table order."""
    found = []
    for rule in RULES:
        finding = rule.evaluate(ctx)
        if finding is not None:
            found.append(finding)
    return tuple(found)


# -- inputs shared by explain and recipes -----------------------------------------------------------------

_MLA_TEXT = re.compile(r"\bMLA\b|latent attention", re.IGNORECASE)


def attention_kind_from_text(text: str) -> str:
    """A recipe's [model].architecture text -> "mla" or "mha"."""
    return "mla" if _MLA_TEXT.search(text or "") else "mha"


def attention_kind_from_config(config: Mapping[str, Any]) -> str | None:
    """A model's config.json -> "mla" when it has a compressed (latent) KV rank, else "mha"."""
    if not config:
        return None
    inner = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    return "mla" if config.get("kv_lora_rank") or inner.get("kv_lora_rank") else "mha"


def backend_values(given: Mapping[str, Any]) -> dict[str, Any]:
    """The backend-audit keys a command line fixes by itself (no resolution): --attention-backend sets
    prefill and decode unless --prefill/--decode-attention-backend say otherwise."""
    base = given.get("attention_backend")
    return {
        "attention_prefill": given.get("prefill_attention_backend") or base,
        "attention_decode": given.get("decode_attention_backend") or base,
        "moe_runner": given.get("moe_runner_backend"),
    }


__all__ = [
    "Context",
    "SlowRule",
    "SlowFinding",
    "RULES",
    "find",
    "wanted_splits",
    "SLOW",
    "NO_SM120_CODE",
    "OVER_SMEM",
    "AnyOf",
    "NoneOf",
    "Switch",
    "Deterministic",
    "attention_kind_from_text",
    "attention_kind_from_config",
    "backend_values",
]
