"""Which backends an SGLang tree would choose on a GPU, found by running SGLang's own argument resolution.

For a model folder that holds only a ``config.json`` and a compute capability, SGLang's server arguments
are parsed and resolved (0.5.23: ``ServerArgs.resolve_once()`` read through
``model_override_base.resolved_view``; older releases: ``ServerArgs.__post_init__``) in a separate
interpreter that imports the tree's own ``sglang`` under a faked device
(:mod:`sm120kit.audit.resolve_probe`). The result names the attention (prefill/decode), MoE runner,
sampling, FP8/FP4 GEMM backends and whether DeepGEMM is on, and flags each choice that has no SM120 code
in that release (:mod:`sm120kit.audit.backend_support`).

The device is faked (this machine has no such GPU) and so, where they cannot be imported here, are the
CUDA-only libraries ``sgl_kernel`` and ``torchvision``; whether ``flashinfer`` and ``deep_gemm`` are
installed is an explicit input, since SGLang's choice depends on it. Every stand-in used is named in the
result.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sm120kit import runner
from sm120kit.audit import backend_support, probe_env, slow_settings
from sm120kit.errors import UsageError
from sm120kit.hardware.arch import is_sm12x, parse_capability
from sm120kit.sglang.target import Target, find_target
from sm120kit.util.report import Progress, Step, tell

MODELS_DIR = Path(__file__).resolve().parent / "models"
BUNDLED_MODELS = (
    "llama-mha",
    "qwen3-moe",
    "deepseek-v3-mla",
    "deepseek-v2-lite-mla",
    "gpt-oss",
    "qwen3-next-gdn",
    "qwen2.5-vl",
)
DEFAULT_CAPABILITIES = ("12.0", "12.1", "9.0", "10.0")
SUPPORTED_CAPABILITIES = ("12.0", "12.1", "10.0", "9.0", "8.9")
BACKEND_KEYS = (
    "attention_prefill",
    "attention_decode",
    "moe_runner",
    "sampling",
    "fp8_gemm",
    "fp4_gemm",
    "deep_gemm",
    "mm_attention",
    "linear_attention",
)
PROBE_TIMEOUT_S = 1200
FAKED = "faked device: no such GPU here; SGLang's own argument resolution ran against it"

# Inherited variables that change SGLang's choices; dropped so that a result depends on the inputs only
# (pass them through ``env`` to test one on purpose).
_DROPPED_ENV_PREFIXES = ("SGLANG_", "SGL_", "FLASHINFER_", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class FlaggedChoice:
    setting: str
    value: str
    reason: str
    source: str

    def __str__(self) -> str:
        return f"{self.setting}={self.value}"

    def to_json(self) -> dict:
        return {"setting": self.setting, "value": self.value, "reason": self.reason, "source": self.source}


@dataclass(frozen=True)
class Resolution:
    """One (tree, model, capability, arguments) resolution.

    ``ok`` is True when SGLang resolved the arguments without raising. ``status`` says more: "resolved",
    "rejected" (SGLang itself refused the arguments; ``error`` holds its message) or "not-run" (the
    resolution could not be run here: a missing dependency or an environment failure; ``error`` says which).
    ``flagged`` names each choice with no SM120 code in this release (``"attention_decode=fa3"``).
    """

    ok: bool
    release: str | None
    capability: str
    model: str
    backends: dict[str, str | None]
    flagged: tuple[str, ...]
    error: str | None
    stand_ins: tuple[str, ...]
    status: str = "resolved"
    args: tuple[str, ...] = ()
    flashinfer: bool = True
    deep_gemm: bool = True
    details: tuple[FlaggedChoice, ...] = ()
    method: str | None = None
    error_type: str | None = None
    missing_module: str | None = None
    traceback: str | None = field(default=None, repr=False)
    raw: dict = field(default_factory=dict, repr=False)
    overlay: tuple[str, ...] = ()
    seconds: float | None = None
    slow: tuple[slow_settings.SlowFinding, ...] = ()  # settings that run on 12.x but slowly (or not at all)
    given: dict | None = None  # the arguments SGLang's parser read as set on the command line
    attention_arch: str | None = None
    # Where decode uses the Triton backend: the maximum KV-split count the tree's TritonAttnBackend sets on
    # this device (resolve_probe.triton_decode_splits), with its inputs and bytes per decode token.
    triton_decode: dict | None = None

    @property
    def kv_splits(self) -> str:
        """The table cell: the Triton decode's maximum KV splits, "-" where decode is not Triton."""
        t = self.triton_decode
        if not t:
            return "-"
        return str(t["max_kv_splits"]) if "max_kv_splits" in t else "?"

    @property
    def slow_only(self) -> tuple[slow_settings.SlowFinding, ...]:
        return tuple(f for f in self.slow if f.severity == slow_settings.SLOW)

    @property
    def over_smem(self) -> tuple[slow_settings.SlowFinding, ...]:
        """Settings under which a kernel SGLang launches does not fit 12.x's shared memory (severity over-smem)."""
        return tuple(f for f in self.slow if f.severity == slow_settings.OVER_SMEM)

    @property
    def attention(self) -> str:
        pre, dec = self.backends.get("attention_prefill"), self.backends.get("attention_decode")
        return str(pre) if pre == dec else f"{pre}/{dec}"

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "status": self.status,
            "release": self.release,
            "capability": self.capability,
            "model": self.model,
            "args": list(self.args),
            "flashinfer": self.flashinfer,
            "deep_gemm_installed": self.deep_gemm,
            "backends": dict(self.backends),
            "flagged": [d.to_json() for d in self.details],
            "error": self.error,
            "error_type": self.error_type,
            "missing_module": self.missing_module,
            "stand_ins": list(self.stand_ins),
            "method": self.method,
            "dependency_overlay": list(self.overlay),
            "device": FAKED,
            "seconds": self.seconds,
            "slow": [f.to_json() for f in self.slow],
            "given": self.given,
            "attention_arch": self.attention_arch,
            "triton_decode": self.triton_decode,
        }


