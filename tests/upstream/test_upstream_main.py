"""SGLang main against the series: how a main commit is labelled, and backend gating on a main that runs
``trtllm_mha`` prefill on SM120.

The git trees are built here from PyPI releases, in SGLang's own layout (docs/upstream.md):

- main starts with the files of SGLang 0.5.6.post2, tagged ``v0.5.6.post2`` (the last release tagged on
  main's own history), from which a release branch is cut and tagged ``v0.5.11``; main then holds the files
  of 0.5.12 and then those of 0.5.18, each without ``sglang/_version.py`` (setuptools-scm
  writes that file at install time and SGLang's .gitignore keeps it out of git; 0.5.18's ``version.py`` is
  main's, byte for byte) and a ``python/pyproject.toml`` whose version is dynamic, from git tags through
  ``[tool.setuptools_scm]`` (its dependencies are those of the wheel of the same release); 0.5.18 is tagged
  ``v0.5.18`` on a branch cut from that commit, as SGLang cuts release branches;
- main's next commit is upstream commit 5d12280ae7 (sglang PR #23112, "Add fmha_v2 attention backend for
  SM90/120", 2026-08-18, made on main after the 0.5.18 branch): its ``trtllm_mha_backend.py`` is byte for
  byte 0.5.18's before it. Of that commit, :func:`apply_23112` applies the three pieces that decide whether
  trtllm_mha prefill runs on SM120: the ``use_fmha_v2`` flag, the ``trtllm_fmha_v2_prefill`` call, and the
  server-argument check that now admits SM120 for prefill (its fp8-KV, skip-softmax and context-parallel
  refusals and the KV-layout changes are left out).

No GPU is used: SGLang's own argument resolution runs on a faked 12.0 device (sm120kit.hardware.fake_device),
because this machine has none.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from apply_support import run_json
from conftest import REPO_ROOT, SERIES_RELEASES, quick_on_one
from series_support import copy_series

from sm120kit.sglang import sm12x_paths
from sm120kit.sglang.metadata import dist_metadata_files, read_dist_metadata

REPO = REPO_ROOT
SERIES = REPO / "patches" / "sglang"
GATING = "sm120-backend-gating"
GATE = "sglang/srt/sm12x_backend_gate.py"
BACKEND = sm12x_paths.TRTLLM_MHA_BACKEND
PREFILL = ("--prefill-attention-backend", "trtllm_mha")


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=SGLang tests", "-c", "user.email=tests@sm120kit.invalid", "-c", "gc.auto=0", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {path}"
    path.write_text(text.replace(old, new))


def apply_23112(package: Path) -> None:
    """The pieces of upstream commit 5d12280ae7 (sglang PR #23112) that decide trtllm_mha prefill on SM120,
    applied to 0.5.18's files (identical to the commit's parent in these places)."""
    backend = package.parent / BACKEND
    _replace(
        backend,
        "        self.is_xqa_impl = is_sm90_supported() or is_sm120_supported()\n",
        "        self.is_xqa_impl = is_sm90_supported() or is_sm120_supported()\n\n"
        "        # fmha_v2 prefill kernel supports SM90 and SM120\n"
        "        self.use_fmha_v2 = is_sm90_supported() or is_sm120_supported()\n",
    )
    _replace(
        backend,
        "                    multi_ctas_kv_counter_buffer=self._multi_ctas_kv_counter_buffer,\n"
        "                )\n        else:\n",
        "                    multi_ctas_kv_counter_buffer=self._multi_ctas_kv_counter_buffer,\n"
        "                )\n"
        "        elif self.use_fmha_v2 and not cp_v2_active:\n"
        "            paged_kv = torch.stack([k_cache, v_cache], dim=1)\n"
        "            o = flashinfer.prefill.trtllm_fmha_v2_prefill(\n"
        "                (q, paged_kv),\n"
        '                input_layout="Q_PAGED_KV_NHD",\n'
        "                workspace_buffer=self.workspace_buffer,\n"
        "                seq_lens=self.forward_metadata.cache_seqlens_int32,\n"
        "                max_q_len=self.forward_metadata.max_seq_len_q,\n"
        "                max_kv_len=self.max_context_len,\n"
        "                bmm1_scale=bmm1_scale,\n"
        "                bmm2_scale=bmm2_scale,\n"
        "                batch_size=forward_batch.batch_size,\n"
        "                cum_seq_lens_q=self.forward_metadata.cu_seqlens_q,\n"
        "                cum_seq_lens_kv=self.forward_metadata.cu_seqlens_k,\n"
        "                block_tables=page_table,\n"
        "                out_dtype=self.q_data_type,\n"
        '                mask_mode="causal",\n'
        "                window_left=layer.sliding_window_size,\n"
        "                sinks=attention_sink,\n"
        "            )\n"
        "        else:\n",
    )
    _replace(
        package / "srt" / "server_args.py",
        '            if prefill_backend == "trtllm_mha" and not is_sm100_supported():\n'
        "                raise ValueError(\n"
        '                    "TRTLLM MHA backend for prefill is only supported on Blackwell GPUs (SM100). '
        'Please use a different prefill backend."\n'
        "                )\n",
        '            if prefill_backend == "trtllm_mha" and not (\n'
        "                is_sm90_supported() or is_sm100_supported() or is_sm120_supported()\n"
        "            ):\n"
        "                raise ValueError(\n"
        '                    "TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or '
        'SM120 GPUs. "\n'
        '                    "Please use a different prefill backend."\n'
        "                )\n",
    )


def _put_release(repo: Path, version: str, release_dir, *, version_file: bool) -> None:
    package = repo / "python" / "sglang"
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(release_dir(version) / "sglang", package)
    if not version_file:
        (package / "_version.py").unlink(missing_ok=True)


def _main_pyproject(release_root: Path) -> str:
    """A ``python/pyproject.toml`` laid out as main's: version dynamic, from git tags (setuptools-scm)."""
    [meta] = dist_metadata_files(release_root, "sglang")
    deps = read_dist_metadata(meta).get_all("Requires-Dist") or []
    return (
        '[project]\nname = "sglang"\ndynamic = ["version"]\ndependencies = [\n'
        + "".join(f"  {json.dumps(d)},\n" for d in deps)
        + ']\n\n[tool.setuptools_scm]\nroot = ".."\nversion_file = "sglang/_version.py"\n'
    )


