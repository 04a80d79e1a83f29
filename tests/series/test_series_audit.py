"""Every patch of the SM120 series that changes a Triton kernel's tiles is proved by the shared-memory audit.

The rule: a patch whose diffs touch a Triton kernel module, a kernel's block-size policy or the fused-MoE
config files names, in its ``patch.toml`` (``audit = ["launcher/entry", ...]``), the cases of the
packaged audit matrix that compile those kernels. The audit then shows them over the limit in the release
as published and within it once the series is applied. Releases come from PyPI; the SM120 device is
faked (no GPU here) and every kernel is really compiled for sm_120 by Triton.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from series_support import copy_series

from sm120kit.audit import shapes
from sm120kit.patching.series import load_series
from sm120kit.sglang import launchers, releases

SERIES_DIR = REPO_ROOT / "patches" / "sglang"
LIMIT = 101376
_CONFIG_FILE = re.compile(r"/configs/triton_[0-9_]+/[^/]+\.json$")


def _module_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _launchers_of_file(path: str) -> set[str]:
    """The audit launchers whose kernel module (or helper module, or MoE config files) is ``path``."""
    found = set()
    for kind, spec in launchers.LAUNCHERS.items():
        modules = list(spec.modules) + [m for group in spec.helper_modules for m in group]
        if path in {_module_path(m) for m in modules if m not in launchers.CAPABILITY_HELPERS}:
            found.add(kind)
    if _CONFIG_FILE.search(path):
        found.add("moe")
    return found


_TILE_WORDS = re.compile(
    r"BLOCK|num_stages|num_warps|CUDA_CAPABILITY|\btriton\.|GROUP_SIZE"
)  # not "triton_ops" in an import


def _changed_lines(variant) -> dict[str, str]:
    """path -> the lines the variant's diff adds or removes in it."""
    changed = {}
    for patched in variant.patch_set:
        path = patched.path if patched.path.startswith("sglang/") else patched.path.split("/", 1)[1]
        changed[path] = "".join(line.value for hunk in patched for line in hunk if line.is_added or line.is_removed)
    return changed


def _kernel_files(patch) -> dict[str, set[str]]:
    """Files whose Triton kernels or tiles the patch's diffs change -> the audit launchers that compile them:
    an added file holding a Triton kernel, a changed Triton kernel module whose changed lines touch block
    sizes, stages, warps or the capability policy, an audit launcher's module, a MoE config file."""
    touched: dict[str, set[str]] = {}
    for variant in patch.variants:
        base = None
        changed = _changed_lines(variant)
        for file in variant.files:
            if file.action == "create":
                kernel = "@triton.jit" in file.target_text
            else:
                base = base or releases.fetch_release(variant.base)
                source = base / file.path
                text = source.read_text(encoding="utf-8") if source.is_file() else ""
                kernel = "@triton.jit" in text and bool(_TILE_WORDS.search(changed.get(file.path, "")))
            if kernel or _CONFIG_FILE.search(file.path) or _launchers_of_file(file.path):
                touched.setdefault(file.path, set()).update(_launchers_of_file(file.path))
    return touched


def coverage_problems(series_dir: Path) -> list[str]:
    """What breaks the rule in the series at ``series_dir`` (empty: every kernel patch is proved)."""
    matrix = shapes.load_matrix()
    problems = []
    for patch in load_series(series_dir).patches:
        touched = _kernel_files(patch)
        if not touched:
            continue
        if not patch.audit:
            problems.append(
                f"{patch.id}: changes Triton kernel files ({', '.join(sorted(touched))}) and names no audit entries"
            )
            continue
        proved = set()
        for item in patch.audit:
            launcher, entry = item.split("/", 1)
            if launcher not in matrix.launchers_of(entry):
                problems.append(
                    f"{patch.id}: audit entry {item}: the packaged matrix has no entry {entry!r} running {launcher}"
                )
            proved.add(launcher)
        for path, kinds in sorted(touched.items()):
            if kinds and not kinds & proved:
                problems.append(
                    f"{patch.id}: {path} feeds the {', '.join(sorted(kinds))} launcher(s), which no "
                    "audit entry of the patch runs"
                )
            if not kinds:
                problems.append(f"{patch.id}: {path} holds Triton kernels that no audit launcher runs")
    return problems


