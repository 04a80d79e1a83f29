"""Static shared-memory audit: will any Triton kernel SGLang launches exceed SM120's shared memory per block?

For each architecture (12.0 and 12.1 by default) and each case of the shape matrix
(:mod:`sm120kit.audit.shapes`), a fresh interpreter (:mod:`sm120kit.audit.kernel_probe`) imports the
tree's own launchers under a faked device and compiles, with the installed Triton, every kernel they
would launch. Each compiled kernel's ``metadata.shared`` is compared with the device's opt-in limit; a
kernel over it, or a launcher that fails to compile, fails the audit. A case SGLang itself refuses to run
(a fused-MoE shape its FP8 block-quantized weight loader rejects, :mod:`sm120kit.audit.moe_loader`) is
``not-applicable``, with the reason, and is not compiled. Results are cached
(:mod:`sm120kit.audit.cache`) so a warm re-run of an unchanged tree starts no interpreter.

The results are static: the device is faked, the compiles are real. Nothing here ran on an SM120 GPU.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120kit import __version__, runner
from sm120kit.audit.cache import AuditCache, digest, files_digest
from sm120kit.audit.moe_loader import LoaderRule, fp8_block_rule
from sm120kit.audit.shapes import ProbeCase, ShapeMatrix, expand, load_matrix
from sm120kit.errors import MissingDependency, ToolFailed, UsageError
from sm120kit.hardware.arch import SM12X_LABELS, parse_capability
from sm120kit.sglang import launchers as launcher_table
from sm120kit.sglang import mla_kernels, releases
from sm120kit.sglang.metadata import installed_version
from sm120kit.sglang.target import Target, find_target
from sm120kit.util.report import Progress, Step, tell

DEFAULT_ARCHS = SM12X_LABELS
PROBE_MODULE = "sm120kit.audit.kernel_probe"
METHOD = (
    "static: SGLang's launchers ran on meta tensors under a faked device; every launch was a real "
    "Triton compile for the target, nothing ran on a GPU"
)
_PROBE_TIMEOUT = 3600
NOT_APPLICABLE = "not-applicable"


def check_arch(text: str | tuple[int, int]) -> str:
    """``"12.0"``, ``"sm_120"``, ``"120"``, ``(12, 0)`` -> ``"12.0"``; a UsageError for anything without a
    preset."""
    from sm120kit.hardware.fake_device import PRESETS

    if isinstance(text, tuple):
        text = f"{text[0]}.{text[1]}"
    try:
        major, minor = parse_capability(text)
    except ValueError:
        raise UsageError(f"'{text}' is not a compute capability (expected e.g. 12.0 or sm_121).") from None
    key = f"{major}.{minor}"
    if key not in PRESETS or not PRESETS[key].cuda_version:
        known = ", ".join(k for k, d in PRESETS.items() if d.cuda_version)
        raise UsageError(f"There is no device to audit for capability {key}.", hint=f"Use one of {known}.")
    return key


def _limit(arch: str) -> int:
    from sm120kit.hardware.fake_device import PRESETS

    return PRESETS[arch].shared_memory_per_block


# -- results ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelReport:
    name: str
    module: str
    block: dict[str, Any]  # the BLOCK* / GROUP* constexprs
    num_warps: int
    num_stages: int
    shared: int
    limit: int
    registers: int | None

    @property
    def over(self) -> bool:
        return self.shared > self.limit

    @property
    def block_text(self) -> str:
        return " ".join(
            f"{k.replace('BLOCK_SIZE_', '').replace('BLOCK_', '')}={v}"
            for k, v in self.block.items()
            if v not in (None, 0)
        )

    def to_json(self) -> dict:
        return {
            "kernel": self.name,
            "module": self.module,
            "block": self.block,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "shared": self.shared,
            "limit": self.limit,
            "over_limit": self.over,
            "registers": self.registers,
        }


@dataclass(frozen=True)
class CaseReport:
    arch: str
    case: ProbeCase
    status: str  # ok | over-limit | compile-error | import-error | skipped | not-applicable
    kernels: tuple[KernelReport, ...]
    error: str | None = None
    note: str | None = None
    cached: bool = False
    missing: str | None = None  # the module an import error names

    @property
    def failed(self) -> bool:
        return self.status in ("over-limit", "compile-error", "import-error")

    def to_json(self) -> dict:
        return {
            "arch": self.arch,
            "id": self.case.id,
            "launcher": self.case.launcher,
            "model": self.case.model,
            "shape": self.case.shape,
            "params": self.case.params,
            "status": self.status,
            "error": self.error,
            "note": self.note,
            "cached": self.cached,
            "kernels": [k.to_json() for k in self.kernels],
        }


@dataclass(frozen=True)
class SmemAuditResult:
    target: str  # what was audited, for people
    root: str  # the folder holding sglang/
    version: str | None
    archs: tuple[str, ...]
    cases: tuple[CaseReport, ...]
    seconds: float
    compiled: int  # cases compiled in this run
    cached: int  # cases answered from the cache
    register_reader: str | None
    stood_in: tuple[str, ...]
    overlay: str | None = None
    matrix_files: tuple[str, ...] = ()

    @property
    def over_limit(self) -> list[tuple[CaseReport, KernelReport]]:
        return [(c, k) for c in self.cases for k in c.kernels if k.over]

    @property
    def errors(self) -> list[CaseReport]:
        return [c for c in self.cases if c.status in ("compile-error", "import-error")]

    @property
    def not_applicable(self) -> list[CaseReport]:
        """Cases SGLang itself refuses to run (its loader rejects the shape): not compiled, not a failure."""
        return [c for c in self.cases if c.status == NOT_APPLICABLE]

    @property
    def ok(self) -> bool:
        return not self.over_limit and not self.errors

    def kernel_count(self) -> int:
        return sum(len(c.kernels) for c in self.cases)

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "root": self.root,
            "release": self.version,
            "archs": list(self.archs),
            "limits": {a: _limit(a) for a in self.archs},
            "ok": self.ok,
            "method": METHOD,
            "summary": {
                "cases": len(self.cases),
                "kernels": self.kernel_count(),
                "over_limit": len(self.over_limit),
                "errors": len(self.errors),
                "skipped": sum(c.status == "skipped" for c in self.cases),
                "not_applicable": len(self.not_applicable),
                "compiled": self.compiled,
                "cached": self.cached,
            },
            "seconds": round(self.seconds, 2),
            "register_reader": self.register_reader,
            "stood_in": list(self.stood_in),
            "dependency_overlay": self.overlay,
            "matrix_files": list(self.matrix_files),
            "findings": [dict(c.to_json(), kernels=[k.to_json()]) for c, k in self.over_limit]
            + [c.to_json() for c in self.errors],
            "cases": [c.to_json() for c in self.cases],
        }


@dataclass(frozen=True)
class AuditChange:
    arch: str
    case_id: str
    kernel: str
    before: str  # "106496 B over" / "compile-error" / "-"
    after: str
    fixed: bool
    broke: bool

    def to_json(self) -> dict:
        return {
            "arch": self.arch,
            "case": self.case_id,
            "kernel": self.kernel,
            "unpatched": self.before,
            "patched": self.after,
            "fixed": self.fixed,
            "broke": self.broke,
        }


@dataclass(frozen=True)
class SmemComparison:
    patched: SmemAuditResult
    pristine: SmemAuditResult
    changes: tuple[AuditChange, ...]

    @property
    def ok(self) -> bool:
        return self.patched.ok

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "changes": [c.to_json() for c in self.changes],
            "fixed": sum(c.fixed for c in self.changes),
            "broke": sum(c.broke for c in self.changes),
            "patched": self.patched.to_json(),
            "unpatched": self.pristine.to_json(),
        }


# -- the audit -------------------------------------------------------------------------------------------


def _probe_fingerprint() -> str:
    from sm120kit.audit import kernel_probe
    from sm120kit.hardware import fake_device
    from sm120kit.sglang import launchers

    return files_digest([Path(module.__file__) for module in (kernel_probe, fake_device, launchers)])


def _library_versions() -> dict[str, str]:
    found = {}
    for name in ("triton", "torch"):
        found[name] = installed_version(name)
        if found[name] is None:
            raise MissingDependency(
                f"The shared-memory audit needs the Python package '{name}', which is not installed.",
                hint="Install the audit extra: pip install 'sm120kit[audit]'.",
            )
    return found


def _named_for(name: str):
    """A test of a config file name: is it SGLang's file for the GPU named ``name``?"""
    import re

    pattern = re.compile(r"device_name=" + re.escape(name.replace(" ", "_")) + r"(,|_down\.json$|\.json$)")
    return lambda file_name: bool(pattern.search(file_name))