@pytest.fixture(scope="module")
def main_repo(tmp_path_factory, release_dir):
    """(repo, {commit name: sha}): see the module text. HEAD is main after PR #23112."""
    repo = tmp_path_factory.mktemp("sglang-main") / "sglang"
    (repo / "python").mkdir(parents=True)
    _git("init", "-q", "-b", "main", cwd=repo)
    _put_release(repo, "0.5.6.post2", release_dir, version_file=True)
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "SGLang 0.5.6.post2", cwd=repo)
    _git("tag", "-a", "-m", "Release v0.5.6.post2", "v0.5.6.post2", cwd=repo)
    _git("checkout", "-q", "-b", "release/v0.5.11", cwd=repo)
    _git("commit", "-q", "--allow-empty", "-m", "Release v0.5.11", cwd=repo)
    _git("tag", "-a", "-m", "Release v0.5.11", "v0.5.11", cwd=repo)
    _git("checkout", "-q", "main", cwd=repo)
    _put_release(repo, "0.5.12", release_dir, version_file=False)
    (repo / "python" / "pyproject.toml").write_text(_main_pyproject(release_dir("0.5.12")))
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "main between the 0.5.11 and 0.5.18 branches", cwd=repo)
    shas = {"0.5.12": _git("rev-parse", "HEAD", cwd=repo)}
    _put_release(repo, "0.5.18", release_dir, version_file=False)
    (repo / "python" / "pyproject.toml").write_text(_main_pyproject(release_dir("0.5.18")))
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "main where release/v0.5.18 is cut", cwd=repo)
    shas["branch-point"] = _git("rev-parse", "HEAD", cwd=repo)
    _git("checkout", "-q", "-b", "release/v0.5.18", cwd=repo)
    _git("commit", "-q", "--allow-empty", "-m", "Release v0.5.18", cwd=repo)
    _git("tag", "-a", "-m", "Release v0.5.18", "v0.5.18", cwd=repo)
    _git("checkout", "-q", "main", cwd=repo)
    apply_23112(repo / "python" / "sglang")
    _git("commit", "-qam", "Add fmha_v2 attention backend for SM90/120 (#23112)", cwd=repo)
    shas["23112"] = _git("rev-parse", "HEAD", cwd=repo)
    return repo, shas