@dataclass(frozen=True)
class BackendAuditResult:
    root: str
    release: str | None
    resolutions: tuple[Resolution, ...]
    seconds: float
    stand_ins: tuple[str, ...] = ()
    overlay: tuple[str, ...] = ()

    @property
    def flagged(self) -> tuple[Resolution, ...]:
        """Resolutions on 12.x whose choice has no SM120 code."""
        return tuple(r for r in self.resolutions if r.flagged and is_sm12x(parse_capability(r.capability)))

    @property
    def not_run(self) -> tuple[Resolution, ...]:
        return tuple(r for r in self.resolutions if r.status == "not-run")

    @property
    def rejected_on_12x(self) -> tuple[Resolution, ...]:
        return tuple(r for r in self.resolutions if r.status == "rejected" and is_sm12x(parse_capability(r.capability)))

    @property
    def slow_on_12x(self) -> tuple[Resolution, ...]:
        """Resolutions on 12.x with a setting that runs there but slowly (severity "slow")."""
        return tuple(r for r in self.resolutions if r.slow_only and is_sm12x(parse_capability(r.capability)))

    @property
    def over_smem_on_12x(self) -> tuple[Resolution, ...]:
        """Resolutions on 12.x with a setting whose kernels need more shared memory than the GPU has."""
        return tuple(r for r in self.resolutions if r.over_smem and is_sm12x(parse_capability(r.capability)))

    @property
    def ok(self) -> bool:
        return not self.flagged and not self.not_run and not self.rejected_on_12x and not self.over_smem_on_12x

    def slow_notes(self) -> list[str]:
        """One paragraph per finding (once per rule and value): the setting, why, the source and the fix."""
        lines: list[str] = []
        seen: set[tuple[str, str | None]] = set()
        for r in self.resolutions:
            for f in r.slow:
                if (f.rule, f.value) in seen:
                    continue
                seen.add((f.rule, f.value))
                where = sorted(
                    {
                        f"{x.model} on {x.capability}"
                        for x in self.resolutions
                        if any(o.rule == f.rule and o.value == f.value for o in x.slow)
                    }
                )
                label = {slow_settings.SLOW: "slow", slow_settings.OVER_SMEM: "over the shared-memory limit"}.get(
                    f.severity, "no SM120 code"
                )
                lines.append(
                    f"{label}: {f} ({f.origin}; seen for: {', '.join(where)})"
                    + (f"; the largest value that fits: {f.largest_fitting}" if f.largest_fitting else "")
                )
                lines.append(f"  why: {f.why} [source: {f.source}]")
                lines.append(f"  fix: {f.fix}")
        return lines

    def notes(self) -> list[str]:
        """What each flag means (once per setting=value), what stood in for what, and what could not run."""
        lines: list[str] = []
        seen: set[tuple[str, str]] = set()
        for r in self.resolutions:
            for d in r.details:
                if (str(d), d.reason) in seen:
                    continue
                seen.add((str(d), d.reason))
                where = sorted(
                    {
                        f"{x.model} on {x.capability}"
                        for x in self.resolutions
                        if any(str(o) == str(d) and o.reason == d.reason for o in x.details)
                    }
                )
                lines.append(f"{d}: {d.reason} [source: {d.source}] (seen for: {', '.join(where)})")
        lines.extend(self.split_notes())
        for r in self.resolutions:
            if r.status == "not-run":
                lines.append(f"not run: {r.model} on {r.capability}: {r.error}")
        lines.append(f"device: {FAKED}.")
        if self.stand_ins:
            lines.append("stand-ins: " + "; ".join(self.stand_ins) + ".")
        if self.overlay:
            lines.append("this release's pinned packages were used: " + ", ".join(self.overlay) + ".")
        return lines

    def split_notes(self) -> list[str]:
        """One line per model and Triton decode split cap: the count, where it comes from, the fp32
        attn_logits + attn_lse bytes per decode token, and the capabilities it holds on."""
        groups: dict[tuple, list[str]] = {}
        for r in self.resolutions:
            t = r.triton_decode
            if not t:
                continue
            if "max_kv_splits" not in t:
                key = (r.model, None, t.get("error"), None, None, None)
            else:
                key = (r.model, t["max_kv_splits"], t["source"], t["bytes_per_token"], t["context_len"], t.get("note"))
            if r.capability not in groups.setdefault(key, []):
                groups[key].append(r.capability)
        lines = []
        for (model, splits, source, size, context, note), caps in groups.items():
            where = f"{model} on {', '.join(caps)}"
            if splits is None:
                lines.append(f"kv splits: {where}: not computed ({source})")
                continue
            lines.append(
                f"kv splits: {where}: Triton decode max {splits} ({source}; context {context}; "
                f"attn_logits+lse {size / (1 << 20):.2f} MiB per decode token)" + (f"; {note}" if note else "")
            )
        return lines

    def summary(self) -> str:
        rejected = sum(r.status == "rejected" for r in self.resolutions)
        return (
            f"SGLang {self.release or '(unknown release)'}: {len(self.resolutions)} resolution(s), "
            f"{len(self.flagged)} flagged on 12.x, {rejected} rejected by SGLang, {len(self.not_run)} not run, "
            f"{len(self.slow_on_12x)} with slow settings on 12.x"
            + (
                f", {len(self.over_smem_on_12x)} with a setting whose kernels exceed 12.x's shared memory"
                if self.over_smem_on_12x
                else ""
            )
            + f" ({self.seconds:.1f} s)"
        )

    HEADERS = (
        "model",
        "cap",
        "flashinfer",
        "attention (prefill/decode)",
        "kv splits",
        "moe runner",
        "sampling",
        "fp8 gemm",
        "fp4 gemm",
        "deepgemm",
        "result",
    )

    def rows(self) -> list[list[str]]:
        rows = []
        for r in self.resolutions:
            b = r.backends
            flags = "FLAGGED: " + ", ".join(r.flagged) if r.flagged else ""
            if r.status == "resolved":
                verdict = flags or "ok"
            elif r.status == "rejected":
                verdict = (flags + "; " if flags else "") + "rejected by SGLang: " + _one_line(r.error)
            else:
                verdict = "not run: " + _one_line(r.error)
            if r.slow_only:
                verdict += "; slow: " + ", ".join(str(f) for f in r.slow_only)
            if r.over_smem:
                verdict += "; OVER SHARED MEMORY: " + ", ".join(
                    f"{f} (largest that fits: {f.largest_fitting})" for f in r.over_smem
                )
            label = r.model + (" " + " ".join(r.args) if r.args else "")
            attention = r.attention if (b.get("attention_prefill") or b.get("attention_decode")) else "-"
            rows.append(
                [
                    label,
                    r.capability,
                    "yes" if r.flashinfer else "no",
                    attention,
                    r.kv_splits,
                    b.get("moe_runner") or "-",
                    b.get("sampling") or "-",
                    b.get("fp8_gemm") or "-",
                    b.get("fp4_gemm") or "-",
                    b.get("deep_gemm") or "-",
                    verdict,
                ]
            )
        return rows

    def to_json(self) -> dict:
        return {
            "root": self.root,
            "release": self.release,
            "ok": self.ok,
            "device": FAKED,
            "stand_ins": list(self.stand_ins),
            "dependency_overlay": list(self.overlay),
            "seconds": round(self.seconds, 2),
            "summary": {
                "resolutions": len(self.resolutions),
                "flagged_on_12x": len(self.flagged),
                "not_run": len(self.not_run),
                "rejected": sum(r.status == "rejected" for r in self.resolutions),
                "slow_on_12x": len(self.slow_on_12x),
                "over_smem_on_12x": len(self.over_smem_on_12x),
            },
            "resolutions": [r.to_json() for r in self.resolutions],
            "rules": [rule.to_json() for rule in backend_support.UNSUPPORTED],
            "slow_rules": [rule.to_json() for rule in slow_settings.RULES],
        }


