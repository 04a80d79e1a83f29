"""`sm120kit audit`: the static shared-memory audit on real SGLang releases from PyPI.

No GPU here: the SM120 device is faked (sm120kit.hardware.fake_device stands in for the RTX PRO 6000 / GB10
this machine lacks). SGLang's own launchers and Triton's compiler run for real, in fresh probe
interpreters, for target sm_120 / sm_121. The matrices below are reduced to the shapes each test needs;
the full matrix runs in scripts/bench_audit.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from sm120kit.audit import shapes  # noqa: E402
from sm120kit.audit import smem as smem_audit  # noqa: E402
from sm120kit.cli import main as cli_main  # noqa: E402
from sm120kit.errors import UsageError  # noqa: E402
from sm120kit.hardware import cubin  # noqa: E402
from sm120kit.sglang import launchers, mla_kernels  # noqa: E402
from sm120kit.util.resources import patches_dir  # noqa: E402

LIMIT = 101376

MLA_EXTEND = """
[[attention]]
name = "mla-extend"
qk_head_dim = 576
v_head_dim = 512
num_heads = 16
num_kv_heads = 1
dtypes = ["bfloat16"]
launchers = ["extend"]
"""

VISION_256 = """
[[attention]]
name = "vision-256"
qk_head_dim = 256
num_heads = 16
num_kv_heads = 16
dtypes = ["bfloat16"]
launchers = ["prefill"]
"""

LIGHTNING = """
[[attention]]
name = "lightning-hd128"
qk_head_dim = 128
num_heads = 16
num_kv_heads = 16
dtypes = ["float32", "bfloat16"]
launchers = ["lightning"]
"""

SMALL_MOE = """
[[moe]]
name = "small-moe"
num_experts = 8
top_k = 2
hidden_size = 1024
intermediate_size = 512
quantizations = ["bf16", "fp8_block"]
tokens = [64]
"""


def _matrix(tmp_path: Path, text: str) -> shapes.ShapeMatrix:
    path = tmp_path / "matrix.toml"
    path.write_text(text)
    return shapes.load_matrix([path], include_default=False)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        cli_main(list(args))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


# -- the matrix (data) -----------------------------------------------------------------------------------


def test_packaged_matrix_covers_the_required_shapes():
    matrix = shapes.load_matrix()
    dims = {(m.qk_head_dim, m.v_head_dim) for m in matrix.attention}
    assert {(64, 64), (128, 128), (256, 256), (192, 128), (576, 512)} <= dims
    assert {1, 4, 8} <= {m.group for m in matrix.attention}
    assert {"bfloat16", "float16"} <= {d for m in matrix.attention for d in m.dtypes}
    assert any("fp8_e4m3" in m.kv_cache_dtypes for m in matrix.attention)
    moe = {m.name: m for m in matrix.moe}
    assert {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b"} <= set(moe)
    assert {"bf16", "fp8_block"} <= {q for m in matrix.moe for q in m.quantizations}
    cases = shapes.expand(matrix)
    assert {c.launcher for c in cases} == {
        "extend",
        "decode",
        "prefill",
        "moe",
        "tree-verify",
        "mla-decode",
        "ds-extend",
        "inkling-moe",
        "lightning",
    }
    prefill_dtypes = {(c.params["qk_head_dim"], c.params["dtype"]) for c in cases if c.launcher == "prefill"}
    assert {(128, "float32"), (256, "float32"), (256, "float16"), (128, "float16")} <= prefill_dtypes
    assert len({c.id for c in cases}) == len(cases)


def test_matrix_file_adds_and_replaces_entries(tmp_path):
    extra = tmp_path / "mine.toml"
    extra.write_text(
        VISION_256
        + """