def _moe_config_files(
    root: Path, resolved: launcher_table.ResolvedLauncher, arch: str, device_name: str | None = None
) -> list[Path]:
    """SGLang's tuned MoE configs for the faked device's name (they decide the block sizes)."""
    from sm120kit.hardware.fake_device import PRESETS

    if len(resolved.files) < 2:
        return []
    folder = resolved.files[1].parent / "configs"
    if not folder.is_dir():
        return []
    named = _named_for(device_name or PRESETS[arch].name)
    return sorted(p for p in folder.rglob("*.json") if named(p.name))


_CONFIG_NAME = re.compile(
    r"^E=(\d+),N=(\d+),device_name=(.+?)(?:,dtype=(\w+))?(?:,block_shape=\[(\d+), ?(\d+)\])?"
    r"(,per_channel_quant=True)?(_down)?\.json$"
)
TUNED_HIDDEN_SIZE = 4096  # K of the up projection for tuned-file cases: the file names carry no hidden size


def tuned_moe_cases(root: Path, resolved: launcher_table.ResolvedLauncher, arch: str) -> list[ProbeCase]:
    """One fused-MoE case per batch size of every config file the tree ships for a 12.x device name of
    capability ``arch`` (:data:`~sm120kit.hardware.fake_device.SM12X_DEVICE_NAMES`): SGLang's config choice
    under that device name then loads exactly each configuration of the file (and its ``_down`` file).
    Files of quantizations this probe does not launch (int8, int4) are left out."""
    from sm120kit.hardware.fake_device import SM12X_DEVICE_NAMES

    names = {n.replace(" ", "_"): n for n, capability in SM12X_DEVICE_NAMES.items() if capability == arch}
    if len(resolved.files) < 2 or not (resolved.files[1].parent / "configs").is_dir():
        return []
    found: dict[str, ProbeCase] = {}
    for path in sorted((resolved.files[1].parent / "configs").rglob("*.json")):
        match = _CONFIG_NAME.match(path.name)
        if not match or match.group(3) not in names or match.group(8):
            continue
        experts, n, dtype, bn, bk, per_channel = (
            int(match.group(1)),
            int(match.group(2)),
            match.group(4),
            match.group(5),
            match.group(6),
            bool(match.group(7)),
        )
        if dtype is None:
            quant = "bf16"
        elif dtype == "fp8_w8a8":
            quant = "fp8_block" if bn else "fp8_channel" if per_channel else "fp8"
        else:
            continue
        try:
            tokens = sorted({int(k) for k in json.loads(path.read_text(encoding="utf-8"))})
        except (ValueError, OSError):
            continue  # SGLang would fail on it too; not a shared-memory question
        for m in tokens:
            case = ProbeCase(
                "moe",
                f"tuned-E{experts}-N{n}",
                {
                    "num_experts": experts,
                    "top_k": min(8, experts),
                    "hidden_size": TUNED_HIDDEN_SIZE,
                    "intermediate_size": n,
                    "bias": False,
                    "quantization": quant,
                    "tokens": m,
                    "block_shape": [int(bn), int(bk)] if bn else None,
                    "device_name": names[match.group(3)],
                },
            )
            found.setdefault(case.id, case)
    return list(found.values())


