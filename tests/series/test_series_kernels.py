"""The SM120 patch series on real SGLang releases: capability helpers, Triton block sizes, fused-MoE configs.

For every release of the series matrix the release is downloaded from PyPI, copied, and the whole series
is applied with ``sm120kit.patching.engine.apply_series`` (what ``sm120kit apply`` runs). A fresh interpreter per
release (``tests/support/series_probe.py``) then loads the patched and the unpatched tree under faked devices and
reports the capability helpers' answers and every Triton launch SGLang's launchers make. The GPU is the
only stand-in: no SM120 (or any) GPU is present, so devices are faked and launches are compiled for the
faked target with the real Triton compiler (12.0) or only recorded (12.1, 10.0, 9.0); SGLang's
activation-quantization CUDA ops return empty tensors of the right shape.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SERIES_RELEASES, SUPPORT_DIR, quick_on_one
from packaging.version import Version
from sglang_light import LightTree

from sm120kit.hardware.arch import SM120_SHARED_MEMORY_PER_BLOCK as LIMIT
from sm120kit.patching.engine import ApplyResult, apply_series
from sm120kit.patching.series import load_series
from sm120kit.sglang import releases
from sm120kit.sglang.target import find_target

pytestmark = pytest.mark.slow

SERIES_DIR = REPO_ROOT / "patches" / "sglang"
PROBE = SUPPORT_DIR / "series_probe.py"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What each of these patches must do on a release: (releases, status), first match wins.
EXPECTED_STATUS = {
    "sm120-capability": ((">=0.5.20", "present-upstream"), ("", "applied")),
    "sm120-extend-attention": ((">=0.5.9", "present-upstream"), ("", "applied")),
    "sm120-prefill-attention": (("", "applied"),),
    "sm120-moe-configs": (("", "applied"),),
    "sm120-double-sparsity-attention": ((">=0.5.11", "not-applicable"), ("", "applied")),
    "sm120-inkling-moe-stages": (("<0.5.16", "not-applicable"), ("", "applied")),
    "sm120-mla-attention": (("", "applied"),),
    "sm120-decode-kv-splits": (("", "applied"),),
    "sm120-lightning-attention": (("<0.5.9", "not-applicable"), ("", "applied")),
    "sm120-flashinfer-mla-fp8-pages": (("", "applied"),),
}

# (is_blackwell, is_blackwell_supported, is_sm120_supported, is_sm120, is_sm121) after patching.
EXPECTED_CAPABILITIES = {
    "12.0": (True, True, True, True, False),
    "12.1": (True, True, True, False, True),
    "10.0": (True, True, False, False, False),
    "9.0": (False, False, False, False, False),
    "8.9": (False, False, False, False, False),
    "hip-12": (False, False, False, False, False),  # AMD RDNA4 reports major 12 through HIP
}
SM12X_HELPERS = ("is_blackwell", "is_blackwell_supported", "is_sm120_supported", "is_sm120", "is_sm121")


def expected_status(patch_id: str, version: str) -> str:
    from packaging.specifiers import SpecifierSet

    for spec, status in EXPECTED_STATUS[patch_id]:
        if Version(version) in SpecifierSet(spec):
            return status
    raise AssertionError(patch_id)


def unpatched_overflows(version: str) -> list[str]:
    """Cases that need more than 101376 B on 12.0 in the unpatched release (compiled to prove it)."""
    v = Version(version)
    cases = ["prefill-bf16-hd256"]
    if v < Version("0.5.9"):
        cases.append("extend-mla576")
    if v < Version("0.5.11"):
        cases.append("ds-extend-hd256")
    if v < Version("0.5.14"):
        cases.append("moe-fp8-default-m4096")
    if v >= Version("0.5.16"):
        cases.append("inkling-small-m-bf16")
    return cases


@dataclass
class SeriesRun:
    version: str
    patched: Path  # folder holding the patched sglang/
    unpatched: Path
    result: ApplyResult
    probe: dict


def _copy(src: Path, dst: Path) -> None:
    try:  # the patch manager replaces files (temporary file + rename), so hard links are safe
        shutil.copytree(src, dst, copy_function=os.link)
    except OSError:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)


@pytest.fixture(scope="module")
def series_runs(tmp_path_factory):
    """``series_runs("0.5.8")`` -> :class:`SeriesRun`; all releases are prepared two at a time."""
    series = load_series(SERIES_DIR)
    base = tmp_path_factory.mktemp("series")

    def prepare(version: str) -> SeriesRun:
        unpatched = releases.fetch_release(version)
        patched = base / version
        _copy(unpatched, patched)
        result = apply_series(find_target(patched / "sglang"), series)
        argv = [sys.executable, str(PROBE), "--tree", f"patched={patched}", "--tree", f"unpatched={unpatched}"]
        for case in unpatched_overflows(version):
            argv += ["--compile", f"unpatched:{case}"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0:
            raise AssertionError(f"series probe failed on {version}:\n{proc.stderr[-4000:]}")
        return SeriesRun(version, patched, unpatched, result, json.loads(proc.stdout))

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {v: pool.submit(prepare, v) for v in SERIES_RELEASES}
        yield lambda version: futures[version].result()


def _launch_args(result: dict) -> list[dict]:
    keep = ("shared", "compiled_stages", "compiled_warps")
    return [{k: v for k, v in launch.items() if k not in keep} for launch in result["launches"]]


# -- the series applies --------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_series_applies_without_conflict(series_runs, version):
    run = series_runs(version)
    assert run.result.exit_code == 0, run.result.message
    statuses = run.result.statuses
    for patch_id in EXPECTED_STATUS:
        assert statuses[patch_id] == expected_status(patch_id, version), (patch_id, statuses[patch_id])
    for plan in run.result.plan.patches:
        if plan.patch_id in EXPECTED_STATUS and plan.status == "applies":
            assert all(h.fuzz == 0 for h in plan.hunks), (plan.patch_id, [h.to_json() for h in plan.hunks])
    mine = {p.patch_id for p in run.result.plan.patches if p.patch_id in EXPECTED_STATUS}
    written = [c for c in run.result.written if mine & set(c.patches)]
    assert written
    for change in written:
        on_disk = (run.patched / change.path).read_bytes()
        assert on_disk == change.after
        if change.path.endswith(".py"):
            compile(on_disk.decode(), change.path, "exec", dont_inherit=True)
        elif change.path.endswith(".json"):
            assert json.loads(on_disk)


# -- capability helpers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_capability_helpers(series_runs, version):
    run = series_runs(version)
    after = run.probe["patched"]["capabilities"]
    before = run.probe["unpatched"]["capabilities"]
    for preset, expected in EXPECTED_CAPABILITIES.items():
        got = tuple(after[preset][h] for h in SM12X_HELPERS)
        assert got == expected, (preset, dict(zip(SM12X_HELPERS, got)))
    # Hopper, datacenter Blackwell and Ada answer as before; the SM90/SM100 helpers nowhere change.
    for preset, answers in before.items():
        for helper, value in answers.items():
            if value == "absent":
                continue
            if preset in ("10.0", "9.0", "8.9") or helper in ("is_sm100_supported", "is_sm90_supported"):
                assert after[preset][helper] == value, (preset, helper, value, after[preset][helper])
    assert after["9.0"]["is_sm90_supported"] is True and after["10.0"]["is_sm100_supported"] is True
    # What the patch fixes, seen in the unpatched release:
    v = Version(version)
    if v < Version("0.5.4.post2"):
        assert before["12.0"]["is_blackwell"] is False
    if Version("0.5.4") <= v < Version("0.5.7"):
        assert before["hip-12"]["is_sm120_supported"] == "raises TypeError"
    if v < Version("0.5.20"):
        assert before["12.0"]["is_sm120"] == "absent"


# -- Triton launches ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_sm120_launches_compile_within_shared_memory(series_runs, version):
    run = series_runs(version)
    compiled = run.probe["patched"]["launches"]["12.0"]
    assert {"extend-mla576", "extend-hd256-gqa8", "prefill-fp32-hd256", "moe-fp8-default-m4096"} <= set(compiled)
    for case, result in compiled.items():
        assert "error" not in result, (case, result.get("traceback"))
        assert result["launches"], case
        for launch in result["launches"]:
            assert launch["shared"] <= LIMIT, (case, launch)
    # The unpatched release does overflow in those cases (the check can fail).
    before = run.probe["unpatched"]["launches"]["12.0"]
    for case in unpatched_overflows(version):
        assert "error" not in before[case], (case, before[case].get("traceback"))
        assert max(launch["shared"] for launch in before[case]["launches"]) > LIMIT, (case, before[case])


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_sm121_takes_the_sm120_path(series_runs, version):
    launches = series_runs(version).probe["patched"]["launches"]
    from_sm120, from_sm121 = launches["12.0"], launches["12.1"]
    assert set(from_sm120) == set(from_sm121)
    for case, result in from_sm121.items():
        assert "error" not in result, (case, result.get("traceback"))
        if case.startswith("moe-"):
            # GB10 has no config files of its own: default or clamped configs, each within the limit.
            config = result["config"]
            elem = 1 if "fp8" in case else 2
            copies = max(config.get("num_stages", 3) - 1, 1)
            assert copies * config["BLOCK_SIZE_K"] * (config["BLOCK_SIZE_M"] + config["BLOCK_SIZE_N"]) * elem <= LIMIT
        else:
            assert _launch_args(result) == _launch_args(from_sm120[case]), case


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_hopper_and_datacenter_blackwell_unchanged(series_runs, version):
    run = series_runs(version)
    for preset in ("9.0", "10.0"):
        after = run.probe["patched"]["launches"][preset]
        before = run.probe["unpatched"]["launches"][preset]
        assert set(after) == set(before)
        for case in after:
            assert "error" not in after[case], (preset, case, after[case].get("traceback"))
            assert _launch_args(after[case]) == _launch_args(before[case]), (preset, case)
            assert after[case].get("config") == before[case].get("config"), (preset, case)


# -- fused-MoE configs -----------------------------------------------------------------------------------------


def test_moe_config_files_are_the_rule_output():
    gen = _script("gen_moe_configs")
    files = gen.generate()
    series = load_series(SERIES_DIR)
    patch = series.get("sm120-moe-configs")
    for variant in patch.variants:
        shipped = {}
        for created in (f for f in variant.files if f.action == "create"):
            assert f"/configs/{gen.TRITON_FOLDER}/" in created.path
            shipped[Path(created.path).name] = created.target_text
        assert not [f for f in variant.diff_files if f.action == "create"], "configs are [[files]] entries"
        assert shipped.keys() == files.keys(), variant.name
        for name, table in files.items():
            assert shipped[name] == gen.render(table), (variant.name, name)
    for name, table in files.items():
        elem = gen.element_bytes("fp8_w8a8" if "dtype=fp8_w8a8" in name else None)
        for config in table.values():
            assert gen.pipelined_shared_memory(config, elem) <= LIMIT, (name, config)


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_patched_release_finds_the_shipped_configs(series_runs, version):
    """The 12.0 device is named like an RTX PRO 6000 Blackwell Workstation Edition; the config SGLang
    picks for Qwen3-30B-A3B (bf16, TP 1) at 4096 tokens is the shipped file's entry."""
    gen = _script("gen_moe_configs")
    table = gen.generate()[gen.file_name(128, 768, gen.DEVICES[0], None, None)]
    chosen = series_runs(version).probe["patched"]["launches"]["12.0"]["moe-bf16-qwen3-30b-m4096"]["config"]
    assert chosen == table["4096"]