def _fixed_gate_series(tmp_path: Path) -> Path:
    """A copy of the series whose gating variants fix the trtllm_mha roles per release, as every variant did
    before they were read from the tree: 0.5.12.diff (0.5.12-0.5.18) says prefill False, decode True."""
    dest = copy_series(tmp_path / "fixed-series-root")
    diff = dest / GATING / "0.5.12.diff"
    text = diff.read_text()
    start = text.index(f"+++ b/{GATE}\n")
    head, body = text[:start], text[start:]
    body = body.replace(
        "+DEEP_GEMM_OK = False\n",
        "+TRTLLM_MHA_PREFILL_OK = False\n+TRTLLM_MHA_DECODE_OK = True\n+DEEP_GEMM_OK = False\n",
        1,
    )
    fixed = '{"prefill": TRTLLM_MHA_PREFILL_OK, "decode": TRTLLM_MHA_DECODE_OK}[role]'
    for use in (" and not trtllm_mha_runs(role):", "    if trtllm_mha_runs(role):"):
        assert body.count(use) == 1, use
        body = body.replace(use, use.replace("trtllm_mha_runs(role)", fixed))
    count = int(re.search(r"@@ -0,0 \+1,(\d+) @@", body).group(1))
    body = body.replace(f"@@ -0,0 +1,{count} @@", f"@@ -0,0 +1,{count + 2} @@", 1)
    diff.write_text(head + body)
    return dest