[[moe]]
name = "mixtral-8x7b"
num_experts = 8
top_k = 2
hidden_size = 4096
intermediate_size = 14336
quantizations = ["bf16"]
"""
    )
    matrix = shapes.load_matrix([extra])
    assert "vision-256" in matrix.names()
    assert [m.quantizations for m in matrix.moe if m.name == "mixtral-8x7b"] == [("bf16",)]
    assert len(shapes.select(matrix, ["vision-256"]).attention) == 1
    with pytest.raises(UsageError, match="No matrix entry named nope"):
        shapes.select(matrix, ["nope"])


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '[[attention]]\nname = "x"\nnum_heads = 8\nnum_kv_heads = 8\nlaunchers = ["extend"]\n',
            "the field 'qk_head_dim' is missing",
        ),
        (
            '[[attention]]\nname = "x"\nqk_head_dim = 128\nnum_heads = 8\nnum_kv_heads = 3\nlaunchers = ["extend"]\n',
            "must be a multiple of num_kv_heads",
        ),
        (
            '[[attention]]\nname = "x"\nqk_head_dim = 128\nnum_heads = 8\nnum_kv_heads = 8\nlaunchers = ["fwd"]\n',
            "'launchers' holds 'fwd'",
        ),
        (
            '[[moe]]\nname = "m"\nnum_experts = 8\ntop_k = 2\nhidden_size = 64\nintermediate_size = 64\ncolour = 1\n',
            "unknown field",
        ),
        ("[[attention]\n", "is not valid TOML"),
    ],
)
def test_bad_matrix_names_file_entry_and_field(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as exc:
        shapes.load_matrix([path])
    assert str(path) in exc.value.message


def test_launcher_layout_per_release(release_dir):
    old = launchers.resolve_all(release_dir("0.5.8"))
    new = launchers.resolve_all(release_dir("0.5.23"))
    assert old["extend"].module == "sglang.srt.layers.attention.triton_ops.extend_attention"
    assert new["extend"].module == "sglang.kernels.ops.attention.extend_attention"
    assert old["moe"].module == "sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_kernels"
    assert new["moe"].module == "sglang.kernels.ops.moe.fused_moe_triton_kernels"
    assert new["moe"].helper_module == "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config"
    # The split-KV launchers exist only where the series' sm120-mla-attention patch added them.
    assert not new["tree-verify"].present and not new["mla-decode"].present
    assert all(r.files[0].is_file() for r in (*old.values(), *new.values()) if r.present)


def test_arch_names():
    assert smem_audit.check_arch("sm_121") == "12.1"
    assert smem_audit.check_arch("120") == "12.0"
    with pytest.raises(UsageError, match="no device to audit for capability 7.5"):
        smem_audit.check_arch("7.5")


def test_register_counts_from_cuobjdump():
    """Parses cuobjdump's resource usage of a real sm_120 cubin (the device is faked, the compile real)."""
    import torch
    import triton.language as tl  # noqa: F401
    from kernel_support import copy_kernel

    from sm120kit.hardware.fake_device import PRESETS, faked_triton_target

    if cubin.find_cuobjdump() is None:
        pytest.skip("no cuobjdump (Triton's wheel normally bundles one)")
    with faked_triton_target(PRESETS["12.0"]) as recorder:
        x = torch.empty(4096, device="meta")
        copy_kernel[(4,)](x, x, 4096, BLOCK=1024)
    usage = cubin.resource_usage(recorder.kernels[0].cubin)
    assert set(usage) == {"copy_kernel"} and 0 < usage["copy_kernel"].registers <= 255
    assert cubin.parse_resource_usage(" Function k:\n  REG:40 STACK:8 SHARED:0 LOCAL:16\n")["k"].local == 16


# -- real releases ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_unpatched_058_mla_extend_is_over_the_limit(release_dir, tmp_path, audit_cache):
    """0.5.8 predates the SM120 branch of the extend block sizes: the MLA extend kernel takes Hopper's
    32x64 tiles and needs 106496 B on sm_120 and sm_121."""
    cache = audit_cache(tmp_path / "cache")
    result = smem_audit.audit_tree(
        release_dir("0.5.8"),
        archs=("12.0", "12.1"),
        matrix=_matrix(tmp_path, MLA_EXTEND),
        cache=cache,
        jobs=2,
        version="0.5.8",
    )
    assert not result.ok and not result.errors
    assert [(c.arch, k.name, k.shared, k.block["BLOCK_M"], k.block["BLOCK_N"]) for c, k in result.over_limit] == [
        ("12.0", "_fwd_kernel", 106496, 32, 64),
        ("12.1", "_fwd_kernel", 106496, 32, 64),
    ]
    assert all(k.limit == LIMIT for _, k in result.over_limit)
    assert result.compiled == 2 and result.cached == 0

    # warm: the same tree again is answered from the cache without starting a probe
    again = smem_audit.audit_tree(
        release_dir("0.5.8"),
        archs=("12.0", "12.1"),
        matrix=_matrix(tmp_path, MLA_EXTEND),
        cache=cache,
        jobs=2,
        version="0.5.8",
    )
    assert again.compiled == 0 and again.cached == 2
    assert [k.shared for _, k in again.over_limit] == [106496, 106496]
    assert again.seconds < result.seconds


