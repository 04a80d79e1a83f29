"""Patch sm120-backend-gating on real SGLang releases from PyPI.

What is proved, per release of the series matrix:

* the patch applies with zero fuzz through sm120kit's own planner and applier, and every file it leaves
  compiles (its status after the patches before it in the bundled series is checked, for every release
  0.5.2-0.5.23, by tests/series/test_patched_identity.py against the recorded statuses);
* SGLang's own argument resolution on the patched tree (sm120kit.audit.backends: a faked device
  and config.json-only model folders) picks a backend with SM12x kernels for an MHA, an MLA and a hybrid
  GDN model on 12.0 (and on 12.1, one release per hook site), and rejects an explicit
  ``--attention-backend fa3`` on 12.0 with the one clear error that names the backends that work;
* on 9.0 and 10.0 the patched tree resolves exactly as the unpatched one (every resolved field, not only
  the attention backend; one release per hook site), and on every matrix release the gate module returns
  without reading anything on 9.0, 10.0, 8.9 and an AMD GPU that reports capability major 12 through HIP.

No GPU is used: the device is faked (``sm120kit.hardware.fake_device``) because this machine has none, and
the CUDA-only libraries sgl_kernel and torchvision (and flashinfer/deep_gemm, counted as installed) are
stand-ins inside the resolution probe. The SGLang code that resolves the arguments is the release's own.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SERIES_RELEASES
from packaging.version import Version

from sm120kit.audit.backends import resolve_across, resolve_many
from sm120kit.hardware.fake_device import PRESETS, faked_cuda
from sm120kit.patching.engine import apply_series
from sm120kit.patching.plan import plan_series
from sm120kit.patching.series import load_series
from sm120kit.sglang.target import find_target

PATCH_ID = "sm120-backend-gating"
PATCH_DIR = REPO_ROOT / "patches" / "sglang" / PATCH_ID
GATE = "sglang/srt/sm12x_backend_gate.py"
TRTLLM_MHA_BACKEND = "sglang/srt/layers/attention/trtllm_mha_backend.py"
MODELS = ("llama-mha", "deepseek-v3-mla", "qwen3-next-gdn")
FA3 = ("--attention-backend", "fa3")
# Backends with no SM12x kernels in any release the series covers, and the trtllm_mha roles by release.
NEVER_ON_12X = {"fa3", "flashmla", "cutlass_mla", "trtllm_mla"}
# 9.0/10.0 equality is checked by resolution on one release per hook site (server_args.py without and
# with the attention default, with declarations, arg_groups/pipeline.py); the gate module's test below
# shows it returns before reading anything off 12.x on every release of the matrix.
SAME_OFF_12X = ("0.5.2", "0.5.6.post2", "0.5.17", "0.5.23")

pytestmark = pytest.mark.slow


def _trtllm_mha_ok(release: str, role: str) -> bool:
    first = {"prefill": "0.5.19", "decode": "0.5.10"}[role]
    return Version(release) >= Version(first)


def _runs_on_12x(release: str, role: str, backend: str | None) -> bool:
    if backend is None or backend in NEVER_ON_12X:
        return False
    return backend != "trtllm_mha" or _trtllm_mha_ok(release, role)


# -- the patch on its own, as a one-patch series --------------------------------------------------------------


@pytest.fixture(scope="session")
def gating_series(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gating-series")
    shutil.copytree(PATCH_DIR, folder / PATCH_ID)
    (folder / "series.toml").write_text(f'patches = ["{PATCH_ID}"]\n')
    return load_series(folder)


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_patch_applies_with_zero_fuzz_and_compiles(version, release_dir, gating_series):
    plan = plan_series(release_dir(version), gating_series, version=version)
    (patch,) = plan.patches
    assert patch.status == "applies", patch.reason
    assert patch.variant is not None and Version(version) in patch.variant.releases
    assert patch.hunks and all(h.fuzz == 0 for h in patch.hunks)
    assert GATE in patch.new_files
    for path, data in patch.new_files.items():
        compile(data.decode(), path, "exec")  # SyntaxError fails the test


def test_every_cached_release_takes_the_patch(gating_series):
    """Beyond the matrix: every release already in the cache (the full 0.5.2..0.5.23 range where
    ``sm120kit fetch-release 0.5.2..0.5.23`` was run, and any pre-release fetched) applies with zero fuzz,
    but a pre-release the variant ranges leave out by name ('!=0.5.3rc0'). Nothing is downloaded."""
    from sm120kit.util.cache import cache_dir

    releases = sorted(
        (p.name for p in (cache_dir() / "releases").glob("0.5.*") if (p / "sglang").is_dir()), key=Version
    )
    if len(releases) < 3:
        pytest.skip("fewer than three releases cached; the matrix test above covers the required ones")
    (patch,) = gating_series.patches
    named = {Version(s.version) for v in patch.variants for s in v.releases if s.operator == "!="}
    left_out = [v for v in releases if patch.variant_for(v) is None]
    assert all(Version(v) in named for v in left_out), left_out
    releases = [v for v in releases if v not in left_out]
    statuses = {v: plan_series(cache_dir() / "releases" / v, gating_series, version=v).patches[0] for v in releases}
    bad = {v: p.reason for v, p in statuses.items() if p.status != "applies" or any(h.fuzz for h in p.hunks)}
    assert not bad


# -- the gate module, called directly ---------------------------------------------------------------------


class _Untouchable:
    """A stand-in for ServerArgs that fails on any attribute read: proves the gate reads nothing."""

    def __getattr__(self, name):
        raise AssertionError(f"the gate read {name!r} on a GPU that is not 12.x")


class _Args:
    def __init__(self, **values):
        base = dict(
            attention_backend=None,
            prefill_attention_backend=None,
            decode_attention_backend=None,
            mm_attention_backend=None,
            moe_runner_backend="auto",
            fp8_gemm_runner_backend="auto",
        )
        base.update(values)
        self.__dict__.update(base)


def _load_gate(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_gate_module_is_inert_off_12x_and_rejects_fa3_on_12x(version, release_dir, gating_series, tmp_path):
    """The module as the patch writes it for this release, run under faked devices (no GPU here). It sits
    beside the release's own trtllm_mha backend, from which it reads the roles that run on 12.x."""
    plan = plan_series(release_dir(version), gating_series, version=version)
    name = "sm12x_gate_" + version.replace(".", "_")
    module_file = tmp_path / GATE
    module_file.parent.mkdir(parents=True)
    module_file.write_bytes(plan.patches[0].new_files[GATE])
    backend = release_dir(version) / TRTLLM_MHA_BACKEND
    (tmp_path / TRTLLM_MHA_BACKEND).parent.mkdir(parents=True)
    shutil.copy2(backend, tmp_path / TRTLLM_MHA_BACKEND)
    gate = _load_gate(module_file, name)
    for cap in ("9.0", "10.0", "8.9", "hip-12"):
        with faked_cuda(PRESETS[cap]):
            assert gate.is_sm12x() is False
            assert gate.check_requested(_Untouchable()) is None
            assert gate.fix_automatic(_Untouchable()) is None
    for cap in ("12.0", "12.1"):
        with faked_cuda(PRESETS[cap]):
            assert gate.is_sm12x() is True
            gate.check_requested(_Args(attention_backend="flashinfer"))
            if _trtllm_mha_ok(version, "decode"):
                gate.check_requested(_Args(attention_backend="triton", decode_attention_backend="trtllm_mha"))
            else:
                with pytest.raises(ValueError, match="decode"):
                    gate.check_requested(_Args(decode_attention_backend="trtllm_mha"))
            with pytest.raises(ValueError) as info:
                gate.check_requested(_Args(attention_backend="fa3", mm_attention_backend="fa3"))
            message = str(info.value)
            assert f"compute capability {cap}" in message
            assert "--attention-backend fa3" in message and "--mm-attention-backend fa3" in message
            assert "flashinfer" in message and "triton" in message
            with pytest.raises(ValueError, match="trtllm_mla"):
                gate.check_requested(_Args(decode_attention_backend="trtllm_mla"))
            if not _trtllm_mha_ok(version, "prefill"):
                with pytest.raises(ValueError, match="prefill"):
                    gate.check_requested(_Args(attention_backend="trtllm_mha"))
            else:  # the tree's backend has the fmha_v2 prefill path for SM120
                gate.check_requested(_Args(attention_backend="trtllm_mha"))
            if Version(version) < Version("0.5.20"):
                with pytest.raises(ValueError, match="deep_gemm"):
                    gate.check_requested(_Args(moe_runner_backend="deep_gemm"))