@pytest.mark.parametrize("version", ["0.5.8", "0.5.23"])
def test_clamp_keeps_fitting_configs_and_fits_the_rest(series_runs, version):
    """_fit_config_to_sm12x_shared_memory from the patched tree, under faked devices (no GPU here)."""
    from sm120kit.hardware.fake_device import PRESETS, faked_cuda

    run = series_runs(version)
    module_name = (
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config"
        if Version(version) >= Version("0.5.11")
        else "sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_config"
    )
    configs_dir = run.patched / module_name.replace(".", "/").rsplit("/", 1)[0] / "configs"
    tuned = []  # SGLang's own configs tuned on SM120 cards: they run there, so they must stay as they are
    for path in sorted(configs_dir.glob("triton_*/*.json")):
        if any(tag in path.name for tag in ("RTX_PRO_6000_Blackwell_Server", "Max-Q", "GB10")):
            dtype = "fp8_w8a8" if "fp8_w8a8" in path.name else None
            tuned += [(dtype, c) for c in json.loads(path.read_text()).values()]
    too_big = [
        (
            "fp8_w8a8",
            {
                "BLOCK_SIZE_M": 128,
                "BLOCK_SIZE_N": 256,
                "BLOCK_SIZE_K": 128,
                "GROUP_SIZE_M": 32,
                "num_warps": 8,
                "num_stages": 4,
            },
        ),
        (None, {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1, "num_stages": 5}),
        ("float32", {"BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 8}),
        ("fp8_w8a8", {"BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 256, "num_stages": 2, "USE_TMA": True}),
    ]
    originals = json.dumps(tuned + too_big, sort_keys=True)
    for preset in ("12.0", "12.1", "9.0", "10.0", "hip-12"):
        with faked_cuda(PRESETS[preset]), LightTree(run.patched, blocked=("sglang.srt.server_args",)) as tree:
            fit = tree.load(module_name)._fit_config_to_sm12x_shared_memory
            for dtype, config in tuned + too_big:
                out = fit(config, dtype)
                if not preset.startswith("12."):
                    assert out is config, (preset, config)
                    continue
                elem = 1 if dtype == "fp8_w8a8" else 4 if dtype == "float32" else 2
                copies = max(out.get("num_stages", 3) - 1, 1)
                assert copies * out["BLOCK_SIZE_K"] * (out["BLOCK_SIZE_M"] + out["BLOCK_SIZE_N"]) * elem <= LIMIT
                assert out["BLOCK_SIZE_M"] == config["BLOCK_SIZE_M"]
                assert set(out) - set(config) <= {"num_stages"} and set(config) <= set(out)
                if (dtype, config) in tuned:
                    assert out is config, config
                else:
                    assert out != config, config
    assert json.dumps(tuned + too_big, sort_keys=True) == originals  # inputs are never modified
    assert len(tuned) >= 30, "expected SGLang's SM120-tuned config files in this release"


@pytest.mark.parametrize("version", ["0.5.23"])
def test_pipelined_shared_memory_estimate_matches_triton(series_runs, version):
    """The clamp's estimate, (num_stages - 1) * BLOCK_K * (BLOCK_M + BLOCK_N) * element bytes, is what
    Triton allocates for the fused-MoE kernel compiled for sm_120 (compiled here; the device is faked)."""
    run = series_runs(version)
    compiled = run.probe["patched"]["launches"]["12.0"]
    checked = 0
    for case, result in compiled.items():
        if not case.startswith("moe-"):
            continue
        config, launch = result["config"], result["launches"][0]
        elem = 1 if "fp8" in case else 2
        copies = max(config.get("num_stages", 3) - 1, 1)
        estimate = copies * config["BLOCK_SIZE_K"] * (config["BLOCK_SIZE_M"] + config["BLOCK_SIZE_N"]) * elem
        if config["BLOCK_SIZE_K"] * elem >= 64:  # narrower K rows are padded to 64 bytes by Triton
            assert launch["shared"] == estimate, (case, config, launch["shared"])
            checked += 1
    assert checked >= 5


# -- the audit engine agrees ------------------------------------------------------------------------------------


def test_audit_engine_finds_nothing_over_the_limit_in_a_patched_tree(series_runs, audit_cache):
    from sm120kit.audit.shapes import load_matrix, select
    from sm120kit.audit.smem import audit_tree

    run = series_runs("0.5.23")
    matrix = select(load_matrix(), ["vision-hd256", "qwen3-30b-a3b"])
    result = audit_tree(
        run.patched,
        archs=("12.0",),
        matrix=matrix,
        launchers=["prefill", "moe"],
        cache=audit_cache(run.patched.parent / "audit-cache"),
        jobs=2,
        version=run.version,
    )
    statuses = {(c.case.launcher, c.status) for c in result.cases}
    assert ("prefill", "ok") in statuses and ("moe", "ok") in statuses
    for case in result.cases:
        assert case.status in ("ok", "skipped"), (case.case, case.status, case.error)
        for kernel in case.kernels:
            assert not kernel.over, (case.case, kernel)


# -- the docs table ----------------------------------------------------------------------------------------------


def test_series_table_matches_a_fresh_run(capsys):
    gen = _script("gen_series_table")
    assert gen.main(["--releases", ",".join(SERIES_RELEASES), "--check"]) == 0, capsys.readouterr().err


def _fp8_moe_loader_check(fp8_py: Path):
    """``check(n, tp)`` running the block-size checks of Fp8MoEMethod's weight creation, taken from the
    release's own fp8.py: the ``if`` statements beside the one testing ``intermediate_size_per_partition %
    block_n`` (128x128 blocks, no ROCm aiter). It raises ValueError where SGLang's loader does."""
    import ast

    tree = ast.parse(fp8_py.read_text(encoding="utf-8"))
    method = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Fp8MoEMethod")

    def tests_block_n(node: ast.AST) -> bool:
        return isinstance(node, ast.If) and "intermediate_size_per_partition % block_n" in ast.unparse(node.test)

    bodies = [
        body
        for node in ast.walk(method)
        for field in ("body", "orelse")
        for body in [getattr(node, field, None)]
        if isinstance(body, list) and any(map(tests_block_n, body))
    ]
    assert len(bodies) == 1, f"{fp8_py}: {len(bodies)} places check the intermediate size against block_n"
    checks = [s for s in bodies[0] if isinstance(s, ast.If) and "intermediate_size_per_partition" in ast.unparse(s)]
    source = (
        "def check(intermediate_size_per_partition, tp_size, block_n=128, block_k=128):\n"
        + "\n".join("    " + line for s in checks for line in ast.unparse(s).splitlines())
        + "\n"
    )
    namespace: dict = {}
    exec(compile(source, str(fp8_py), "exec"), namespace)
    return namespace["check"], source


@pytest.mark.parametrize("version", quick_on_one(SERIES_RELEASES))
def test_no_config_file_for_a_shape_the_fp8_loader_rejects(release_dir, version):
    """gen_moe_configs.loadable is SGLang's rule: for every model shape of the generator, the release's own
    checks (fp8.py) raise exactly where loadable says no; no shipped file has such a shape; the files left
    out (docs/series.md) are those."""
    gen = _script("gen_moe_configs")
    check, source = _fp8_moe_loader_check(release_dir(version) / "sglang/srt/layers/quantization/fp8.py")
    assert "block_k" in source and "tp_size > 1" in source, source
    seen = set()
    for _model, _experts, inter, _topk, tps, _quants in gen.MODELS:
        for tp in tps:
            n = inter // tp
            try:
                check(n, tp)
                accepted = True
            except ValueError:
                accepted = False
            assert accepted == gen.loadable(n, tp, [128, 128]), (version, n, tp)
            seen.add(accepted)
    assert seen == {True, False}
    shipped = set(gen.generate())
    dropped = {name for _model, _tp, name in gen.rejected()}
    assert len(dropped) == 6 and not dropped & shipped
    assert all(gen.loadable(int(n.split(",N=")[1].split(",")[0]), 2, [128, 128]) for n in shipped if "block_shape" in n)
