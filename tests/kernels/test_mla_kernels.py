"""The ``sm120-mla-attention`` patch: split-KV tree verify and MLA decode for SGLang's Triton backend on 12.x.

Real releases from PyPI are patched with the series; the kernels run on the CPU through Triton's
interpreter (``tests/support/mla_interpret_check.py`` in a fresh interpreter) against a float32 reference and
against the release's own ``extend_attention_fwd`` / ``decode_attention_fwd``; the routing is checked
under faked devices (no GPU is present here: ``sm120kit.hardware.fake_device`` stands in for 12.0, 12.1,
9.0, 10.0 and an AMD card that reports major 12); every tile the launchers can pick is compiled for
sm_120 and sm_121 with the real Triton compiler, and the CUDA kernels with NVRTC. The kernels are the
``sm120_attention`` package (``kernels/`` is on pytest's path); the route between them is tested, without
compiles, in tests/kernels/test_mla_route.py, their source files in tests/kernels/test_mla_source.py.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SUPPORT_DIR

from sm120kit.hardware import fake_device
from sm120kit.hardware.arch import SM120_SHARED_MEMORY_PER_BLOCK as LIMIT
from sm120kit.patching.engine import apply_series, revert_series
from sm120kit.patching.series import load_series
from sm120kit.sglang import releases
from sm120kit.sglang.target import find_target

pytestmark = pytest.mark.slow

SERIES_DIR = REPO_ROOT / "patches" / "sglang"
PATCH_DIR = SERIES_DIR / "sm120-mla-attention"
KERNEL_DIR = REPO_ROOT / "kernels" / "sm120_attention"
BACKEND = "sglang/srt/layers/attention/triton_backend.py"
# One release per variant (and 0.5.17, 0.5.23 inside the two newest ranges).
RELEASES = ("0.5.2", "0.5.4", "0.5.10", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.23")


def module_of(version: str) -> str:
    """Where the patch puts the module: beside the release's Triton attention kernels."""
    from packaging.version import Version

    if Version(version) >= Version("0.5.16"):
        return "sglang/kernels/ops/attention/sm120_mla.py"
    return "sglang/srt/layers/attention/triton_ops/sm120_mla.py"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mla():
    from sm120_attention import sm120_mla

    return sm120_mla


@pytest.fixture(scope="module")
def generator():
    """scripts/gen_mla_patch.py, the writer of the patch's diffs (a script, loaded from its file)."""
    return _load(REPO_ROOT / "scripts" / "gen_mla_patch.py", "gen_mla_patch")


def _patched(tmp_path_factory, version: str) -> Path:
    import shutil

    root = tmp_path_factory.mktemp("mla") / version
    shutil.copytree(releases.fetch_release(version), root)
    apply_series(find_target(root / "sglang"), load_series(SERIES_DIR))
    return root


@pytest.fixture(scope="module")
def patched_0523(tmp_path_factory):
    return _patched(tmp_path_factory, "0.5.23")


def test_diffs_are_the_generator_output(generator):
    assert generator.main(["--check"]) == 0


@pytest.mark.parametrize("version", RELEASES)
def test_patch_adds_the_module_and_one_hook_then_reverts(tmp_path, generator, version):
    import shutil

    root = tmp_path / version
    shutil.copytree(releases.fetch_release(version), root)
    before = (root / BACKEND).read_bytes()
    result = apply_series(find_target(root / "sglang"), load_series(SERIES_DIR))
    plan = {p.patch_id: p for p in result.plan.patches}
    assert plan["sm120-mla-attention"].status == "applies"
    shipped = [root / module_of(version).replace("sm120_mla.py", name) for name in generator.KERNEL_FILES]
    for name, path in zip(generator.KERNEL_FILES, shipped):
        assert path.read_bytes() == (KERNEL_DIR / name).read_bytes(), name
    backend = (root / BACKEND).read_text()
    assert backend.count("sm120_mla.install(self, model_runner.device)") == 1
    # The hook sits in TritonAttnBackend.__init__, after the launchers are bound and before the
    # constructor reads its arguments.
    init = backend.index("class TritonAttnBackend")
    hook = backend.index("sm120_mla.install(", init)
    assert backend.index("self.extend_attention_fwd = ", init) < hook < backend.index("# Parse args", init)
    revert_series(find_target(root / "sglang"))
    assert (root / BACKEND).read_bytes() == before
    assert not any(path.exists() for path in shipped)