# -- SGLang's own argument resolution -------------------------------------------------------------------


def _patched_copy(source: Path, dest: Path, series) -> Path:
    shutil.copytree(source, dest)
    result = apply_series(find_target(dest), series)
    assert result.exit_code == 0, result.message
    assert result.statuses == {PATCH_ID: "applied"}
    return dest


OFF_12X = ("9.0", "10.0")


@pytest.fixture(scope="session")
def resolutions(tmp_path_factory, release_dir, gating_series):
    """Every resolution the tests below read: one probe interpreter per tree, resolving each capability (in a
    process of its own, :func:`sm120kit.audit.backends.resolve_across`), two interpreters at a time.

    Key: (release, "patched" | "unpatched" | "full-series", capability) -> list of Resolution in request order
    (the explicit fa3 request after the models on the patched 12.0 only)."""
    work = tmp_path_factory.mktemp("gating-trees")
    patched = {v: _patched_copy(release_dir(v), work / v, gating_series) for v in SERIES_RELEASES}
    models = [(m, ()) for m in MODELS]
    jobs = []
    for v in SERIES_RELEASES:
        same = v in SAME_OFF_12X
        jobs.append((v, "patched", ("12.0", "12.1", *OFF_12X) if same else ("12.0",), [*models, ("llama-mha", FA3)]))
        # the regressions the patch fixes, as the release has them (12.0); 9.0/10.0 to compare the patched tree to
        unpatched_caps = (("12.0",) if v in ("0.5.6.post2", "0.5.8") else ()) + (OFF_12X if same else ())
        if unpatched_caps:
            jobs.append((v, "unpatched", unpatched_caps, models))
    # The whole bundled series on 0.5.4, whose capability patch widens is_blackwell() to 12.x.
    full = work / "0.5.4-full-series"
    shutil.copytree(release_dir("0.5.4"), full)
    assert apply_series(find_target(full), load_series()).exit_code == 0
    jobs.append(("0.5.4", "full-series", ("12.0",), [("qwen3-next-gdn", ())]))
    jobs.sort(key=lambda job: -len(job[2]))  # the interpreters with the most capabilities first

    def run(job):
        v, kind, caps, requests = job
        root = {"patched": patched.get(v), "full-series": full}.get(kind) or release_dir(v)
        found = resolve_across(root, requests, caps)
        return {(v, kind, c): r if c == "12.0" else r[: len(MODELS)] for c, r in found.items()}

    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 1))) as pool:
        return {key: value for part in pool.map(run, jobs) for key, value in part.items()}