def _one_line(text: str | None, limit: int = 120) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else "no message"
    return line if len(line) <= limit else line[: limit - 3] + "..."


# -- inputs -----------------------------------------------------------------------------------------------


def model_dir(model: str | Path) -> Path:
    """A bundled model name or a folder holding ``config.json``."""
    if isinstance(model, str) and model in BUNDLED_MODELS:
        return MODELS_DIR / model
    path = Path(model).expanduser()
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if not (path / "config.json").is_file():
        raise UsageError(
            f"'{model}' is neither a bundled model ({', '.join(BUNDLED_MODELS)}) nor a folder holding a config.json.",
            hint="Pass one of the bundled names, or a folder with the model's config.json (weights are not needed).",
        )
    return path.resolve()


def model_label(model: str | Path) -> str:
    if isinstance(model, str) and model in BUNDLED_MODELS:
        return model
    return Path(model).expanduser().resolve().name if Path(model).name == "config.json" else str(model)


def check_capability(text: str) -> str:
    try:
        major, minor = parse_capability(text)
    except ValueError:
        raise UsageError(
            f"'{text}' is not a compute capability (expected one of {', '.join(SUPPORTED_CAPABILITIES)})."
        ) from None
    label = f"{major}.{minor}"
    if label not in SUPPORTED_CAPABILITIES:
        raise UsageError(
            f"No faked device for compute capability {label}; choose from {', '.join(SUPPORTED_CAPABILITIES)}."
        )
    return label