def _gate_beside(tmp: Path, gate_text: bytes, backend_file: Path):
    """The gate module, loaded from a folder that holds it and the given trtllm_mha backend, as a tree does."""
    import importlib.util

    (tmp / GATE).parent.mkdir(parents=True)
    (tmp / GATE).write_bytes(gate_text)
    (tmp / BACKEND).parent.mkdir(parents=True)
    shutil.copy2(backend_file, tmp / BACKEND)
    spec = importlib.util.spec_from_file_location(f"gate_{abs(hash(str(tmp)))}", tmp / GATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gate_text() -> bytes:
    from sm120kit.patching.series import load_series

    variant = load_series(SERIES).get(GATING).variant_for("0.5.23")
    [created] = [f for f in variant.files if f.path == GATE]
    return created.target_text.encode()


# -- the two readers of the trtllm_mha roles agree -----------------------------------------------------------


@pytest.mark.parametrize("version", quick_on_one(SERIES_RELEASES))
def test_gate_and_sm120kit_read_the_same_roles_from_a_release(version, release_dir, tmp_path):
    from packaging.version import Version

    expected = {"decode": Version(version) >= Version("0.5.10"), "prefill": Version(version) >= Version("0.5.19")}
    gate = _gate_beside(tmp_path, _gate_text(), release_dir(version) / BACKEND)
    found = sm12x_paths.runs_on_12x(tmp_path)
    for role, runs in expected.items():
        assert gate.trtllm_mha_runs(role) is runs, (version, role)
        assert found[("trtllm_mha", role)] is runs, (version, role)


@pytest.mark.slow
def test_gate_and_sm120kit_read_the_same_roles_from_main(main_repo, tmp_path):
    repo, _ = main_repo
    gate = _gate_beside(tmp_path, _gate_text(), repo / "python" / BACKEND)
    found = sm12x_paths.runs_on_12x(repo / "python")
    assert gate.trtllm_mha_runs("prefill") is True and found[("trtllm_mha", "prefill")] is True
    assert gate.trtllm_mha_runs("decode") is True and found[("trtllm_mha", "decode")] is True
    assert gate.why_not("trtllm_mha", "prefill") is None
    assert gate.working_backends("prefill") == ["flashinfer", "triton", "trtllm_mha"]


# -- how main is labelled ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_main_commit_follows_the_release_branched_off_its_history(main_repo):
    """git describe names v0.5.6.post2 for every main commit after 0.5.6.post2; the commit follows 0.5.18,
    whose branch was cut from its history. The retired double-sparsity patch (releases <0.5.11) is then
    not applicable by its range, not a file that is gone, and --error-on-warn passes."""
    repo, shas = main_repo
    assert _git("describe", "--tags", "--abbrev=0", cwd=repo) == "v0.5.6.post2"
    code, data = run_json("check-upstream", str(repo), "--error-on-warn")
    assert code == 0 and data["warnings"] == [], data
    target = data["target"]
    assert (target["version"], target["exact_release"]) == ("0.5.18", False)
    assert "v0.5.18" in target["release_source"] and shas["branch-point"][:12] in target["release_source"]
    assert "setuptools-scm" in target["release_source"]
    patches = {p["id"]: p for p in data["patches"]}
    sparsity = patches["sm120-double-sparsity-attention"]
    assert sparsity["status"] == "not-applicable" and sparsity["moved"] == [] and sparsity["warnings"] == []
    assert "outside every variant's range" in sparsity["detail"] and "retired" in sparsity["detail"]
    assert patches[GATING]["status"] == "applies" and patches[GATING]["variant"] == "0.5.12.diff"

    code, data = run_json("check-upstream", "--ref", "main", "--repo", str(repo), "--no-fetch", "--error-on-warn")
    assert code == 0, data
    assert (data["target"]["version"], data["target"]["exact_release"]) == ("0.5.18", False)
    code, data = run_json("apply", str(repo), "--dry-run")
    assert code == 0 and (data["release"], data["exact_release"]) == ("0.5.18", False), data
    assert "v0.5.18" in data["release_source"]
    # The branch point itself is before 0.5.18 (its tag contains it): main after 0.5.11.
    code, data = run_json("check-upstream", "--ref", shas["branch-point"], "--repo", str(repo), "--no-fetch")
    assert code == 0 and data["target"]["version"] == "0.5.11", data


@pytest.mark.slow
def test_a_main_commit_between_releases_reports_no_missing_files(main_repo):
    """Main with 0.5.12's files follows 0.5.11 (git describe: v0.5.6.post2). The retired double-sparsity
    patch ('<0.5.11') is not applicable by its range, and the inkling MoE patch, whose ranges start at
    0.5.16, is not applicable because its code is not there yet: neither is a file that is gone."""
    repo, shas = main_repo
    assert _git("describe", "--tags", "--abbrev=0", shas["0.5.12"], cwd=repo) == "v0.5.6.post2"
    code, data = run_json(
        "check-upstream", "--ref", shas["0.5.12"], "--repo", str(repo), "--no-fetch", "--error-on-warn"
    )
    assert code == 0 and data["warnings"] == [], data
    assert (data["target"]["version"], data["target"]["exact_release"]) == ("0.5.11", False)
    patches = {p["id"]: p for p in data["patches"]}
    for patch_id, words in (
        ("sm120-double-sparsity-attention", "retired"),
        ("sm120-inkling-moe-stages", "not there yet"),
    ):
        assert patches[patch_id]["status"] == "not-applicable" and patches[patch_id]["moved"] == [], patch_id
        assert words in patches[patch_id]["detail"], patches[patch_id]["detail"]
    assert patches[GATING]["status"] == "applies"


@pytest.mark.slow
def test_a_release_committed_without_its_tag_is_that_release(tmp_path, release_dir):
    """The files of the 0.5.23 wheel committed to a repository of their own (no tags): _version.py states
    0.5.23 and nothing places HEAD after it, so the tree is exactly 0.5.23. With a v0.5.23 tag on an earlier
    commit it is a commit after 0.5.23."""
    repo = tmp_path / "vendored"
    (repo / "python").mkdir(parents=True)
    _git("init", "-q", "-b", "main", cwd=repo)
    _put_release(repo, "0.5.23", release_dir, version_file=True)
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "SGLang 0.5.23 as published", cwd=repo)
    code, data = run_json("check-upstream", str(repo), "--error-on-warn")
    assert code == 0, data
    assert (data["target"]["version"], data["target"]["exact_release"]) == ("0.5.23", True)
    assert "python/sglang/_version.py" in data["target"]["release_source"]
    code, data = run_json("apply", str(repo), "--dry-run")
    assert code == 0 and (data["release"], data["exact_release"]) == ("0.5.23", True), data

    _git("tag", "v0.5.23", cwd=repo)
    _git("commit", "-q", "--allow-empty", "-m", "a local change after 0.5.23", cwd=repo)
    code, data = run_json("apply", str(repo), "--dry-run")
    assert code == 0 and (data["release"], data["exact_release"]) == ("0.5.23", False), data