def _not_run(results) -> list[str]:
    return [f"{r.model}: {r.error}" for r in results if r.status == "not-run"]


# 12.1 through SGLang's own resolution on one release per hook site; the gate module itself answers 12.1 as
# 12.0 on every release (test_gate_module_is_inert_off_12x_and_rejects_fa3_on_12x).
@pytest.mark.parametrize(
    ("version", "cap"), [(v, "12.0") for v in SERIES_RELEASES] + [(v, "12.1") for v in SAME_OFF_12X]
)
def test_patched_resolution_picks_backends_with_sm12x_kernels(version, cap, resolutions):
    results = resolutions[(version, "patched", cap)]
    assert not _not_run(results), _not_run(results)
    for r in results[: len(MODELS)]:
        if r.model == "qwen3-next-gdn" and version == "0.5.2":
            # 0.5.2 sets attention_backend=hybrid_linear_attn for hybrid GDN models in ModelRunner.__init__,
            # outside argument resolution, and that backend runs FlashAttention 3 for the full-attention
            # layers: no argument choice makes it run on 12.x (a gap this patch leaves; see the patch docs).
            continue
        assert r.status == "resolved", f"{r.model}: {r.error}"
        prefill, decode = r.backends["attention_prefill"], r.backends["attention_decode"]
        assert _runs_on_12x(version, "prefill", prefill), f"{r.model}: prefill {prefill}"
        assert _runs_on_12x(version, "decode", decode), f"{r.model}: decode {decode}"
        if r.model == "deepseek-v3-mla":
            assert prefill == decode == "triton"
        if r.model == "qwen3-next-gdn" and Version("0.5.4.post2") <= Version(version) < Version("0.5.10"):
            # is_blackwell() covers 12.x there, and the hybrid GDN wrapper then accepts triton only.
            assert prefill == decode == "triton"
        if Version(version) < Version("0.5.20"):
            assert r.backends["deep_gemm"] == "off"  # DeepGEMM installed, yet kept off on 12.x
    if Version(version) >= Version("0.5.20") and cap == "12.1":
        # From 0.5.20 DeepGEMM runs on 12.x when it has the SM120 kernels; 12.1 follows 12.0.
        on_120 = [r.backends["deep_gemm"] for r in resolutions[(version, "patched", "12.0")][: len(MODELS)]]
        assert [r.backends["deep_gemm"] for r in results] == on_120


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_explicit_fa3_on_12_0_fails_with_one_clear_error(version, resolutions):
    explicit = resolutions[(version, "patched", "12.0")][len(MODELS)]
    assert explicit.args == FA3
    assert explicit.status == "rejected", explicit.error
    assert explicit.error_type == "ValueError"
    assert "compute capability 12.0" in explicit.error
    assert "--attention-backend fa3" in explicit.error
    assert "Backends that run on it: --attention-backend flashinfer, triton" in explicit.error