def _target_of(root: Path | str | Target) -> Target:
    if isinstance(root, Target):
        return root
    return find_target(root)


# -- running the probe ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    key: str
    model: str  # label
    path: Path
    args: tuple[str, ...]


def _probe_env(target: Target, overlay: probe_env.Overlay, env: Mapping[str, str] | None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_ENV_PREFIXES)}
    sm120kit_parent = str(Path(__file__).resolve().parents[2])
    paths = [str(target.root)] + ([str(overlay.path)] if overlay.path else []) + [sm120kit_parent]
    base.update(
        {
            "PYTHONPATH": os.pathsep.join(paths),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    base.pop("PYTHONSTARTUP", None)
    if env:
        base.update(env)
    return base


def _run_probe(
    target: Target,
    overlay: probe_env.Overlay,
    capabilities: Sequence[str],
    flashinfer: bool,
    deep_gemm: bool,
    jobs: Sequence[_Job],
    env: Mapping[str, str] | None,
    parallel: int = 1,
) -> dict[str, tuple[dict, dict[str, dict]]]:
    """Resolve ``jobs`` on each capability in one probe interpreter (one SGLang import per capability, each
    in a process of its own: :mod:`sm120kit.audit.resolve_probe`); capability -> (header, results by job)."""
    request = {
        "capabilities": list(capabilities),
        "parallel": parallel,
        "flashinfer": flashinfer,
        "deep_gemm": deep_gemm,
        "jobs": [{"id": j.key, "model": str(j.path), "args": list(j.args)} for j in jobs],
    }
    with tempfile.TemporaryDirectory(prefix="sm120kit-resolve-") as tmp:
        req_path, out_path = Path(tmp) / "request.json", Path(tmp) / "result.jsonl"
        req_path.write_text(json.dumps(request))
        result = runner.run(
            runner.python_argv("-m", "sm120kit.audit.resolve_probe", str(req_path), str(out_path)),
            env=_probe_env(target, overlay, env),
            check=False,
            timeout=PROBE_TIMEOUT_S,
            cwd=tmp,
            what=f"argument resolution probe ({', '.join(capabilities)})",
        )
        lines = out_path.read_text().splitlines() if out_path.is_file() else []
    found: dict[str, tuple[dict, dict[str, dict]]] = {}
    results: dict[str, dict] = {}
    for line in lines:
        data = json.loads(line)
        if "header" in data:
            results = {}
            found[data["header"].get("capability")] = (data["header"], results)
        else:
            results[data["id"]] = data
    tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
    for capability in capabilities:
        if capability not in found:
            failure = {
                "status": "not-run",
                "error_type": "ProbeFailed",
                "error": f"the resolution probe exited with code {result.returncode} and wrote no result "
                f"for {capability}: {tail}",
            }
            found[capability] = ({}, {j.key: {"id": j.key, **failure} for j in jobs})
    return found


# -- reading a result ---------------------------------------------------------------------------------------


def _first(raw: dict, *names: str) -> str | None:
    for name in names:
        value = raw.get(name)
        if value not in (None, "", False):
            return str(value)
    return None


def backends_from_raw(raw: dict, deep_gemm: bool | None) -> dict[str, str | None]:
    """The audit's backend names from the resolved server-argument fields (names vary by release)."""
    base = _first(raw, "attention_backend")
    moe = _first(raw, "moe_runner_backend")
    if moe in (None, "auto"):  # releases before the unified moe_runner_backend used switches
        for flag, name in (
            ("enable_flashinfer_trtllm_moe", "flashinfer_trtllm"),
            ("enable_flashinfer_cutlass_moe", "flashinfer_cutlass"),
            ("enable_flashinfer_mxfp4_moe", "flashinfer_mxfp4"),
            ("enable_triton_kernel_moe", "triton_kernel"),
        ):
            if raw.get(flag):
                moe = name
                break
    return {
        "attention_prefill": _first(raw, "prefill_attention_backend") or base,
        "attention_decode": _first(raw, "decode_attention_backend") or base,
        "moe_runner": moe,
        "sampling": _first(raw, "sampling_backend"),
        "fp8_gemm": _first(raw, "fp8_gemm_runner_backend"),
        "fp4_gemm": _first(raw, "fp4_gemm_runner_backend"),
        "deep_gemm": None if deep_gemm is None else ("on" if deep_gemm else "off"),
        "mm_attention": _first(raw, "mm_attention_backend"),
        "linear_attention": _first(raw, "linear_attn_backend", "mamba_backend"),
    }


def _details(release: str | None, capability: str, backends: dict) -> tuple[FlaggedChoice, ...]:
    rules = backend_support.unsupported_choices(release, capability, backends)
    return tuple(FlaggedChoice(r.setting, r.value, r.reason, r.source) for r in rules)


def _attention_kind(arch: str | None, model: Path) -> str | None:
    """ "mla" / "mha" from SGLang's own reading (AttentionArch), else from the model's config.json."""
    if arch:
        return "mla" if arch.upper() == "MLA" else "mha"
    try:
        config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return slow_settings.attention_kind_from_config(config if isinstance(config, dict) else {})


def _slow(
    target: Target,
    release: str | None,
    capability: str,
    job: _Job,
    raw: dict,
    backends: dict,
    given: dict | None,
    arch: str | None,
    env: Mapping[str, str] | None,
) -> tuple:
    from sm120kit.hardware.fake_device import PRESETS

    device = PRESETS.get(capability)
    ctx = slow_settings.Context(
        release=release,
        capability=capability,
        package_dir=Path(target.root) / "sglang",
        given=given or {},
        values={**raw, **backends},
        env=dict(env or {}),
        attention=_attention_kind(arch, job.path),
        sm_count=device.multi_processor_count if device else None,
    )
    return slow_settings.find(ctx)


def _resolution(
    target: Target,
    job: _Job,
    capability: str,
    flashinfer: bool,
    deep_gemm: bool,
    header: dict,
    data: dict,
    overlay: probe_env.Overlay,
    env: Mapping[str, str] | None = None,
) -> Resolution:
    stand_ins = tuple(header.get("stand_ins", ()))
    # A git clone's files may not state the release; then the version the imported package reports counts.
    release = target.version or header.get("sglang_version")
    common = dict(
        release=release,
        capability=capability,
        model=job.model,
        stand_ins=stand_ins,
        args=job.args,
        flashinfer=flashinfer,
        deep_gemm=deep_gemm,
        overlay=overlay.packages,
        seconds=data.get("seconds"),
    )
    status = data.get("status", "not-run")
    if status != "resolved":
        error = data.get("error") or "no message"
        if data.get("stage") == "import" and status == "not-run":
            error = f"importing sglang.srt.server_args failed: {data.get('error_type')}: {error}"
        elif status == "not-run":
            error = f"{data.get('error_type')}: {error}"
        if data.get("missing_module"):
            error += (
                f" (the Python module '{data['missing_module']}' is missing; "
                "pip install 'sm120kit[audit]' installs what SGLang's argument code imports)"
            )
        # What SGLang had chosen when it raised (read from the record it was resolving), flagged the same way:
        # 0.5.6.post2 picks trtllm_mha on 12.0 and then rejects its own choice.
        partial = data.get("partial_raw")
        backends = backends_from_raw(partial, None) if partial else {k: None for k in BACKEND_KEYS}
        details = _details(release, capability, backends) if partial else ()
        return Resolution(
            ok=False,
            backends=backends,
            flagged=tuple(str(d) for d in details),
            error=error,
            details=details,
            status=status,
            error_type=data.get("error_type"),
            missing_module=data.get("missing_module"),
            traceback=data.get("traceback"),
            raw=partial or {},
            **common,
        )
    backends = backends_from_raw(data.get("raw", {}), data.get("deep_gemm"))
    details = _details(release, capability, backends)
    given, arch = data.get("given"), data.get("attention_arch")
    slow = _slow(target, release, capability, job, data.get("raw", {}), backends, given, arch, env)
    return Resolution(
        ok=True,
        backends=backends,
        flagged=tuple(str(d) for d in details),
        error=None,
        details=details,
        method=data.get("method"),
        raw=data.get("raw", {}),
        slow=slow,
        given=given,
        attention_arch=arch,
        triton_decode=data.get("triton_decode"),
        **common,
    )


def _overlay(target: Target, release_pins: bool, on_step: Step | None) -> probe_env.Overlay:
    if not release_pins:
        return probe_env.Overlay(None, (), "release pins not applied (asked for)")
    return probe_env.dependency_overlay(target.root, target.repo_root, on_step=on_step)


# -- public API ---------------------------------------------------------------------------------------------


def resolve_across(
    root: Path | str | Target,
    requests: Iterable[tuple[str | Path, Sequence[str]]],
    capabilities: Sequence[str],
    *,
    flashinfer: bool = True,
    deep_gemm: bool = True,
    env: Mapping[str, str] | None = None,
    release_pins: bool = True,
    parallel: int = 1,
    on_step: Step | None = None,
) -> dict[str, list[Resolution]]:
    """Resolve several (model, extra arguments) pairs on each of several capabilities in one probe interpreter:
    capability -> resolutions in request order. Each capability imports SGLang in a process of its own, so
    the answers are those of one interpreter per capability; ``parallel`` capabilities are served at once."""
    target = _target_of(root)
    caps = list(dict.fromkeys(check_capability(c) for c in capabilities))
    if not caps:
        raise UsageError("No capability to resolve on: give at least one (12.0, 12.1, 9.0, 10.0).")
    overlay = _overlay(target, release_pins, on_step)
    jobs = [_Job(f"job{i}", model_label(m), model_dir(m), tuple(a)) for i, (m, a) in enumerate(requests)]
    found = _run_probe(target, overlay, caps, flashinfer, deep_gemm, jobs, env, parallel)
    return {
        cap: [
            _resolution(
                target, j, cap, flashinfer, deep_gemm, found[cap][0], found[cap][1].get(j.key, {}), overlay, env
            )
            for j in jobs
        ]
        for cap in caps
    }


def resolve_many(
    root: Path | str | Target,
    requests: Iterable[tuple[str | Path, Sequence[str]]],
    capability: str,
    *,
    flashinfer: bool = True,
    deep_gemm: bool = True,
    env: Mapping[str, str] | None = None,
    release_pins: bool = True,
    on_step: Step | None = None,
) -> list[Resolution]:
    """Resolve several (model, extra arguments) pairs on one capability in one probe interpreter."""
    capability = check_capability(capability)
    return resolve_across(
        root,
        requests,
        [capability],
        flashinfer=flashinfer,
        deep_gemm=deep_gemm,
        env=env,
        release_pins=release_pins,
        on_step=on_step,
    )[capability]


def resolve(
    root: Path | str | Target,
    model: str | Path,
    capability: str,
    *,
    args: Sequence[str] = (),
    flashinfer: bool = True,
    deep_gemm: bool = True,
    env: Mapping[str, str] | None = None,
    release_pins: bool = True,
    on_step: Step | None = None,
) -> Resolution:
    """Run SGLang's own argument resolution for ``model`` on a faked ``capability`` device.

    ``root`` is the folder holding ``sglang/`` (or any path :func:`sm120kit.sglang.target.find_target` accepts);
    ``model`` a bundled model name (:data:`BUNDLED_MODELS`) or a folder with a ``config.json``; ``args``
    extra ``sglang serve`` arguments (``["--attention-backend", "fa3"]``); ``flashinfer``/``deep_gemm``
    whether those libraries count as installed; ``release_pins`` False resolves with the packages installed
    here even where the release pins another ``transformers`` (see :mod:`sm120kit.audit.probe_env`). Raises only for bad input (:class:`UsageError`,
    :class:`NotSglangTree`) or a dependency that cannot be installed; a failed resolution is a
    :class:`Resolution` with ``ok=False``.
    """
    return resolve_many(
        root,
        [(model, args)],
        capability,
        flashinfer=flashinfer,
        deep_gemm=deep_gemm,
        env=env,
        release_pins=release_pins,
        on_step=on_step,
    )[0]


def audit_backends(
    root: Path | str | Target,
    *,
    models: Sequence[str | Path] | None = None,
    capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
    args: Sequence[str] = (),
    flashinfer: Sequence[bool] = (True, False),
    deep_gemm: bool = True,
    env: Mapping[str, str] | None = None,
    jobs: int | None = None,
    release_pins: bool = True,
    progress: Progress | None = None,
    on_step: Step | None = None,
) -> BackendAuditResult:
    """Every model × capability × flashinfer-installed combination, in parallel probe interpreters."""
    started = time.perf_counter()
    target = _target_of(root)
    models = list(models or BUNDLED_MODELS)
    for m in models:
        model_dir(m)  # bad input fails before any work
    caps = [check_capability(c) for c in capabilities]
    if not caps:
        raise UsageError("No capability to audit: give at least one (12.0, 12.1, 9.0, 10.0).")
    overlay = _overlay(target, release_pins, on_step)
    combos = [(c, fi) for c in caps for fi in flashinfer]
    # One interpreter per flashinfer setting, resolving every capability (one SGLang import each, in a process
    # of its own); together they serve ``workers`` capabilities at once.
    settings = list(dict.fromkeys(flashinfer))
    workers = max(1, min(len(combos), jobs or os.cpu_count() or 1))
    tell(
        on_step,
        f"resolving {len(models)} model(s) x {len(combos)} device setting(s) with SGLang "
        f"{target.version or '(unknown release)'} on faked devices ({workers} in parallel) ...",
    )
    done = 0
    outcome: dict[tuple[str, bool], list[Resolution]] = {}
    probe_jobs = [_Job(f"job{i}", model_label(m), model_dir(m), tuple(args)) for i, m in enumerate(models)]
    per_probe = max(1, workers // len(settings))

    def one(fi: bool) -> tuple[bool, dict[str, tuple[dict, dict[str, dict]]]]:
        return fi, _run_probe(target, overlay, caps, fi, deep_gemm, probe_jobs, env, per_probe)

    with ThreadPoolExecutor(max_workers=min(workers, len(settings))) as pool:
        for fi, found in pool.map(one, settings):
            for cap in caps:
                header, results = found[cap]
                outcome[(cap, fi)] = [
                    _resolution(target, j, cap, fi, deep_gemm, header, results.get(j.key, {}), overlay, env)
                    for j in probe_jobs
                ]
                done += 1
                if progress is not None:
                    progress(done, len(combos), f"{cap} flashinfer={'yes' if fi else 'no'}")
    ordered: list[Resolution] = []
    for index in range(len(models)):
        for combo in combos:
            ordered.append(outcome[combo][index])
    stand_ins = sorted({s for r in ordered for s in r.stand_ins})
    release = target.version or next((r.release for r in ordered if r.release), None)
    return BackendAuditResult(
        root=str(target.root),
        release=release,
        resolutions=tuple(ordered),
        seconds=time.perf_counter() - started,
        stand_ins=tuple(stand_ins),
        overlay=overlay.packages,
    )


__all__ = [
    "Resolution",
    "BackendAuditResult",
    "FlaggedChoice",
    "resolve",
    "resolve_many",
    "resolve_across",
    "audit_backends",
    "BUNDLED_MODELS",
    "DEFAULT_CAPABILITIES",
    "model_dir",
    "backends_from_raw",
]