@pytest.mark.slow
def test_058_passes_with_the_sm120_block_size_policy(release_dir, tmp_path, audit_cache):
    """What the fix does (an SM120 branch choosing the 100 KB-class tiles, as sm_86/sm_89 get): with the
    module's capability global set so, the same kernel fits (32x32 tiles, 71680 B)."""
    result = smem_audit.audit_tree(
        release_dir("0.5.8"),
        archs=("12.0",),
        matrix=_matrix(tmp_path, MLA_EXTEND),
        policy={"extend": {"CUDA_CAPABILITY": (8, 9)}},
        cache=audit_cache(tmp_path / "cache"),
        jobs=1,
    )
    assert result.ok
    (case,) = result.cases
    (kernel,) = case.kernels
    assert (kernel.block["BLOCK_M"], kernel.block["BLOCK_N"], kernel.shared) == (32, 32, 71680)


@pytest.mark.slow
def test_unpatched_0523_context_attention_over_and_fixed_policy_fits(release_dir, tmp_path, audit_cache):
    """0.5.23 still picks BLOCK 128 in context_attention_fwd for every capability above 8: head dim 256
    in bf16 needs 163840 B. With BLOCK 64 (the fix's choice on SM120) it fits."""
    matrix = _matrix(tmp_path, VISION_256)
    cache = audit_cache(tmp_path / "cache")
    before = smem_audit.audit_tree(release_dir("0.5.23"), archs=("12.0",), matrix=matrix, cache=cache, jobs=1)
    ((case, kernel),) = before.over_limit
    assert (case.case.launcher, kernel.name, kernel.shared) == ("prefill", "_fwd_kernel", 163840)
    assert kernel.block["BLOCK_M"] == 128
    after = smem_audit.audit_tree(
        release_dir("0.5.23"),
        archs=("12.0",),
        matrix=matrix,
        cache=cache,
        jobs=1,
        policy={"prefill": {"CUDA_CAPABILITY": (8, 0)}},
    )
    assert after.ok
    (kernel,) = after.cases[0].kernels
    assert kernel.block["BLOCK_M"] == 64 and kernel.shared < LIMIT


@pytest.mark.slow
def test_unpatched_0523_lightning_attention_fp32_over_the_limit(release_dir, tmp_path, audit_cache):
    """lightning_attention (linear_backend "minimax"; Bailing linear models cast q/k/v to fp32) at head dim
    128: _fwd_kv_parallel needs 131584 B on sm_120, over the limit; its three siblings fit. With bf16
    inputs the launcher does not compile for any target (fp32 decay times bf16 keys meets bf16 values in
    one tl.dot), so no caller passes bf16."""
    packaged = shapes.select(shapes.load_matrix(), ["bailing-linear"])
    assert [c.id for c in shapes.expand(packaged)] == ["lightning/bailing-linear/float32"]
    result = smem_audit.audit_tree(
        release_dir("0.5.23"),
        archs=("12.0",),
        matrix=_matrix(tmp_path, LIGHTNING),
        cache=audit_cache(tmp_path / "cache"),
        jobs=1,
    )
    by_dtype = {c.case.params["dtype"]: c for c in result.cases}
    fp32 = by_dtype["float32"]
    assert fp32.status == "over-limit"
    shared = {k.name: k.shared for k in fp32.kernels}
    assert set(shared) == {"_fwd_diag_kernel", "_fwd_kv_parallel", "_fwd_kv_reduce", "_fwd_none_diag_kernel"}
    assert shared["_fwd_kv_parallel"] == 131584 > LIMIT
    assert [(c.case.id, k.name) for c, k in result.over_limit] == [
        ("lightning/lightning-hd128/float32", "_fwd_kv_parallel")
    ]
    assert all(k.limit == LIMIT and k.shared <= LIMIT for k in fp32.kernels if k.name != "_fwd_kv_parallel")
    bf16 = by_dtype["bfloat16"]
    assert bf16.status == "compile-error" and "must be same dtype" in bf16.error