def test_every_kernel_patch_names_the_audit_entries_that_prove_it():
    assert coverage_problems(SERIES_DIR) == []
    series = load_series(SERIES_DIR)
    proved = {p.id for p in series.patches if p.audit}
    assert {
        "sm120-extend-attention",
        "sm120-prefill-attention",
        "sm120-moe-configs",
        "sm120-double-sparsity-attention",
        "sm120-inkling-moe-stages",
        "sm120-mla-attention",
        "sm120-lightning-attention",
    } <= proved
    # Patches that change no kernel need no entries.
    assert not series.get("sm120-capability").audit and not series.get("sm120-backend-gating").audit


def test_a_kernel_patch_without_audit_entries_fails_the_rule(tmp_path):
    copy = copy_series(tmp_path)

    def set_audit(pid: str, value: str | None) -> None:
        toml = copy / pid / "patch.toml"
        line = "" if value is None else f"audit = {value}\n"
        toml.write_text(re.sub(r"\naudit = \[[^\]]*\]\n", "\n" + line, toml.read_text(), count=1))

    set_audit("sm120-inkling-moe-stages", None)
    set_audit("sm120-double-sparsity-attention", '["ds-extend/nope"]')
    set_audit("sm120-prefill-attention", '["extend/llama3-8b"]')
    problems = coverage_problems(copy)
    assert any(p.startswith("sm120-inkling-moe-stages: changes Triton kernel files") for p in problems), problems
    assert any(p.startswith("sm120-double-sparsity-attention: audit entry ds-extend/nope") for p in problems)
    assert any(p.startswith("sm120-prefill-attention: sglang/") and "prefill launcher" in p for p in problems)
    assert len(problems) == 4, problems  # two prefill layouts, one each for the others


# -- the audit proves them: over as published, within the limit patched --------------------------------------

pytest.importorskip("torch")
pytest.importorskip("triton")

PROOF = {
    # release: (entries, launchers, {(launcher, entry, dtype): largest unpatched shared memory on 12.0})
    "0.5.8": (
        ["qwen3-next-hd256", "deepseek-v3-mla", "vision-hd128", "vision-hd256"],
        ["ds-extend", "prefill"],
        {
            ("ds-extend", "qwen3-next-hd256", "bfloat16"): 114688,
            ("ds-extend", "deepseek-v3-mla", "bfloat16"): 106496,
            ("prefill", "vision-hd128", "float32"): 131072,
            ("prefill", "vision-hd256", "float32"): 327680,
            ("prefill", "vision-hd256", "bfloat16"): 163840,
        },
    ),
    "0.5.23": (
        ["inkling", "vision-hd128", "vision-hd256", "bailing-linear"],
        ["inkling-moe", "prefill", "lightning"],
        {
            ("inkling-moe", "inkling", "bfloat16"): 110592,
            ("lightning", "bailing-linear", "float32"): 131584,
            ("inkling-moe", "inkling", "float32"): 221184,
            ("prefill", "vision-hd128", "float32"): 131072,
            ("prefill", "vision-hd256", "float32"): 327680,
        },
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(PROOF))
def test_audit_shows_the_patched_kernels_fixed(installed_tree, tmp_path, capsys, version, audit_cache):
    from sm120kit.audit.smem import audit_tree
    from sm120kit.cli import main as cli_main

    entries, kinds, expected_over = PROOF[version]
    tree = installed_tree(version)
    with pytest.raises(SystemExit) as exc:
        cli_main(["apply", str(tree)])
    assert exc.value.code == 0, capsys.readouterr().err
    matrix = shapes.select(shapes.load_matrix(), entries)
    cache = audit_cache(tmp_path / "cache")
    before = audit_tree(
        releases.fetch_release(version),
        archs=("12.0",),
        matrix=matrix,
        launchers=kinds,
        cache=cache,
        jobs=2,
        version=version,
    )
    after = audit_tree(
        tree.parent, archs=("12.0",), matrix=matrix, launchers=kinds, cache=cache, jobs=2, version=version
    )
    assert not before.errors and not after.errors, [(c.case.id, c.error) for c in before.errors + after.errors]
    largest = {}
    for case in before.cases:
        key = (case.case.launcher, case.case.model, case.case.params["dtype"])
        largest[key] = max([largest.get(key, 0)] + [k.shared for k in case.kernels])
    for key, shared in expected_over.items():
        assert largest[key] == shared, (key, largest[key])
    assert {c.case.launcher for c in after.cases if c.status == "ok"} == set(kinds)
    for case in after.cases:
        assert case.status == "ok", (case.case.id, case.status, case.note)
        assert case.kernels and all(k.shared <= LIMIT for k in case.kernels), (case.case.id, case.kernels)