class _Progress:
    def __init__(self, progress: Progress | None, total: int, label: str) -> None:
        self.progress, self.total, self.label = progress, total, label
        self.done = 0
        self.lock = threading.Lock()

    def tick(self, what: str) -> None:
        with self.lock:
            self.done += 1
            if self.progress is not None:
                self.progress(self.done, self.total, f"{self.label} {what}")


def _run_probe(
    root: Path,
    arch: str,
    cases: list[ProbeCase],
    policy: Mapping,
    cache: AuditCache,
    overlay: Path | None,
    progress: _Progress,
    label: str,
) -> dict:
    from sm120kit.audit.kernel_probe import DONE_MARK

    with tempfile.TemporaryDirectory(prefix="sm120kit-probe-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "cases.json").write_text(json.dumps([c.to_json() for c in cases]))
        argv = runner.python_argv(
            "-m",
            PROBE_MODULE,
            "--root",
            str(root),
            "--arch",
            arch,
            "--cases",
            str(tmp_path / "cases.json"),
            "--out",
            str(tmp_path / "out.json"),
        )
        if policy:
            (tmp_path / "policy.json").write_text(json.dumps(policy))
            argv += ["--policy", str(tmp_path / "policy.json")]
        path_parts = ([str(overlay)] if overlay else []) + [str(root)]
        if os.environ.get("PYTHONPATH"):
            path_parts.append(os.environ["PYTHONPATH"])
        cache.triton_dir.mkdir(parents=True, exist_ok=True)
        env = {
            "PYTHONPATH": os.pathsep.join(path_parts),
            "TRITON_CACHE_DIR": str(cache.triton_dir),
            mla_kernels.CACHE_DIR_ENV: str(cache.nvrtc_dir),
            "PYTHONDONTWRITEBYTECODE": "1",
            "SGLANG_DISABLE_REQUEST_LOGGING": "1",
        }

        def on_line(line: str) -> None:
            if line.startswith(DONE_MARK):
                progress.tick(f"{arch} {line[len(DONE_MARK) :]}")

        result = runner.run(
            argv,
            cwd=tmp,
            extra_env=env,
            on_line=on_line,
            check=False,
            timeout=_PROBE_TIMEOUT,
            what=f"kernel probe ({label}, {arch})",
        )
        out = tmp_path / "out.json"
        if result.returncode != 0 or not out.is_file():
            raise ToolFailed(
                f"The kernel probe for {label} on {arch} stopped with exit code {result.returncode} "
                "before writing its results.",
                argv=list(result.argv),
                returncode=result.returncode,
                output_tail=runner._tail(result.stdout),
                hint="Run with -v to see the command; the output above shows where it stopped.",
            )
        return json.loads(out.read_text())


def _case_report(arch: str, case: ProbeCase, data: dict, cached: bool) -> CaseReport:
    limit = _limit(arch)
    kernels = tuple(
        KernelReport(
            name=k["name"],
            module=k["module"],
            block={n: v for n, v in k["constexprs"].items() if n.startswith(("BLOCK", "GROUP"))},
            num_warps=k["num_warps"],
            num_stages=k["num_stages"],
            shared=k["shared"],
            limit=limit,
            registers=k.get("registers"),
        )
        for k in data.get("kernels", [])
    )
    status = data["status"]
    if status == "ok" and any(k.over for k in kernels):
        status = "over-limit"
    if status == "ok" and not kernels:
        status, data = "compile-error", dict(data, error="the launcher returned without compiling any kernel")
    return CaseReport(arch, case, status, kernels, data.get("error"), data.get("note"), cached, data.get("missing"))


def _split(cases: list[ProbeCase], parts: int) -> list[list[ProbeCase]]:
    """Spread cases over ``parts`` probes. Cases that compile the same kernels (decode batch sizes of one
    shape) stay together so the probe's in-process cache answers the repeats; groups are dealt out
    largest first to the least loaded probe."""
    groups: dict[str, list[ProbeCase]] = {}
    for case in cases:
        key = case.id.split("/bs=")[0] if case.launcher in ("decode", "mla-decode") else case.id
        groups.setdefault(key, []).append(case)
    weight = {
        "moe": 2.0,
        "extend": 1.5,
        "prefill": 1.0,
        "decode": 1.0,
        "tree-verify": 2.0,
        "mla-decode": 1.0,
        "ds-extend": 1.5,
        "inkling-moe": 1.5,
    }
    chunks: list[list[ProbeCase]] = [[] for _ in range(max(1, min(parts, len(groups))))]
    loads = [0.0] * len(chunks)
    for group in sorted(groups.values(), key=lambda g: -weight.get(g[0].launcher, 1.0)):
        target = loads.index(min(loads))
        chunks[target].extend(group)
        loads[target] += weight.get(group[0].launcher, 1.0)
    return [c for c in chunks if c]


def default_jobs() -> int:
    env = os.environ.get("SM120KIT_AUDIT_JOBS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, os.cpu_count() or 1)


def audit_tree(
    root: Path,
    *,
    archs: Iterable[str] = DEFAULT_ARCHS,
    matrix: ShapeMatrix | None = None,
    launchers: Iterable[str] | None = None,
    policy: Mapping[str, Mapping[str, Any]] | None = None,
    cache: AuditCache | None = None,
    jobs: int | None = None,
    progress: Progress | None = None,
    on_step: Step | None = None,
    label: str | None = None,
    version: str | None = None,
    repo_root: Path | None = None,
    tuned_moe_configs: bool = False,
) -> SmemAuditResult:
    """Audit the SGLang tree whose ``sglang/`` package lies in ``root``.

    ``policy`` sets module globals of a launcher's module after import, e.g.
    ``{"extend": {"CUDA_CAPABILITY": (8, 9)}}``: what a patch to its block-size policy would do.
    ``tuned_moe_configs`` adds :func:`tuned_moe_cases`: every configuration of the fused-MoE config files
    the tree ships for 12.x device names.
    """
    started = time.perf_counter()
    root = Path(root).resolve()
    archs = tuple(dict.fromkeys(check_arch(a) for a in archs))
    if not archs:
        raise UsageError("No architecture to audit.", hint="Pass --arch 12.0 (or leave it out for 12.0 and 12.1).")
    matrix = matrix or load_matrix()
    cases = expand(matrix, launchers=launchers)
    if not cases and not tuned_moe_configs:
        raise UsageError(
            "The shape matrix selects no launcher call.", hint="Check --only / --launcher against the matrix entries."
        )
    policy = {k: dict(v) for k, v in (policy or {}).items()}
    cache = cache or AuditCache()
    label = label or str(root)
    libs = _library_versions()
    fingerprint = _probe_fingerprint()
    resolved = launcher_table.resolve_all(root)
    cases_by_arch = {
        arch: cases + (tuned_moe_cases(root, resolved["moe"], arch) if tuned_moe_configs else []) for arch in archs
    }
    if not any(cases_by_arch.values()):
        raise UsageError(
            "The shape matrix selects no launcher call, and the tree ships no fused-MoE config "
            "files for a 12.x GPU name.",
            hint="Check --only / --launcher against the matrix entries.",
        )

    keys: dict[tuple[str, str], str] = {}
    source_digests: dict[tuple, str] = {}
    for arch in archs:
        for case in cases_by_arch[arch]:
            res = resolved[case.launcher]
            device_name = case.params.get("device_name") if case.launcher == "moe" else None
            sd_key = (arch, case.launcher, device_name)
            if sd_key not in source_digests:
                files = list(res.files) + (
                    _moe_config_files(root, res, arch, device_name) if case.launcher == "moe" else []
                )
                source_digests[sd_key] = files_digest(files) if files else "absent"
            keys[(arch, case.id)] = digest(
                "smem-audit-1",
                __version__,
                fingerprint,
                libs,
                arch,
                case.key_text(),
                source_digests[sd_key],
                policy.get(case.launcher, {}),
                # the probe inherits the MLA kernels' build flags and builds what the server would
                os.environ.get(mla_kernels.DEFINES_ENV, ""),
            )

    reports: dict[tuple[str, str], CaseReport] = {}
    todo: dict[str, list[ProbeCase]] = {}
    loader_rule = fp8_block_rule(root)
    for arch in archs:
        for case in cases_by_arch[arch]:
            refused = _refused_by_sglang(case, loader_rule)
            if refused:
                reports[(arch, case.id)] = CaseReport(arch, case, NOT_APPLICABLE, (), note=refused)
                continue
            hit = cache.get(keys[(arch, case.id)])
            if hit is not None:
                reports[(arch, case.id)] = _case_report(arch, case, hit, cached=True)
            else:
                todo.setdefault(arch, []).append(case)

    stood_in: set[str] = set()
    reader: str | None = None
    overlay_path: Path | None = None
    jobs = jobs or default_jobs()

    def run_all(work: dict[str, list[ProbeCase]], overlay: Path | None) -> None:
        nonlocal reader
        total = sum(len(v) for v in work.values())
        if not total:
            return
        per_arch = max(1, jobs // len(work))
        units = [(arch, chunk) for arch, items in work.items() for chunk in _split(items, per_arch)]
        ticker = _Progress(progress, total, "compiled")
        tell(
            on_step,
            f"compiling {total} launcher call(s) for {', '.join(work)} in {len(units)} probe "
            f"interpreter(s) ({jobs} job(s)) ...",
        )
        with ThreadPoolExecutor(max_workers=min(jobs, len(units))) as pool:
            outputs = list(
                pool.map(lambda u: (u, _run_probe(root, u[0], u[1], policy, cache, overlay, ticker, label)), units)
            )
        for (arch, chunk), out in outputs:
            stood_in.update(out.get("stood_in", []))
            reader = reader or out.get("register_reader")
            for case in chunk:
                data = out["cases"][case.id]
                reports[(arch, case.id)] = _case_report(arch, case, data, cached=False)
                if data["status"] in ("ok", "skipped"):
                    cache.put(keys[(arch, case.id)], data)

    run_all(todo, None)

    # A release may not import with the packages installed here (each pins its own transformers):
    # retry the import failures once with the release's own pins on the path.
    retry = {a: [c for c in cases_by_arch[a] if reports[(a, c.id)].status == "import-error"] for a in archs}
    retry = {a: v for a, v in retry.items() if v}
    if retry:
        overlay_path = _overlay_for(root, repo_root, on_step)
        if overlay_path is not None:
            run_all(retry, overlay_path)

    ordered = tuple(reports[(a, c.id)] for a in archs for c in cases_by_arch[a])
    compiled = sum(not r.cached and r.status != NOT_APPLICABLE for r in ordered)
    if reader is None and any(k.registers is not None for r in ordered for k in r.kernels):
        from sm120kit.hardware.cubin import find_cuobjdump

        reader = find_cuobjdump() or "cuobjdump (cached results)"
    missing = sorted(
        {r.missing for r in ordered if r.status == "import-error" and r.missing and not r.missing.startswith("sglang")}
    )
    if missing:
        where = sorted({r.case.launcher for r in ordered if r.missing in missing})
        raise MissingDependency(
            f"SGLang {version or ''} ({', '.join(where)} launchers) imports the Python package(s) "
            f"{', '.join(missing)}, not installed here.".replace("SGLang  (", "SGLang ("),
            hint="Install the audit extra (pip install 'sm120kit[audit]') or the named packages.",
        )
    return SmemAuditResult(
        target=label,
        root=str(root),
        version=version,
        archs=archs,
        cases=ordered,
        seconds=time.perf_counter() - started,
        compiled=compiled,
        cached=sum(r.cached for r in ordered),
        register_reader=reader,
        stood_in=tuple(sorted(stood_in)),
        overlay=str(overlay_path) if overlay_path else None,
        matrix_files=matrix.files,
    )


def _refused_by_sglang(case: ProbeCase, rule: LoaderRule | None) -> str | None:
    """Why SGLang would never launch this case (its weight loader rejects the shape), or None."""
    if rule is None or case.launcher != "moe" or case.params.get("quantization") != "fp8_block":
        return None
    return rule.rejection(int(case.params["intermediate_size"]), case.params.get("block_shape"))


def _overlay_for(root: Path, repo_root: Path | None, on_step: Step | None) -> Path | None:
    try:
        from sm120kit.audit.probe_env import dependency_overlay
    except ImportError:  # pragma: no cover - shipped together
        return None
    return dependency_overlay(root, repo_root, on_step=on_step).path


def audit(
    path: str | Path | None = None,
    *,
    release: str | None = None,
    compare_unpatched: bool = False,
    progress: Progress | None = None,
    on_step: Step | None = None,
    **options,
) -> SmemAuditResult | SmemComparison:
    """Audit an SGLang tree (``path``), or a cached PyPI ``release``; with ``compare_unpatched`` also the
    pristine release of the tree's version, and report what changed between the two."""
    if release is not None and path is not None:
        raise UsageError("Give either PATH or --release, not both.")
    if release is not None:
        root = releases.fetch_release(releases.check_version(release), on_step=on_step)
        target = find_target(root)
    else:
        target = find_target(path)
    patched = _audit_target(target, progress=progress, on_step=on_step, **options)
    if not compare_unpatched:
        return patched
    if not target.version:
        raise UsageError(
            f"{target.package_dir} does not say which SGLang release it is, so there is no "
            "unpatched release to compare with.",
            hint="Audit it without --compare-unpatched.",
        )
    pristine_root = releases.fetch_release(target.version, on_step=on_step)
    tell(on_step, f"auditing the unpatched release {target.version} for comparison ...")
    pristine = _audit_target(
        find_target(pristine_root),
        progress=progress,
        on_step=on_step,
        label=f"sglang {target.version} from PyPI (unpatched)",
        **options,
    )
    return SmemComparison(patched, pristine, tuple(compare(pristine, patched)))


def _audit_target(target: Target, *, label: str | None = None, **options) -> SmemAuditResult:
    return audit_tree(
        target.root, label=label or target.label, version=target.version, repo_root=target.repo_root, **options
    )


def _state(case: CaseReport | None, kernel: KernelReport | None) -> str:
    if case is None:
        return "-"
    if case.status in ("compile-error", "import-error", "skipped", NOT_APPLICABLE):
        return case.status
    if kernel is None:
        return "-"
    return f"{kernel.shared} B" + (" over" if kernel.over else "")


def _bad(case: CaseReport | None, kernel: KernelReport | None) -> bool:
    if case is None:
        return False
    if case.status in ("compile-error", "import-error"):
        return True
    return bool(kernel and kernel.over)


def compare(pristine: SmemAuditResult, patched: SmemAuditResult) -> list[AuditChange]:
    """Kernels whose shared memory, block sizes or status differ between the unpatched and patched tree."""

    def index(result: SmemAuditResult) -> dict:
        found: dict = {}
        for c in result.cases:
            if not c.kernels:
                found[(c.arch, c.case.id, "-", 0)] = (c, None)
            for n, k in enumerate(c.kernels):
                found[(c.arch, c.case.id, k.name, n)] = (c, k)
        return found

    before, after = index(pristine), index(patched)
    changes = []
    for key in dict.fromkeys(list(before) + list(after)):
        arch, case_id, name, _ = key
        b_case, b_kernel = before.get(key, (None, None))
        a_case, a_kernel = after.get(key, (None, None))
        b_text, a_text = _state(b_case, b_kernel), _state(a_case, a_kernel)
        if (
            b_kernel
            and a_kernel
            and (b_kernel.block, b_kernel.num_warps, b_kernel.num_stages)
            != (a_kernel.block, a_kernel.num_warps, a_kernel.num_stages)
        ):
            b_text += f" ({b_kernel.block_text} w{b_kernel.num_warps} s{b_kernel.num_stages})"
            a_text += f" ({a_kernel.block_text} w{a_kernel.num_warps} s{a_kernel.num_stages})"
        if b_text == a_text:
            continue
        b_bad, a_bad = _bad(b_case, b_kernel), _bad(a_case, a_kernel)
        changes.append(
            AuditChange(arch, case_id, name, b_text, a_text, fixed=b_bad and not a_bad, broke=a_bad and not b_bad)
        )
    return changes


# -- rendering (used by the CLI and the docs) ------------------------------------------------------------

TABLE_HEADERS = (
    "arch",
    "launcher",
    "model",
    "shape",
    "kernel",
    "blocks",
    "warps",
    "stages",
    "shared B",
    "limit B",
    "regs",
    "status",
)


def table_rows(result: SmemAuditResult, *, findings_only: bool = False) -> list[list[Any]]:
    rows = []
    for c in result.cases:
        if findings_only and not c.failed:
            continue
        if not c.kernels:
            detail = c.error or c.note or ""
            rows.append(
                [
                    c.arch,
                    c.case.launcher,
                    c.case.model,
                    c.case.shape,
                    "-",
                    "",
                    "",
                    "",
                    "",
                    _limit(c.arch),
                    "",
                    f"{c.status.upper() if c.failed else c.status}: {detail.splitlines()[0] if detail else ''}",
                ]
            )
            continue
        for k in c.kernels:
            if findings_only and not k.over:
                continue
            status = "OVER" if k.over else "ok"
            rows.append(
                [
                    c.arch,
                    c.case.launcher,
                    c.case.model,
                    c.case.shape,
                    k.name,
                    k.block_text,
                    k.num_warps,
                    k.num_stages,
                    k.shared,
                    k.limit,
                    "" if k.registers is None else k.registers,
                    status,
                ]
            )
    return rows


def summary_line(result: SmemAuditResult) -> str:
    over, errors, refused = len(result.over_limit), len(result.errors), len(result.not_applicable)
    verdict = "PASS" if result.ok else "FAIL"
    return (
        f"{verdict}: {result.kernel_count()} kernel(s) from {len(result.cases)} launcher call(s) on "
        f"{', '.join(result.archs)}; {over} over the shared-memory limit, {errors} failed to compile or "
        f"import"
        + (f", {refused} not applicable (SGLang's loader refuses the shape)" if refused else "")
        + f"; {result.compiled} compiled, {result.cached} from cache; {result.seconds:.1f} s."
    )


def audit_smem(
    path: str | Path | None = None, *, capabilities: Iterable[str] = DEFAULT_ARCHS, **options
) -> SmemAuditResult | SmemComparison:
    """:func:`audit` with the architectures named ``capabilities`` (the ``sm120kit verify`` entry point)."""
    return audit(path, archs=tuple(capabilities), **options)