@pytest.mark.parametrize("version", ["0.5.2", "0.5.23"])  # the oldest argument order and the newest
def test_kernels_match_the_reference_and_the_release(tmp_path_factory, tmp_path, version):
    """Through Triton's interpreter on the CPU. The checks against the float32 reference exercise only the
    patch's own module, the same file on every release, so they run on the newest; the checks against the
    release's kernels and the declines run on both. The reference checks take each pair of (shape, dtype,
    layout) once, 6 of the 12 combinations, which halves the interpreted MLA runs that made 0.5.23 take
    five times as long as 0.5.2; ``SM120KIT_TEST_EVERY_CASE=1`` runs all 12 (the tolerances are the same)."""
    patched = _patched(tmp_path_factory, version)
    out = tmp_path / "numerics.json"
    # the patched release's modules, and the float32 reference from the kernels' package
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(patched), str(REPO_ROOT / "kernels")]), TRITON_INTERPRET="1")
    reference = version == "0.5.23"
    cmd = [sys.executable, str(SUPPORT_DIR / "mla_interpret_check.py"), str(out)]
    proc = subprocess.run(
        cmd + ([] if reference else ["--release-only"]),
        capture_output=True,
        text=True,
        env=env,
        timeout=3000,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = json.loads(out.read_text())
    by_check: dict[str, list[dict]] = {}
    for r in records:
        by_check.setdefault(r["check"], []).append(r)
    reference_checks = ("verify-reference", "decode-reference", "verify-scales", "verify-separate-tail")
    if reference:
        # Tolerances: float32 agrees to rounding; fp16 outputs carry fp16 rounding of |o| < 2 (one ulp 2^-10).
        assert {r["shape"] for r in by_check["verify-separate-tail"]} == {"mla", "gqa", "mha"}
        for r in (r for name in reference_checks for r in by_check[name]):
            assert r["ran"], r
            assert r["max_abs_diff"] < (1e-5 if r["dtype"] == "float32" else 2e-3), r
        cases = by_check["verify-reference"]
        shapes, dtypes, pages = ("mla", "gqa", "mha"), ("float32", "float16"), (1, 16)
        # every shape with both dtypes and both layouts, each dtype with both layouts
        assert {(r["shape"], r["dtype"]) for r in cases} == {(s, d) for s in shapes for d in dtypes}
        assert {(r["shape"], r["page_size"]) for r in cases} == {(s, p) for s in shapes for p in pages}
        assert {(r["dtype"], r["page_size"]) for r in cases} == {(d, p) for d in dtypes for p in pages}
        assert {(r["mask"], r["page_size"]) for r in cases} == {("tree", 1), ("chain", 16)}
    else:
        assert not set(reference_checks) & set(by_check), sorted(by_check)
    for r in by_check["verify-release"] + by_check["decode-release"]:
        assert r["ran"] and r["max_abs_diff"] < 2e-3, r
    assert {r["shape"] for r in by_check["verify-release"]} == {"mla", "gqa"}
    assert any(r.get("case") == "enable_lean" for r in by_check["decode-release"])
    (fallback,) = by_check["fallback-identical"]
    assert fallback["bit_identical"], fallback
    declines = by_check["decline"]
    assert len(declines) == 11
    for r in declines:
        assert r["ran"] is False and r["untouched"], r


@pytest.mark.parametrize(
    "key, routed", [("12.0", True), ("12.1", True), ("9.0", False), ("10.0", False), ("hip-12", False)]
)
def test_install_routes_on_12x_cuda_only(mla, key, routed, monkeypatch):
    monkeypatch.delenv("SGLANG_SM120_MLA", raising=False)
    mla._CAPABILITY.clear()

    class Backend:  # the two attributes install() reads and replaces
        extend_attention_fwd = staticmethod(lambda *a, **k: "extend")
        decode_attention_fwd = staticmethod(lambda *a, **k: "decode")

    backend = Backend()
    original = (backend.extend_attention_fwd, backend.decode_attention_fwd)
    with fake_device.faked_cuda(fake_device.preset(key)):
        assert mla.install(backend, "cuda") is routed
    now = (backend.extend_attention_fwd, backend.decode_attention_fwd)
    if routed:
        assert now != original
        assert inspect.unwrap(now[0]) is original[0] and inspect.unwrap(now[1]) is original[1]
    else:
        assert now == original


def test_env_var_turns_routing_off(mla, monkeypatch):
    mla._CAPABILITY.clear()
    monkeypatch.setenv("SGLANG_SM120_MLA", "0")

    class Backend:
        extend_attention_fwd = decode_attention_fwd = None

    with fake_device.faked_cuda(fake_device.preset("12.0")):
        assert mla.install(Backend(), "cuda") is False


def test_split_counts_follow_the_sm_count(mla):
    # Two waves of programs per GPU, divided among the programs one split already has, rounded down so
    # the programs end in whole waves (never one program over).
    assert mla.num_splits_for(1, 188) == 256  # RTX PRO 6000, one request: capped at MAX_SPLITS
    assert mla.num_splits_for(1, 48) == 96  # GB10
    assert mla.num_splits_for(4, 188) == 94
    assert mla.num_splits_for(32, 188) == 11  # 352 programs on 376 slots, not 384
    assert mla.num_splits_for(16, 132) == 16  # H200, 32 drafts x 16 heads: 256 programs on 264, not 272
    assert mla.num_splits_for(10_000, 188) == 1
    assert mla.num_splits_for(1, 132, waves=1) == 132
    assert mla.num_splits_for(32, 188, waves=4) == 23  # four waves
    for programs in range(1, 300):
        for sms in (48, 132, 188):
            splits = mla.num_splits_for(programs, sms)
            assert splits == 1 or splits * programs <= 2 * sms


GROUPS = (1, 2, 4, 8, 16, 32, 64, 128)
TOKENS = (1, 2, 8, 64)
# The widest head dims of each KV-tile class: MLA (576/512, 32 tokens), 129-256 (32), up to 128 (64).
HEAD_DIMS = ((576, 512), (256, 256), (128, 128))


def reachable_tiles(mla, head_dims=HEAD_DIMS):
    """(lk, lv, tiles) -> an example (group, tokens) for every tile set the launchers can pick."""
    seen = {}
    for lk, lv in head_dims:
        for group in GROUPS:
            for tokens in TOKENS:
                seen.setdefault((lk, lv, mla.pick_tiles(lk, lv, group, tokens)), (group, tokens))
    return seen


def test_tiles_are_few_and_known(mla):
    tiles = reachable_tiles(mla, HEAD_DIMS + ((192, 128), (64, 64), (96, 96)))
    for lk, lv, t in tiles:
        assert t.block_t * t.block_h in (16, 32)  # mma.sync takes 16 rows; 32 keep 512 fp32 values in registers
        assert t.block_n == (32 if lk > 128 else 64)
        assert t.block_h <= (16 if lv > 256 else 32)
        assert (t.num_warps, t.num_stages) == (4, 3)
    # Every token count maps onto the few sets the legality test compiles.
    assert len({t for (_, _, t) in tiles}) <= 24


@pytest.mark.parametrize("arch", ["12.0", "12.1"])
def test_every_reachable_tile_compiles_within_the_limit(mla, arch):
    import torch

    compiled = []
    head_dims = HEAD_DIMS if arch == "12.0" else HEAD_DIMS[:1]  # 12.1: the same compiler, MLA only
    with fake_device.faked_device(fake_device.preset(arch)) as recorder:
        for (lk, lv, tiles), (group, tokens) in sorted(reachable_tiles(mla, head_dims).items(), key=str):
            kv_dtypes = (torch.bfloat16, torch.float8_e4m3fn) if lk > lv else (torch.bfloat16,)
            decode = tokens == 1 and lk > lv
            for kv_dtype in kv_dtypes:
                _launch(mla, torch, lk, lv, group, tokens, kv_dtype, decode, tiles)
                compiled += [(lk, lv, tiles, str(kv_dtype), decode, r.name, r.shared) for r in recorder.take()]
    names = {c[5] for c in compiled}
    # The tail's own pass is reached only by requests of more query rows than the route's fuse_tail_max_rows.
    required = {"_prefix_kernel", "_prefix_pair_kernel", "_merge_kernel", "_merge_tail_kernel"}
    assert required <= names <= required | {"_tail_kernel"}, names
    over = [c for c in compiled if c[-1] > LIMIT]
    assert not over, over


def _launch(mla, torch, lk, lv, group, tokens, kv_dtype, decode, tiles):
    meta, kvh, batch = "meta", 1, 2
    heads = group * kvh
    total = tokens * batch
    q = torch.empty(total, heads, lk, device=meta, dtype=torch.bfloat16)
    k_buf = torch.empty(4096, kvh, lk, device=meta, dtype=kv_dtype)
    v_buf = k_buf[:, :, :lv] if lk > lv else torch.empty(4096, kvh, lv, device=meta, dtype=kv_dtype)
    o = torch.empty(total, heads, lv, device=meta, dtype=torch.bfloat16)
    indptr = torch.empty(batch + 1, device=meta, dtype=torch.int32)
    indices = torch.empty(4096, device=meta, dtype=torch.int64)
    with mla.routes.using(mla.routes.TABLE._replace(tiles=tiles)):
        if decode:
            mla._run_split_attention(q, k_buf, v_buf, o, None, indptr, indices, batch, 1, 0.1, 1.0, 1.0)
            return
        k_ext = torch.empty(total, kvh, lk, device=meta, dtype=torch.bfloat16)
        v_ext = k_ext[:, :, :lv] if lk > lv else torch.empty(total, kvh, lv, device=meta, dtype=torch.bfloat16)
        tail = (
            k_ext,
            v_ext,
            torch.empty(100000, device=meta, dtype=torch.int8),
            torch.empty(batch + 1, device=meta, dtype=torch.int64),
        )
        mla._run_split_attention(q, k_buf, v_buf, o, indptr, indptr, indices, batch, tokens, 0.1, 1.0, 1.0, tail=tail)


def test_verify_checks_reach_the_patched_launchers_for_faked_sm120(patched_0523):
    """`sm120kit verify`'s triton-tree-verify and triton-mla-decode checks on the patched release, for a
    faked 12.0 device (this machine has no GPU): every case reaches the new launchers with arguments they
    serve, and Triton compiles each kernel for sm_120 within the limit. The numbers themselves are compared
    on a GPU (`sm120kit verify`) and, here, through the interpreter (test above)."""
    proc = subprocess.run(
        [sys.executable, str(SUPPORT_DIR / "verify_plumbing.py"), str(patched_0523), "12.0"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert "skipped" not in data, data.get("skipped")
    for name in ("triton-tree-verify", "triton-mla-decode"):
        cases = data["checks"][name]
        assert cases and all(c["ok"] for c in cases), (name, cases)
    new = [k for k in data["kernels"] if k["module"].endswith("sm120_mla")]
    # MLA 16 heads x 8 drafts (128 rows) merges its tail in place; GQA 32 heads x 8 drafts takes the tail's pass.
    assert {k["name"] for k in new} == {
        "_prefix_kernel",
        "_prefix_pair_kernel",
        "_tail_kernel",
        "_merge_kernel",
        "_merge_tail_kernel",
    }
    assert max(k["shared"] for k in new) <= LIMIT


@pytest.fixture(scope="module")
def mma():
    from sm120_attention import sm120_mla_mma

    return sm120_mla_mma


@pytest.mark.parametrize("arch", ["sm_120a", "sm_121a"])
def test_mma_prefix_kernel_compiles_within_the_limit(mma, arch):
    """The CUDA verify prefix kernel, compiled by NVRTC (the nvidia-cuda-nvrtc wheel; no GPU here) as it is at
    first use on the card: every entry point (prefix only, the one-launch verify or decode with tail and merge,
    and its 16-row programs), within 255 registers and 101376 B of shared memory (the
    kernel's dynamic shared memory is the launcher's SMEM_BYTES, which the source checks at compile time)."""

    cubin = mma.compile_cubin(arch)
    usage = _usage(cubin)
    entries = [item for names in mma.ENTRY_NAMES.values() for item in names.items()]
    # prefix, one-launch and its 16-row programs, for bf16 KV, fp8 KV (exact) and fp8 KV on the fp8-mma path,
    # each for int32 and int64 slots
    assert len(entries) == 18
    assert set(usage) == {name for _, name in entries}
    for (kv_dtype, _, _), name in entries:
        res = usage[name]
        assert res.registers <= 255, (name, res)
        assert res.shared + mma.SMEM_BYTES[kv_dtype] <= LIMIT, (name, res)
        assert mma.SMEM_BYTES[kv_dtype] > 48 * 1024  # so the launcher must raise the dynamic shared-memory cap


def _usage(cubin: bytes) -> dict:
    """The registers, shared and local memory of each entry point of a cubin (cuobjdump; no GPU needed)."""
    from sm120kit.hardware.cubin import resource_usage

    usage = resource_usage(cubin)
    assert usage is not None, "no cuobjdump (Triton's bundled copy or nvidia-cuda-cuobjdump) was found"
    return usage


def _sass_of(cubin: bytes) -> dict[str, str]:
    """The SASS of each entry point of a cubin (cuobjdump; no GPU needed)."""
    import tempfile

    from sm120kit import runner
    from sm120kit.hardware.cubin import find_cuobjdump

    tool = find_cuobjdump()
    assert tool is not None, "no cuobjdump (Triton's bundled copy or nvidia-cuda-cuobjdump) was found"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernels.cubin"
        path.write_bytes(cubin)
        text = runner.run([tool, "-sass", str(path)], what="cuobjdump", timeout=300).stdout
    return {part.split("\n", 1)[0].strip(): part for part in text.split("Function : ")[1:]}


def _sass(mma, arch: str, defines: tuple[str, ...] = ()) -> dict[str, str]:
    """The SASS of each entry point of a build NVRTC compiles."""
    return _sass_of(mma.compile_cubin(arch, defines=defines))


def _exact_fp8_fused16(mma) -> set[str]:
    """The 16-row one-launch entry points with fp8 KV on the exact path: the ones the transposed body is built into."""
    import torch

    return {name for (kv_dtype, _, q8), name in mma.FUSED16_NAMES.items() if kv_dtype == torch.float8_e4m3fn and not q8}


def _bf16_fused16(mma) -> set[str]:
    """The 16-row one-launch entry points with bf16 KV: the transposed body's bf16 form is built into them."""
    import torch

    return {name for (kv_dtype, _, _), name in mma.FUSED16_NAMES.items() if kv_dtype == torch.bfloat16}


@pytest.fixture(scope="module")
def builds(mma):
    """The launchers' build (NVRTC cubin) for sm_120a and for sm_90a (the H200 the benchmarks run on)."""
    return {arch: mma.compile_cubin(arch) for arch in ("sm_120a", "sm_90a")}


@pytest.fixture(scope="module")
def sass(builds):
    """The SASS of the launchers' build for each target of ``builds``."""
    return {arch: _sass_of(cubin) for arch, cubin in builds.items()}


def test_fp8_mma_entry_points_score_with_the_sm120_e4m3_instruction(mma, sass):
    """For sm_120a the fp8-mma entry points compile their scores to the native e4m3 tensor-core instruction
    (QMMA.16832.F32.E4M3.E4M3 in the SASS, 36 a 64-row or 16-row tile loop: 9 k32 steps x 4 n8 tiles, or x 1
    over 5 loads) and the exact entry points to none; for sm_90a (the H200 the benchmarks run on) the same PTX
    becomes unpacks to f16 and HMMA, so the H200 times an emulation of this path (docs/benchmarks.md)."""
    sm120, sm90 = sass["sm_120a"], sass["sm_90a"]
    for (kv_dtype, _, fp8_mma), name in (item for names in mma.ENTRY_NAMES.values() for item in names.items()):
        qmma = sm120[name].count("QMMA.16832.F32.E4M3.E4M3")
        assert (qmma > 0) == fp8_mma, (name, qmma)
        assert "QMMA" not in sm90[name], name
        if fp8_mma:
            assert "F2FP.F16.E4M3.UNPACK_B" in sm90[name], name


def test_fp8_conversions_read_the_upper_half_in_place_for_both_targets(mma, sass):
    """Half of the fp8 conversions take bytes 2-3 of a register (f8_hi). They read that upper half in place
    (F2FP ... R.H1) for sm_120a and for sm_90a alike, with no 16-bit shift before them: for sm_90a (the H200 the
    benchmarks run on) a shift used to come before each such conversion, an instruction SM120's code does not
    have, so the proxy's fp8 loops were longer than the card's."""
    import re

    import torch

    fp8 = [
        name
        for names in mma.ENTRY_NAMES.values()
        for (kv_dtype, _, _), name in names.items()
        if kv_dtype == torch.float8_e4m3fn
    ]
    assert len(fp8) == 12
    for arch in ("sm_120a", "sm_90a"):
        for name in fp8:
            code = sass[arch][name]
            assert not re.search(r"SHF\.R\.U32\.HI R\d+, RZ, 0x10, R\d+", code), (arch, name)
            assert re.search(r"F2FP\.F16\.E4M3\.UNPACK_B R\d+, R\d+(\.reuse)?\.H1", code), (arch, name)


def test_the_8_row_decode_body_is_in_the_fused16_exact_fp8_and_bf16_entry_points_only(mma, sass):
    """The transposed body for decode programs of 8 query rows or fewer (transposed_body with one block of 8
    columns: tokens as the m16 rows of the products, the probabilities moved into the B operand by movmatrix,
    two movmatrix a tile) is compiled into the 16-row one-launch entry points with fp8 KV on the exact path and
    with bf16 KV, for both targets, and into no other; DECODE8=0 leaves it out of the fp8 ones, which then hold the
    16-row body alone (its value products m16n8k8), and leaves the bf16 ones as they were. Which programs take it
    is decided at run time by their rows and the call's draft tail (the device benchmarks check its numerics
    against the float32 reference, docs/benchmarks.md)."""

    exact_fp8, bf16 = _exact_fp8_fused16(mma), _bf16_fused16(mma)
    assert len(exact_fp8) == 2 and len(bf16) == 2
    for arch in ("sm_120a", "sm_90a"):
        for name, code in sass[arch].items():
            # two a tile for each instance: one block and two blocks (DECODE16 for fp8, DECODE16_BF16 for bf16)
            assert code.count("MOVM") == (6 if name in exact_fp8 or name in bf16 else 0), (arch, name)
    without = _sass(mma, "sm_120a", ("DECODE8=0",))
    for name in exact_fp8:
        assert "MOVM" not in without[name]
        # the 16-row body's value products are m16n8k8; the build with the 8-row body holds both kinds
        assert "HMMA.1688.F32" in without[name] and "HMMA.16816.F32" in sass["sm_120a"][name]
    for name in bf16:
        assert without[name] == sass["sm_120a"][name], name


def test_the_two_block_transposed_body_is_the_default_for_fp8_and_bf16(mma, builds, sass):
    """DECODE16 and DECODE16_BF16 (default 1 since they were timed on a device, docs/benchmarks.md) give the fp8 and
    the bf16 decode programs of 9 to 16 query rows whose request's splits are short (DECODE16_MAX_SPLIT and
    DECODE16_BF16_MAX_SPLIT tokens) the transposed body with two blocks of 8 columns: the exact fp8 and the bf16
    16-row entry points hold that instance (4 more movmatrix: two a block) beside the one-block body and the 16-row
    body (m16n8k8 values, for verify and longer splits), within 255 registers and no local memory. DECODE16=0 leaves
    it out of the fp8 ones and DECODE16_BF16=0 out of the bf16 ones; each flag leaves every other entry point's SASS
    as the default build's."""

    exact_fp8, bf16 = _exact_fp8_fused16(mma), _bf16_fused16(mma)
    usage = _usage(builds["sm_120a"])
    for name in exact_fp8 | bf16:
        assert "HMMA.1688.F32" in sass["sm_120a"][name], name
        assert usage[name].registers <= 255 and usage[name].local == 0, (name, usage[name])
    for defines, changed, movm in ((("DECODE16=0",), exact_fp8, 2), (("DECODE16_BF16=0",), bf16, 2)):
        cubin = mma.compile_cubin("sm_120a", defines=defines)
        code, flag_usage = _sass_of(cubin), _usage(cubin)
        assert set(code) == set(sass["sm_120a"])
        for name, text in code.items():
            if name in changed:
                assert text.count("MOVM") == movm, (defines, name)
                assert "HMMA.1688.F32" in text, (defines, name)
                assert flag_usage[name].local == 0, (defines, name)
            else:
                assert text == sass["sm_120a"][name], (defines, name)


def test_the_bf16_transposed_body_is_the_default_and_decode8_bf16_0_leaves_it_out(mma, builds, sass):
    """DECODE8_BF16 (default 1 since it was timed on a device, docs/benchmarks.md) builds the transposed body for
    bf16 KV into the 16-row one-launch bf16 entry points: keys and values straight from the tile by ldmatrix (no
    conversion), bf16 products, two movmatrix a tile, beside the 16-row body (m16n8k8 values, for verify), within
    255 registers and no local memory. DECODE8_BF16=0 leaves it out of them, and every other entry point, the fp8
    ones included, compiles to the same SASS as the default build."""
    bf16 = _bf16_fused16(mma)
    usage = _usage(builds["sm_120a"])
    for name in bf16:
        text = sass["sm_120a"][name]
        assert text.count("MOVM") == 6, name  # one block and two blocks (DECODE16_BF16), two a tile each
        assert "HMMA.1688.F32.BF16" in text and "F2FP.F16.E4M3" not in text, name
        assert usage[name].registers <= 255 and usage[name].local == 0, (name, usage[name])
    for name, text in _sass(mma, "sm_120a", ("DECODE8_BF16=0",)).items():
        if name in bf16:
            assert "MOVM" not in text and "HMMA.1688.F32.BF16" in text, name
        else:
            assert text == sass["sm_120a"][name], name


def test_timeline_build_compiles_with_the_same_entry_points(mma):
    """The build `bench_mla.py --timeline` loads (SM120_TIMELINE: clock reads into a device array): it compiles
    for sm_120a with every entry point of the launchers' build, within 255 registers, and holds the array the
    benchmark reads back by name; the launchers' build has no such array."""

    timed = mma.compile_cubin("sm_120a", defines=("SM120_TIMELINE",))
    usage = _usage(timed)
    assert set(usage) == {name for names in mma.ENTRY_NAMES.values() for name in names.values()}
    assert all(res.registers <= 255 for res in usage.values())
    assert b"sm120_timeline" in timed
    assert b"sm120_timeline" not in mma.compile_cubin("sm_120a")


def _bench_mla():
    """scripts/bench_mla.py, loaded from its file (no GPU here: it imports, it does not run)."""
    spec = importlib.util.spec_from_file_location("bench_mla", REPO_ROOT / "scripts" / "bench_mla.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("arch", ["sm_120a", "sm_121a", "sm_90a"])
def test_bench_instruction_peak_loops_compile_for_each_form(arch):
    """The register-only mma.sync loops bench_mla.py times for the instruction peaks (bf16 and f16 m16n8k16,
    e4m3 m16n8k32) compile with NVRTC for the SM120 targets and for the H200 the benchmarks run on, one entry
    point a form, and each entry point holds its mma.sync form."""
    from sm120_attention import sm120_mla_nvrtc as nvrtc

    bench = _bench_mla()
    cubin = nvrtc.compile_cubin(bench.MMA_PEAK_SOURCE, "mma_peak.cu", arch, ("--std=c++17",))
    usage = _usage(cubin)
    assert set(usage) == {f"mma_peak_{kind}" for kind in bench.MMA_PEAK_SHAPES}
    assert bench.MMA_PEAK_SHAPES["e4m3"] == 2 * bench.MMA_PEAK_SHAPES["bf16"]  # k32 against k16
    for form in (
        "f32.bf16.bf16.f32",
        "f32.f16.f16.f32",
        "m16n8k32.row.col.f32.e4m3.e4m3.f32",
        "m16n8k8.row.col.f32.f16",
    ):
        assert form in bench.MMA_PEAK_SOURCE
    # the fp8 unpack loops: one entry point a way, the conversion instruction in the cvt form only, movmatrix (the
    # values taken from the keys' fragments) in its own
    cubin = nvrtc.compile_cubin(bench.UNPACK_RATE_SOURCE, "unpack_rate.cu", arch, ("--std=c++17",))
    assert set(_usage(cubin)) == {"unpack_cvt", "unpack_int", "unpack_both", "unpack_movm"}
    assert "cvt.rn.f16x2.e4m3x2" in bench.UNPACK_RATE_SOURCE
    sass = _sass_of(cubin)
    assert "MOVM" in sass["unpack_movm"] and "MOVM" not in sass["unpack_cvt"] + sass["unpack_both"]


def test_bench_fp8_cases_are_the_issue_set():
    """--cases fp8: 8-head decode at 32k/131k/185k in bf16 and fp8, fp8 decode at every length at batch 1 and 4,
    8 drafts x 8 heads verify in both dtypes and 8 x 16 fp8 verify; --cases all holds every one of them."""
    bench = _bench_mla()
    decode, verify = set(bench.decode_cases("fp8")), set(bench.verify_cases("fp8"))
    for prefix in (32768, 131072, 185000):
        for kvd in ("bf16", "fp8"):
            assert (prefix, 1, 8, kvd, 1) in decode
            assert (prefix, 8, 8, kvd, "tree", 1) in verify
        assert (prefix, 8, 16, "fp8", "tree", 1) in verify
    for prefix in (8192, 32768, 131072, 185000):
        assert {(prefix, 1, 16, "fp8", 1), (prefix, 4, 16, "fp8", 1)} <= decode
    assert decode <= set(bench.decode_cases("all")) and verify <= set(bench.verify_cases("all"))
    assert len(bench.decode_cases("all")) == len(set(bench.decode_cases("all")))  # no case timed twice
    # --cases fp8-decode: the same decode cases without the verify ones; the timeline holds fp8 decode at 185k
    assert bench.decode_cases("fp8-decode") == bench.decode_cases("fp8") and not bench.verify_cases("fp8-decode")
    assert {("decode", 185000, 1, 8, "fp8", True), ("decode", 185000, 4, 16, "fp8", True)} <= set(bench.TIMELINE_CASES)


def test_values_from_keys_is_a_flag_of_the_transposed_body_only(mma, sass):
    """VALUES_FROM_KEYS=1 (default 0: timed on a device, no faster): the transposed body takes its values' A operand
    from the keys' f16 fragments of its latent dims, four movmatrix a fragment, instead of reading the tile again
    (ldmatrix.trans) and converting it a second time. With DECODE16 (the default) both instances have it: 32
    movmatrix more in each loop (8 fragments a warp and tile), the exact fp8 16-row entry points only, within 255
    registers and no local memory; every other entry point compiles to the same SASS as the default build."""

    exact_fp8 = _exact_fp8_fused16(mma)
    cubin = mma.compile_cubin("sm_120a", defines=("VALUES_FROM_KEYS=1",))
    usage = _usage(cubin)
    code = _sass_of(cubin)
    for name, text in code.items():
        if name in exact_fp8:
            assert text.count("MOVM") == 2 + 4 + 2 * 32, name
            assert usage[name].registers <= 255 and usage[name].local == 0, (name, usage[name])
        else:
            assert text == sass["sm_120a"][name], name


def test_the_tunable_flags_are_the_sources_and_build_at_both_ends_of_their_ranges(mma):
    """Each flag SGLANG_SM120_MLA_DEFINES may set (TUNABLES) is one the source reads with a default of its own
    (#ifndef NAME / #define NAME), and the build holds together at both ends of every range at once: every entry
    point, within 255 registers and no local memory (NVRTC for sm_120a, no GPU needed)."""
    import re

    source = mma.read_source()
    for name, (low, high) in mma.TUNABLES.items():
        default = re.search(rf"#ifndef {name}\n#define {name} (\w+)\n", source)
        assert default is not None, name
        if default.group(1).isdigit():
            assert low <= int(default.group(1)) <= high, name
    for end in (0, 1):
        defines = tuple(f"{name}={bounds[end]}" for name, bounds in mma.TUNABLES.items())
        assert mma.parse_tunables(",".join(defines)) == defines
        usage = _usage(mma.compile_cubin("sm_120a", defines=defines))
        assert set(usage) == {name for names in mma.ENTRY_NAMES.values() for name in names.values()}
        for name, res in usage.items():
            assert res.registers <= 255 and res.local == 0, (end, name, res)


@pytest.mark.parametrize(
    "value, message",
    [
        ("DECODE16_MAX_SPLIT", "DECODE16_MAX_SPLIT takes a whole number from 0 to 16777216"),
        ("DECODE16_MAX_SPLIT=2k", "'DECODE16_MAX_SPLIT=2k'"),
        ("DECODE16=2", "DECODE16 takes a whole number from 0 to 1"),
        ("FP8_UNPACK16=-1", "FP8_UNPACK16 takes a whole number from 0 to 3"),
        ("DECODE16=1,SM120_TIMELINE=1", "'SM120_TIMELINE' is not a flag the kernels may take from here"),
        ("THREADS=128", "'THREADS' is not a flag"),
    ],
)
def test_the_defines_setting_refuses_what_it_cannot_take_and_names_it(mma, monkeypatch, value, message):
    """SGLANG_SM120_MLA_DEFINES takes only the flags of TUNABLES with whole numbers in their ranges; anything else
    is named in the problem (the kernels are then built as shipped, never with part of the value)."""
    monkeypatch.setenv(mma.DEFINES_ENV, value)
    defines, problem = mma.defines_setting()
    assert defines == ()
    assert problem.startswith("SGLANG_SM120_MLA_DEFINES is ignored, the kernels are built as shipped: ")
    assert message in problem


def test_the_defines_setting_takes_known_flags_with_a_later_value_in_place(mma, monkeypatch):
    from sm120_attention import sm120_mla_nvrtc
    from sm120kit.sglang import mla_kernels

    # sm120kit's names of the switches (the audit keys its cache on the flags) are the kernels' own
    assert mla_kernels.DEFINES_ENV == mma.DEFINES_ENV == "SGLANG_SM120_MLA_DEFINES"
    assert mla_kernels.FP8_MMA_ENV == mma.FP8_MMA_ENV and mla_kernels.CACHE_DIR_ENV == sm120_mla_nvrtc.CACHE_ENV
    monkeypatch.delenv(mma.DEFINES_ENV, raising=False)
    assert mma.defines_setting() == ((), None)
    monkeypatch.setenv(mma.DEFINES_ENV, " DECODE16_MAX_SPLIT = 02048 ,, FP8_UNPACK16=3, DECODE16_MAX_SPLIT=1024")
    assert mma.defines_setting() == (("DECODE16_MAX_SPLIT=1024", "FP8_UNPACK16=3"), None)


def test_the_kernels_are_built_at_first_use_with_the_defines_setting(mma, monkeypatch, caplog):
    """kernel() builds with SGLANG_SM120_MLA_DEFINES's flags, and as shipped (with a warning naming the value) where
    the value cannot be taken. No GPU here: the device's capability, its context and the loading of the cubin into
    it are stand-ins (the test records the cubin instead); the compile is NVRTC's, for sm_120a."""
    import contextlib
    import logging

    import torch

    built = []
    monkeypatch.setattr(mma, "_context", lambda index: None)
    monkeypatch.setattr(mma, "_arch", lambda index: "sm_120a")
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(mma, "_Kernel", lambda cubin: built.append(cubin) or "loaded")
    device = torch.device("cuda", 7)
    for value, defines in (("DECODE16_MAX_SPLIT=2048", ("DECODE16_MAX_SPLIT=2048",)), ("DECODE16=2", ())):
        monkeypatch.setattr(mma, "_KERNELS", {})
        monkeypatch.setenv(mma.DEFINES_ENV, value)
        with caplog.at_level(logging.WARNING, logger=mma.__name__):
            caplog.clear()
            assert mma.kernel(device) == "loaded"
            assert mma.kernel(device) == "loaded"  # built once
        assert built.pop() == mma.compile_cubin("sm_120a", defines=defines) and not built
        warned = [r.getMessage() for r in caplog.records]
        assert warned == ([] if defines else [mma.defines_setting()[1]]), warned
    assert mma.compile_cubin("sm_120a", defines=("DECODE16_MAX_SPLIT=2048",)) != mma.compile_cubin("sm_120a")


def test_the_scripts_merge_their_defines_with_the_later_value_of_a_name(mma):
    """bench_mla.py and sanitize_mla.py --defines build the kernels with those -D flags, and each bench
    --timeline-also build takes them with its own on top: a name's later value replaces the earlier one in place,
    new names follow, blanks and spaces are dropped."""
    base = "DECODE16=1, VALUES_FROM_KEYS=1"
    assert mma.merge_defines(base) == ("DECODE16=1", "VALUES_FROM_KEYS=1")
    assert mma.merge_defines(base, "DECODE16=0") == ("DECODE16=0", "VALUES_FROM_KEYS=1")
    assert mma.merge_defines(base, "MERGE_EARLY=0,,DECODE16") == ("DECODE16", "VALUES_FROM_KEYS=1", "MERGE_EARLY=0")
    assert mma.merge_defines("") == () and mma.merge_defines("", " , ") == ()
    # Both scripts take the kernels' function, not a copy of their own.
    for script in ("bench_mla.py", "sanitize_mla.py"):
        text = (REPO_ROOT / "scripts" / script).read_text()
        assert "cuda_prefix.merge_defines(" in text and "def merge_defines" not in text, script


def test_the_bench_names_the_gpu_its_rows_were_measured_on():
    """Rows measured in SM120 mode say on which card: the H100 and H200 by their model, any other GPU by its whole
    name (a run on an H100 once came out labelled H200)."""
    bench = _bench_mla()
    assert bench.proxy_label("NVIDIA H100 80GB HBM3") == "H100 in SM120 mode, not an SM120 card"
    assert bench.proxy_label("NVIDIA H200") == "H200 in SM120 mode, not an SM120 card"
    assert bench.proxy_label("NVIDIA A100-SXM4-80GB") == "NVIDIA A100-SXM4-80GB in SM120 mode, not an SM120 card"
    if not bench.SM120_MODE:  # no GPU (or a 12.x card): the rows carry the device's own name
        assert bench.PROXY == ""


def test_the_bench_rows_name_the_route_and_the_split_length_it_took():
    """Each verify and decode row of bench_mla.py names the route the launcher took for its call (seen through
    ``routes.choose``), its splits and the prefix tokens a split of the longest request walks, on which the CUDA
    kernels' decode body depends (``DECODE16_MAX_SPLIT``). The launcher is stood in for by a call that asks the route
    as the launcher does, as this machine has no GPU: 16-head fp8 decode at 185k, batch 1, on 132 SMs takes the 16-row
    launch with 132 splits of 1408 tokens, and 128-head bf16 verify of 8 drafts the 64-row programs."""
    from types import SimpleNamespace

    from test_mla_route import mla_call

    bench = _bench_mla()
    routes = bench.routes
    mla = SimpleNamespace(cuda_prefix=SimpleNamespace(BLOCK_N=32))
    decode = mla_call("decode", 1, 16, "fp8", 1)
    fields = bench.route_fields(mla, {"prefix_lens": [185000]}, lambda: routes.choose(decode))
    assert fields == {"path": routes.CUDA16_ONE_LAUNCH, "splits": 132, "split_tokens": 1408}
    verify = mla_call("verify", 8, 128, "bf16", 1)
    route = routes.choose(verify)
    fields = bench.route_fields(mla, {"prefix_lens": [32768, 185000]}, lambda: routes.choose(verify))
    assert fields["path"] == route.path and route.path.startswith("cuda64") and fields["splits"] == route.splits
    assert fields["split_tokens"] == routes.split_length(185000, route.splits, route.min_chunk, 32)
    triton = mla_call("decode", 1, 16, "bf16", 1)
    fields = bench.route_fields(mla, {"prefix_lens": [8192]}, lambda: routes.choose(triton))
    assert fields == {"path": routes.TRITON, "splits": 256, "split_tokens": 64}


def test_the_timeline_gives_the_barrier_arrivals_from_entry_time_and_clocks():
    """bench_mla.py's timeline places each program's arrival at the grid barrier at its entry (global timer, ns)
    plus its SM clocks since the body's start: three programs that arrive at 11, 12.5 and 13 us (one entering
    0.5 us late) give 0.5 us from the median to the last and 2 us from the first; a row without the barrier's
    clock (a program that recorded none) is left out, and no such clock at all gives no figure."""
    bench = _bench_mla()
    mhz = 1800.0

    def row(entry_ns, body_clock, barrier_clock):
        return [entry_ns, body_clock, 0, 0, 0, barrier_clock, 0, 0, 0, entry_ns + 20_000]

    rows = [row(1000, 500, 500 + 18_000), row(1500, 1, 1 + 19_800), row(1000, 7, 7 + 21_600), row(900, 10, 0)]
    assert bench.barrier_arrivals(rows, mhz) == [0.5, 2.0]
    assert bench.barrier_arrivals([row(1000, 5, 0)], mhz) is None


def test_the_16_row_fp8_stage_count_is_a_checked_flag(mma):
    """STAGES16_FP8 (stages of the fp8 tile in the 16-row programs; four unless a -D flag says otherwise, the
    benchmark's --timeline-also compares three): three compiles for sm_120a within 255 registers, five is refused."""

    usage = _usage(mma.compile_cubin("sm_120a", defines=("STAGES16_FP8=3",)))
    fused16_fp8 = [name for name in mma.FUSED16_NAMES.values() if "_fp8" in name]
    assert len(fused16_fp8) == 4 and all(usage[name].registers <= 255 for name in fused16_fp8)
    with pytest.raises(mma.CompileError, match="16-row fp8 programs keep 2, 3 or 4 stages"):
        mma.compile_cubin("sm_120a", defines=("STAGES16_FP8=5",))


def test_the_16_row_fp8_pair_barriers_are_a_flag_and_the_probes_touch_only_the_timeline_build(mma):
    """PAIRS16_FP8 (each warp pair of a four-stage 16-row fp8 program copies and waits for its own tokens; 0: the
    block's barrier every tile) compiles both ways for sm_120a within 255 registers. The benchmark's probe flags
    (SM120_PROBE_NO_KV_LOADS, SM120_PROBE_NO_MATH: the loop without its later copies or without its math) appear
    only under SM120_TIMELINE, so the launchers' build cannot take them."""
    import re

    fused16_fp8 = [name for name in mma.FUSED16_NAMES.values() if "_fp8" in name]
    usage = _usage(mma.compile_cubin("sm_120a", defines=("PAIRS16_FP8=0",)))
    assert len(fused16_fp8) == 4 and all(usage[name].registers <= 255 for name in fused16_fp8)
    source = Path(mma.SOURCE_PATH).read_text()
    assert "#define PAIRS16_FP8 1" in source
    for probe in ("SM120_PROBE_NO_KV_LOADS", "SM120_PROBE_NO_MATH", "SM120_PROBE_NO_SCORES", "SM120_PROBE_NO_VALUES"):
        uses = [line.strip() for line in source.splitlines() if probe in line]
        assert uses and all(re.search(r"defined\(SM120_TIMELINE\) && defined\(" + probe + r"\)", u) for u in uses), uses


def _c_expression(source, function):
    """The expression a one-line CUDA function of the source returns, as Python (hex literals lose their u)."""
    import re

    body = re.search(r"u32 " + function + r"\(u32 w\) \{\s*return ([^;]{1,200});", source)
    assert body, function
    expression = re.sub(r"(0x[0-9a-fA-F]{1,8})u", r"\1", body.group(1))
    assert re.fullmatch(r"[\sw0-9a-fA-Fx&|()<>+]{1,200}", expression), expression  # bits and shifts of w alone
    return expression


def test_the_integer_fp8_unpack_is_exact_at_two_to_the_minus_8(mma):
    """The 16-row programs' integer e4m3 -> f16 unpack (FP8_UNPACK16 1-3), evaluated as the source writes it, gives
    every finite e4m3 byte, normal and subnormal, in both byte positions of a pair, as its value times 2^-8 exactly
    (torch's float8_e4m3fn is the reference); the two NaN bytes become +-480, which the source's comment names."""
    import torch

    source = Path(mma.SOURCE_PATH).read_text()
    odd = _c_expression(source, "f8s_odd")
    assert "u32 f8s_even(u32 w) {\n    return f8s_odd(w << 8);" in source

    def unpack_odd(w):
        return eval(odd, {"w": w}) & 0xFFFFFFFF

    def unpack_even(w):
        return unpack_odd((w << 8) & 0xFFFFFFFF)

    def halves(bits):
        pair = torch.tensor([bits & 0xFFFF, bits >> 16], dtype=torch.int32).to(torch.int16)
        return pair.view(torch.float16).float().tolist()

    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    for lo in range(256):
        hi = (lo * 37 + 11) % 256  # every byte in each position, against another byte
        w = lo | (hi << 8) | (hi << 16) | (lo << 24)  # bytes lo, hi, hi, lo
        for got, byte in zip(halves(unpack_even(w)) + halves(unpack_odd(w)), (lo, hi, hi, lo)):
            want = values[byte].item()
            if byte & 0x7F == 0x7F:
                assert got * 256 == (480.0 if byte < 128 else -480.0)
            else:
                assert got * 256 == want, (byte, got, want)


def test_the_16_row_fp8_unpack_and_store_flags_compile_and_are_checked(mma):
    """FP8_UNPACK16 (0: the conversion instruction, 1-3: integer unpack of keys and/or values) and STORE16_LIVE
    (the end's sums skip rows 8-15 a program does not hold) compile for sm_120a within 255 registers at their other
    values, and an unpack value out of range is refused with its message."""

    fused16 = list(mma.FUSED16_NAMES.values())
    source = Path(mma.SOURCE_PATH).read_text()
    for default in ("#define FP8_UNPACK16 0", "#define STORE16_LIVE 1"):
        assert default in source
    for defines in (("FP8_UNPACK16=1",), ("FP8_UNPACK16=2", "STORE16_LIVE=0")):
        usage = _usage(mma.compile_cubin("sm_120a", defines=defines))
        assert all(usage[name].registers <= 255 for name in fused16), defines
    with pytest.raises(mma.CompileError, match="FP8_UNPACK16 is 0, 1, 2 or 3"):
        mma.compile_cubin("sm_120a", defines=("FP8_UNPACK16=4",))


GATHER_CHECK = """
import importlib.util, sys, torch, triton
spec = importlib.util.spec_from_file_location("bench_mla", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
for row_bytes, dtype in ((576, torch.float8_e4m3fn), (1152, torch.bfloat16)):
    pool = torch.randint(-2**20, 2**20, (300, row_bytes // 4), dtype=torch.int32)
    idx = torch.randperm(300)[:100].to(torch.int64)
    out = torch.empty(triton.cdiv(100, 32), dtype=torch.int32)
    bench._gather_read_kernel[(out.numel(),)](pool, idx, out, 100, pool.stride(0), ROW_W=row_bytes // 4,
                                              BLOCK_W=triton.next_power_of_2(row_bytes // 4), BR=32)
    print(int(out.long().sum()) - int(pool[idx].long().sum()))
"""


def test_bench_gather_roofline_reads_exactly_the_rows_of_the_slots():
    """bench_mla.py --gather-roofline times a Triton kernel that loads the KV rows the slots name and sums them
    (Triton's interpreter here, no GPU): its sums equal the rows' own, for fp8 (576-byte) and bf16 (1152-byte) rows,
    so the roofline counts the bytes it reads and no other."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [sys.executable, "-c", GATHER_CHECK, str(REPO_ROOT / "scripts" / "bench_mla.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    diffs = [int(line) for line in out.stdout.split()]
    assert len(diffs) == 2 and all(d % 2**32 == 0 for d in diffs), diffs  # int32 sums wrap; equal modulo 2**32


SPLIT_CHECK = r"""
import torch
import triton
import triton.language as tl

from sm120_attention import sm120_mla as mla
from sm120_attention import sm120_mla_route as routes


@triton.jit
def cut(out, kv_len, num_splits, BLOCK_N: tl.constexpr, MIN_SPLIT: tl.constexpr):
    start, end = mla._split_range(kv_len, 1, num_splits, BLOCK_N, MIN_SPLIT)
    tl.store(out, start)


for kv_len, splits, fewest in ((185000, 132, 64), (131072, 33, 256), (8192, 132, 64), (1000, 4, 0), (4096, 4, 0)):
    out = torch.zeros(1, dtype=torch.int32)
    cut[(1,)](out, kv_len, splits, BLOCK_N=32, MIN_SPLIT=fewest)
    print(int(out[0]), routes.split_length(kv_len, splits, fewest, 32))
"""


def test_split_length_agrees_with_the_triton_kernels_split_range():
    """``sm120_mla_route.split_length`` (the tokens a split walks, which bench_mla.py's rows report) is the cut of the
    Triton kernels' ``_split_range``, run here in Triton's interpreter (no GPU): the second split starts where the
    first one's length ends, for the documented 185k and 131k cases and cuts raised to the fewest tokens."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT / "kernels")}
    out = subprocess.run([sys.executable, "-c", SPLIT_CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    pairs = [tuple(int(x) for x in line.split()) for line in out.stdout.splitlines()]
    assert pairs == [(1408, 1408), (4000, 4000), (64, 64), (256, 256), (1024, 1024)], pairs


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SROW": 1184}, "shared memory layout: the tiles differ"),  # a row padded by 32: TILE_BYTES no longer agrees
        ({"SROW": 1160}, "a KV row does not fit its row, or breaks the bank spread"),
        ({"SMEM_BYTES_FP8": 92416 + 16}, "shared memory layout differs from the launcher's"),
        ({"SMEM_LIMIT": 65536}, "over SM120's 101376 bytes a block"),
        ({"BLOCK_N": 64}, "written for MLA 576/512"),
    ],
)
def test_mma_source_refuses_figures_that_differ_from_its_layout(mma, change, message):
    """The source checks the figures it is handed (-D flags from FIGURES) against its own layout and the limit:
    any one changed alone, it does not compile."""
    assert set(change) <= set(mma.FIGURES)
    with pytest.raises(mma.CompileError, match=message):
        mma.compile_cubin("sm_120a", figures={**mma.FIGURES, **change})


def test_mma_prefix_kernel_takes_only_bf16_mla(mma):
    """Which calls the CUDA kernel takes (CPU tensors here: the checks on dtypes, dims and strides are the
    same; on the CPU `serves` is False, so these launches take the Triton kernel)."""
    import torch

    def case(dtype=torch.bfloat16, lk=576, kv_heads=1, idx=torch.int64, ptr=torch.int32):
        q = torch.empty(8, 16, lk, dtype=dtype)
        kv = torch.empty(64, kv_heads, lk, dtype=dtype)
        return (q, kv, torch.zeros(2, dtype=ptr), torch.zeros(2, dtype=ptr), torch.zeros(64, dtype=idx), kv_heads)

    assert mma.fits(*case())
    assert mma.fits(*case(idx=torch.int32))
    q, kv, *rest = case()
    assert mma.fits(q, kv.to(torch.float8_e4m3fn), *rest)
    assert not mma.fits(q, kv.to(torch.float8_e5m2), *rest)
    assert not mma.fits(q.to(torch.float8_e4m3fn), kv.to(torch.float8_e4m3fn), *rest)
    assert not mma.serves(*case())  # not a CUDA tensor
    for bad in (
        case(dtype=torch.float16),
        case(lk=512),
        case(kv_heads=2),
        case(idx=torch.int16),
        case(ptr=torch.int64),
    ):
        assert not mma.fits(*bad)
    q, kv, *rest = case()
    assert not mma.fits(q[:, :, :575], kv, *rest)  # no 576-dim rows
    odd = torch.empty(64 * 577, dtype=torch.bfloat16).as_strided((63, 1, 576), (577, 577, 1))
    assert not mma.fits(q, odd, *rest)  # a row stride that breaks the 16-byte copies
    # query rows 4-byte aligned but not 16 (heads 580 values apart): the 16-row programs copy them in 16 bytes
    q_odd = torch.empty(8 * 16 * 580, dtype=torch.bfloat16).as_strided((8, 16, 576), (16 * 580, 580, 1))
    assert not mma.fits(q_odd, kv, *rest)
    q_pad = torch.empty(8 * 16 * 584, dtype=torch.bfloat16).as_strided((8, 16, 576), (16 * 584, 584, 1))
    assert mma.fits(q_pad, kv, *rest)  # padded to 16-byte rows


def test_one_launch_verify_takes_only_what_its_kernel_reads(mma):
    """Which draft tails and outputs the one-launch verify (fused_pass) takes. CPU tensors: these checks
    look only at dtypes, shapes, strides and alignment, which this machine can hold without a GPU."""
    import torch

    def case(kdt=torch.bfloat16, heads_kv=1, lk=576, lv=512, odt=torch.bfloat16, mask=torch.int8, mptr=torch.int64):
        k_ext = torch.empty(8, heads_kv, lk, dtype=kdt)
        v_ext = torch.empty(8, heads_kv, lv, dtype=kdt)
        o = torch.empty(8, 16, lv, dtype=odt)
        return (
            torch.empty(8, 16, 576, dtype=torch.bfloat16),
            o,
            k_ext,
            v_ext,
            torch.ones(8, 40, dtype=mask),
            torch.zeros(2, dtype=mptr),
        )

    assert mma.fused_fits(*case())
    assert mma.fused_fits(*case(mask=torch.bool))
    q, o, k_ext, _, m, mp = case()
    assert mma.fused_fits(q, o, k_ext, k_ext[:, :, :512], m, mp)  # V a view of K's first 512 dims
    for bad in (
        case(kdt=torch.float16),
        case(kdt=torch.float8_e4m3fn),
        case(heads_kv=2),
        case(lk=512),
        case(lv=256),
        case(odt=torch.float16),
        case(mask=torch.int32),
        case(mptr=torch.int32),
    ):
        assert not mma.fused_fits(*bad)
    odd = torch.empty(8 * 577, dtype=torch.bfloat16).as_strided((8, 1, 576), (577, 577, 1))
    assert not mma.fused_fits(q, o, odd, odd[:, :, :512], m, mp)  # rows that break the 16-byte copies
    assert not mma.fused_fits(q, o[:, :, :511], k_ext, k_ext[:, :, :512], m, mp)
    assert not mma.fused_fits(q, o, k_ext, k_ext[:, :, :512], m[:, ::2], mp)  # a mask with gaps
    assert mma.fused_capacity(q, k_ext, torch.zeros(1, dtype=torch.int32)) == 0  # no GPU: not run


def test_mma_path_is_off_by_env(mma, monkeypatch):
    monkeypatch.setenv("SGLANG_SM120_MLA_MMA", "0")
    assert not mma._env_enabled()
    monkeypatch.setenv("SGLANG_SM120_MLA_MMA", "1")
    assert mma._env_enabled()


def test_a_build_is_loaded_only_once_the_device_has_a_context(mma, monkeypatch):
    """The driver loads a module into the current CUDA context; a script that builds the kernels (install, the
    scripts' --defines) before any tensor lives on the device has none, and cuModuleLoadData failed with 201 on the
    device. Both loaders make the device's context current first. No GPU here: the CUDA calls are stood in for by
    recorders (the compile is real NVRTC only in the other tests)."""
    import contextlib

    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(mma, "_arch", lambda index: "sm_120a")
    monkeypatch.setattr(mma, "_context", lambda index: calls.append(("context", index)))
    monkeypatch.setattr(mma, "compile_cubin", lambda arch, defines=(): calls.append(("compile", defines)) or b"")
    monkeypatch.setattr(mma, "_Kernel", lambda cubin: calls.append(("load",)) or "kernel")
    monkeypatch.setattr(mma, "_KERNELS", {})
    assert mma.install(torch.device("cuda", 3), ("DECODE16=0",)) == "kernel"
    assert calls == [("context", 3), ("compile", ("DECODE16=0",)), ("load",)]
    calls.clear()
    assert mma.kernel(torch.device("cuda", 5)) == "kernel"
    assert calls == [("context", 5), ("compile", ()), ("load",)]