@pytest.mark.parametrize("version", SAME_OFF_12X)
@pytest.mark.parametrize("cap", ["9.0", "10.0"])
def test_hopper_and_datacenter_blackwell_resolve_exactly_as_unpatched(version, cap, resolutions):
    patched = resolutions[(version, "patched", cap)]
    unpatched = resolutions[(version, "unpatched", cap)]
    assert not _not_run(patched + unpatched), _not_run(patched + unpatched)
    for p, u in zip(patched, unpatched):
        assert (p.status, p.error) == (u.status, u.error), p.model
        assert p.backends == u.backends, p.model
        assert p.raw == u.raw, p.model  # every resolved server argument


def test_the_release_regressions_are_gone(resolutions):
    """0.5.6.post2 picks trtllm_mha for MHA models on 12.0 and rejects its own choice; 0.5.8 defaults the
    hybrid GDN model to flashinfer, which its hybrid GDN wrapper refuses on is_blackwell() GPUs."""
    before = {r.model: r for r in resolutions[("0.5.6.post2", "unpatched", "12.0")]}
    after = {r.model: r for r in resolutions[("0.5.6.post2", "patched", "12.0")][: len(MODELS)]}
    assert before["llama-mha"].status == "rejected" and "TRTLLM MHA" in before["llama-mha"].error
    assert after["llama-mha"].status == "resolved"
    assert after["llama-mha"].backends["attention_decode"] in ("flashinfer", "triton")
    before = {r.model: r for r in resolutions[("0.5.8", "unpatched", "12.0")]}
    after = {r.model: r for r in resolutions[("0.5.8", "patched", "12.0")][: len(MODELS)]}
    assert before["qwen3-next-gdn"].backends["attention_decode"] == "flashinfer"
    assert after["qwen3-next-gdn"].backends["attention_decode"] == "triton"


def test_hybrid_gdn_default_follows_the_release_is_blackwell(resolutions):
    """With the whole series, 0.5.4's is_blackwell() covers 12.x (capability patch), so its hybrid GDN
    wrapper accepts triton only there; the gate reads the release's own is_blackwell() and picks triton."""
    (gdn,) = resolutions[("0.5.4", "full-series", "12.0")]
    assert gdn.status == "resolved", gdn.error
    assert gdn.backends["attention_prefill"] == gdn.backends["attention_decode"] == "triton"
    (alone,) = [r for r in resolutions[("0.5.4", "patched", "12.0")] if r.model == "qwen3-next-gdn"]
    assert alone.backends["attention_decode"] == "flashinfer"  # unwidened is_blackwell(): flashinfer runs


@pytest.mark.parametrize("version", ["0.5.2", "0.5.23"])
def test_a_capability_resolved_alone_answers_as_in_the_batch(
    version, resolutions, tmp_path, release_dir, gating_series
):
    """The batched probe (every capability of a tree in one interpreter) answers exactly as one interpreter
    per capability: each resolved field, the arguments read, the Triton decode splits and the findings, on
    the capabilities served after another in the batch (12.1, 9.0)."""
    tree = _patched_copy(release_dir(version), tmp_path / version, gating_series)

    def plain(r):
        return (r.to_json(), r.raw, r.given, r.triton_decode, [str(s) for s in r.slow])

    for cap in ("12.1", "9.0"):
        (alone,) = resolve_many(tree, [("deepseek-v3-mla", ())], cap)
        (batched,) = [r for r in resolutions[(version, "patched", cap)] if r.model == "deepseek-v3-mla"]
        assert alone.status == "resolved", alone.error
        assert {**plain(alone)[0], "seconds": None} == {**plain(batched)[0], "seconds": None}
        assert plain(alone)[1:] == plain(batched)[1:]