# -- gating on a main that runs trtllm_mha prefill on SM120 ------------------------------------------------


@pytest.mark.slow
def test_check_upstream_reports_a_gate_that_would_disable_a_working_backend(main_repo, tmp_path):
    repo, _ = main_repo
    fixed = _fixed_gate_series(tmp_path)
    code, data = run_json("check-upstream", str(repo), "--series", str(fixed))
    assert code == 0, data
    gating = next(p for p in data["patches"] if p["id"] == GATING)
    assert (gating["status"], gating["variant"]) == ("applies", "0.5.12.diff")
    [warning] = gating["warnings"]
    assert "would refuse trtllm_mha for prefill on 12.x" in warning and "trtllm_fmha_v2_prefill" in warning
    assert "5d12280ae7" in warning
    code, data = run_json("check-upstream", str(repo), "--series", str(fixed), "--error-on-warn")
    assert code == 14 and data["exit_code"] == 14
    code, data = run_json("matrix", str(repo), "--series", str(fixed))
    [row] = data["rows"]
    assert any("would refuse trtllm_mha for prefill" in w for w in row["warnings"]), row
    # The bundled series reads the tree: nothing to report. On 0.5.18 as released (no SM120 prefill path)
    # the fixed value agrees with the tree, so that is quiet too.
    code, data = run_json("check-upstream", str(repo), "--error-on-warn")
    assert code == 0 and data["warnings"] == [], data
    code, data = run_json("check-upstream", "--release", "0.5.18", "--series", str(fixed), "--error-on-warn")
    assert code == 0 and data["warnings"] == [], data


@pytest.mark.slow
def test_patched_main_accepts_trtllm_mha_prefill_on_12x(main_repo, tmp_path):
    """SGLang's own argument resolution on a faked 12.0 device: main after PR #23112 accepts
    --prefill-attention-backend trtllm_mha; patched with the series it still does; patched with a gate that
    fixes prefill to False (the variant as it was) it refuses it."""
    from sm120kit.audit.backends import resolve_many

    repo, _ = main_repo
    fixed = _fixed_gate_series(tmp_path)
    clones = {}
    for name, series in (("bundled", SERIES), ("fixed", fixed)):
        clone = tmp_path / name
        _git("clone", "-q", str(repo), str(clone), cwd=tmp_path)
        code, data = run_json("apply", str(clone), "--series", str(series))
        assert code == 0, data
        assert next(p for p in data["patches"] if p["id"] == GATING)["status"] == "applied"
        clones[name] = clone / "python"
    requests = [("llama-mha", PREFILL), ("llama-mha", ("--attention-backend", "trtllm_mha"))]
    trees = {"unpatched": repo / "python", **clones}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(trees, pool.map(lambda root: resolve_many(root, requests, "12.0"), trees.values())))
    for name in ("unpatched", "bundled"):
        prefill_only, both = results[name]
        assert prefill_only.status == "resolved", (name, prefill_only.error)
        assert prefill_only.backends["attention_prefill"] == "trtllm_mha", name
        assert both.status == "resolved", (name, both.error)
        assert both.backends["attention_prefill"] == both.backends["attention_decode"] == "trtllm_mha", name
    for result in results["fixed"]:
        assert result.status == "rejected" and result.error_type == "ValueError", result.error
        assert "trtllm_mha (used for prefill)" in result.error and "need SM100" in result.error