@pytest.mark.slow
def test_fused_moe_bf16_and_fp8_block_compile(release_dir, tmp_path, audit_cache):
    """SGLang's MoE config choice for the faked RTX PRO 6000 and its kernel launcher, up and down GEMM."""
    result = smem_audit.audit_tree(
        release_dir("0.5.23"),
        archs=("12.0",),
        matrix=_matrix(tmp_path, SMALL_MOE),
        cache=audit_cache(tmp_path / "cache"),
        jobs=2,
    )
    assert result.ok, [c.error for c in result.cases]
    by_quant = {c.case.params["quantization"]: c for c in result.cases}
    assert [k.name for k in by_quant["bf16"].kernels] == ["fused_moe_kernel", "fused_moe_kernel"]
    fp8 = by_quant["fp8_block"].kernels[0]
    assert fp8.block["BLOCK_SIZE_K"] == 128 and fp8.block["BLOCK_SIZE_N"] == 128  # block-quant tiles
    assert all(0 < k.shared <= LIMIT for c in result.cases for k in c.kernels)


@pytest.mark.slow
def test_cli_table_json_and_exit_codes(release_dir, tmp_path, capsys, monkeypatch):
    source = release_dir("0.5.8")
    monkeypatch.setenv("SM120KIT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "releases").mkdir(parents=True)
    (tmp_path / "cache" / "releases" / "0.5.8").symlink_to(source)
    matrix = tmp_path / "m.toml"
    matrix.write_text(MLA_EXTEND)

    code, out, err = _cli(
        capsys,
        "audit",
        "--release",
        "0.5.8",
        "--arch",
        "12.0",
        "--matrix",
        str(matrix),
        "--only",
        "mla-extend",
        "--json",
    )
    assert code == 13
    data = json.loads(out)
    assert data["ok"] is False and data["summary"]["over_limit"] == 1
    assert data["findings"][0]["kernels"][0]["shared"] == 106496
    assert "compiled" in err  # progress goes to stderr in --json mode

    code, out, err = _cli(
        capsys, "audit", "--release", "0.5.8", "--arch", "sm_120", "--matrix", str(matrix), "--only", "mla-extend"
    )
    assert code == 13
    assert "106496" in out and "OVER" in out and "FAIL:" in out and "1 from cache" in out
    assert "over the limit" in err and "Traceback" not in err

    code, _, err = _cli(capsys, "audit", "--release", "0.5.8", "--arch", "7.5")
    assert code == 2 and "no device to audit for capability 7.5" in err
    code, _, err = _cli(capsys, "audit", str(tmp_path / "missing"))
    assert code == 3 and "does not exist" in err


@pytest.mark.slow
def test_compare_unpatched_shows_what_a_fix_changed(installed_tree, release_dir, tmp_path, capsys, monkeypatch):
    """A copy of 0.5.23 edited as the context-attention fix edits it, compared with the PyPI release."""
    tree = installed_tree("0.5.23")
    source = release_dir("0.5.23")
    monkeypatch.setenv("SM120KIT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "releases").mkdir(parents=True)
    (tmp_path / "cache" / "releases" / "0.5.23").symlink_to(source)
    source = tree / "kernels" / "ops" / "attention" / "prefill_attention.py"
    text = source.read_text()
    old = "if (_is_cuda or _is_hip) and CUDA_CAPABILITY[0] > 8:"
    assert text.count(old) == 1
    source.write_text(
        text.replace(old, "if (_is_cuda or _is_hip) and CUDA_CAPABILITY[0] > 8 and CUDA_CAPABILITY[0] != 12:")
    )
    matrix = tmp_path / "m.toml"
    matrix.write_text(VISION_256)
    code, out, _ = _cli(
        capsys,
        "audit",
        str(tree),
        "--arch",
        "12.0",
        "--matrix",
        str(matrix),
        "--only",
        "vision-256",
        "--compare-unpatched",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert data["ok"] is True and data["unpatched"]["ok"] is False and data["fixed"] == 1
    (change,) = data["changes"]
    assert change["unpatched"].startswith("163840 B over") and change["fixed"] is True


@pytest.mark.slow
@pytest.mark.skipif(
    not (patches_dir() / "sglang" / "series.toml").is_file(),
    reason="the SM120 patch series (patches/sglang/series.toml) is not in this checkout",
)
@pytest.mark.parametrize("version, text", [("0.5.8", MLA_EXTEND), ("0.5.23", VISION_256)])
def test_patched_tree_reports_nothing_over(installed_tree, tmp_path, capsys, version, text, audit_cache):
    """The real series applied with `sm120kit apply`: the kernels the unpatched release had over fit."""
    tree = installed_tree(version)
    code, _, err = _cli(capsys, "apply", str(tree))
    assert code == 0, err
    result = smem_audit.audit_tree(
        tree.parent,
        archs=("12.0", "12.1"),
        matrix=_matrix(tmp_path, text),
        cache=audit_cache(tmp_path / "cache"),
        jobs=2,
    )
    assert result.ok, [(c.case.id, [k.shared for k in c.kernels], c.error) for c in result.cases]


def test_tuned_moe_files_of_every_12x_name_are_found(release_dir):
    """0.5.23 ships fused-MoE configs for the RTX PRO 6000 Server and Max-Q editions (12.0) and GB10 (12.1):
    each configuration of each such file becomes a case under that device name."""
    root = release_dir("0.5.23")
    moe = launchers.resolve(root, "moe")
    on_120 = smem_audit.tuned_moe_cases(root, moe, "12.0")
    on_121 = smem_audit.tuned_moe_cases(root, moe, "12.1")
    names = {c.params["device_name"] for c in on_120}
    assert names == {
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    }
    assert {c.params["device_name"] for c in on_121} == {"NVIDIA GB10"}
    assert {(c.model, c.params["quantization"]) for c in on_120} == {
        ("tuned-E129-N352", "fp8"),
        ("tuned-E161-N384", "fp8"),
        ("tuned-E161-N192", "fp8_channel"),
        ("tuned-E161-N192", "bf16"),
        ("tuned-E256-N512", "bf16"),
    }
    server = sorted(c.params["tokens"] for c in on_120 if c.model == "tuned-E256-N512")
    folder = moe.files[1].parent / "configs" / "triton_3_6_0"
    file = folder / "E=256,N=512,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json"
    assert server == sorted(int(k) for k in json.loads(file.read_text()))
    assert len({c.id for c in on_120}) == len(on_120)


@pytest.mark.slow
def test_tuned_moe_files_load_under_their_device_name(release_dir, tmp_path, audit_cache):
    """Compiled for sm_120 under each device name (faked device): the config SGLang reads is the file's
    entry, up and down (the Server Edition ships a _down file). The upstream files are trimmed to their
    first entry to bound the compile time here; the configurations are upstream's."""
    import shutil

    site = tmp_path / "site"
    shutil.copytree(release_dir("0.5.23"), site)
    moe = launchers.resolve(site, "moe")
    picked = {}
    for path in (moe.files[1].parent / "configs").rglob("*Blackwell_[MS]*.json"):
        table = json.loads(path.read_text())
        first = min(table, key=int)
        path.write_text(json.dumps({first: table[first]}))
        picked[path.name] = table[first]
    result = smem_audit.audit_tree(
        site,
        archs=("12.0",),
        matrix=_matrix(tmp_path, SMALL_MOE),
        launchers=["prefill"],
        cache=audit_cache(tmp_path / "cache"),
        jobs=2,
        tuned_moe_configs=True,
    )
    tuned = [c for c in result.cases if c.case.model.startswith("tuned-")]
    assert len(tuned) == 5 and result.ok, [(c.case.id, c.status, c.error) for c in result.cases]
    server = next(c for c in tuned if c.case.model == "tuned-E256-N512")
    up_file = "E=256,N=512,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json"
    down_file = up_file.replace(".json", "_down.json")
    up, down = server.kernels
    for kernel, name in ((up, up_file), (down, down_file)):
        wanted = picked[name]
        assert (kernel.block["BLOCK_SIZE_N"], kernel.block["BLOCK_SIZE_K"]) == (
            wanted["BLOCK_SIZE_N"],
            wanted["BLOCK_SIZE_K"],
        ), (name, kernel, wanted)


MLA_TREE_VERIFY = """
[[attention]]
name = "mla-tree-verify"
qk_head_dim = 576
v_head_dim = 512
num_heads = 16
num_kv_heads = 1
dtypes = ["bfloat16"]
kv_cache_dtypes = ["auto", "fp8_e4m3"]
launchers = ["tree-verify", "mla-decode"]
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not (patches_dir() / "sglang" / "series.toml").is_file(),
    reason="the SM120 patch series (patches/sglang/series.toml) is not in this checkout",
)
def test_patched_tree_verify_audit_compiles_the_cuda_prefix_kernel(
    installed_tree, tmp_path, capsys, audit_cache, monkeypatch
):
    """sm120-mla-attention's CUDA kernels (the prefix kernel, the one-launch verify or decode and its 16-row
    programs, compiled by NVRTC as at first use on the card) are in the audit of the tree-verify and MLA decode
    launchers, beside their Triton kernels, for both KV dtypes (fp8: the exact and the fp8-mma builds). On 12.0
    only: the same kernels compiled for sm_121a (CUDA) and 12.1 (Triton, every reachable tile) are within the
    limit in tests/kernels/test_mla_kernels.py
    (test_mma_prefix_kernel_compiles_within_the_limit, test_every_reachable_tile_compiles_within_the_limit),
    and the audit with 12.1 as a target in test_unpatched_058_mla_extend_is_over_the_limit and
    test_patched_tree_reports_nothing_over."""
    tree = installed_tree("0.5.23")
    code, _, err = _cli(capsys, "apply", str(tree))
    assert code == 0, err
    monkeypatch.delenv(mla_kernels.DEFINES_ENV, raising=False)
    cache = audit_cache(tmp_path / "cache")
    result = smem_audit.audit_tree(
        tree.parent, archs=("12.0",), matrix=_matrix(tmp_path, MLA_TREE_VERIFY), cache=cache, jobs=2
    )
    assert result.ok, [(c.case.id, [k.shared for k in c.kernels], c.error) for c in result.cases]
    cuda = {(c.arch, k.name, k.shared) for c in result.cases for k in c.kernels if "_mma_" in k.name}
    assert {(arch, name) for arch, name, _ in cuda} == {
        (arch, f"sm120_mla_{kind}_mma_{kv}_i64")
        for arch in ("12.0",)
        for kv in ("bf16", "fp8", "fp8q")  # fp8q: fp8 KV on the fp8-mma path (SGLANG_SM120_MLA_FP8_MMA=1)
        for kind in ("prefix", "fused", "fused16")
    }
    assert all(48 * 1024 < shared <= LIMIT for _, _, shared in cuda)
    for launcher in ("tree-verify", "mla-decode"):
        cases = [c for c in result.cases if c.case.launcher == launcher]
        assert cases and all(any("_mma_" in k.name for k in c.kernels) for c in cases), launcher
    assert all(c.note is None for c in result.cases), [c.note for c in result.cases]

    # SGLANG_SM120_MLA_DEFINES: the probe builds the CUDA kernels as the server would (the patched module reads
    # the variable), the cases are audited again rather than served from the cache of the build as shipped, and
    # their note names the flags, or why the server would ignore the value.
    decode = MLA_TREE_VERIFY.replace('["auto", "fp8_e4m3"]', '["fp8_e4m3"]').replace(
        '["tree-verify", "mla-decode"]', '["mla-decode"]'
    )
    env = mla_kernels.DEFINES_ENV
    for value, note in (
        ("DECODE16_MAX_SPLIT=2048", f"CUDA MLA kernels built with {env}=DECODE16_MAX_SPLIT=2048"),
        ("DECODE16=2", f"{env} is ignored, the kernels are built as shipped: 'DECODE16=2': DECODE16 takes"),
    ):
        monkeypatch.setenv(env, value)
        again = smem_audit.audit_tree(
            tree.parent, archs=("12.0",), matrix=_matrix(tmp_path, decode), cache=cache, jobs=1
        )
        assert again.ok and again.cases
        for case in again.cases:
            assert not case.cached and case.note.startswith(note), (value, case.note)
            assert any(k.name == "sm120_mla_fused16_mma_fp8_i64" for k in case.kernels), value
            assert all(k.shared <= LIMIT for k in case.kernels), value
