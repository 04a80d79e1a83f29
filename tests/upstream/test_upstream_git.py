"""Upgrade checks on synthetic SGLang git histories, built in each test with real git from real files.

The upstream repository starts as six files of the SGLang 0.5.2 wheel (tag v0.5.2), then gets one
commit per event the test series (tests/data/upstream-series) must recognise, and a version bump
tagged v0.5.3:

- the context of ``up-prefill-block``'s hunk changes (commit "prefill-context"): a conflict, with that
  commit named and an unrelated commit to the same file left out;
- ``up-extend-flag``'s exact lines are merged upstream: present-upstream (the diff reverse-applies);
- ``up-decode-splits``'s file moves to kernels/ops/attention/: not-applicable, new path found;
- ``up-capability-helper``'s helper is added upstream in other words: present-upstream (marker).

The user's clone is made before those commits exist, so ``--ref origin/main`` has to fetch them, and the
clone must be exactly as it was afterwards. Everything runs through ``python -m sm120kit``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import git
import pytest
from apply_support import run_cli, run_json
from conftest import DATA_DIR

from sm120kit.patching.series import load_series

SERIES = DATA_DIR / "upstream-series"
TRITON_OPS = "sglang/srt/layers/attention/triton_ops"
FILES = (
    "sglang/__init__.py",
    "sglang/version.py",
    "sglang/srt/utils.py",
    f"{TRITON_OPS}/prefill_attention.py",
    f"{TRITON_OPS}/extend_attention.py",
    f"{TRITON_OPS}/decode_attention.py",
)
MOVED_DECODE = "sglang/kernels/ops/attention/decode_attention.py"


def _repo(path: Path) -> git.Repo:
    repo = git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "SGLang tests")
        cfg.set_value("user", "email", "tests@sm120kit.invalid")
        cfg.set_value("gc", "auto", "0")
    return repo


def _edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / "python" / rel
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {rel}"
    path.write_text(text.replace(old, new))


def _commit(repo: git.Repo, message: str) -> str:
    repo.git.add("-A")
    repo.git.commit("-q", "-m", message)
    return repo.head.commit.hexsha


@pytest.fixture
def history(tmp_path, release_dir):
    """(upstream repo root, user clone root, {event: sha}); the clone is taken right after v0.5.2."""
    up = tmp_path / "upstream"
    for rel in FILES:
        dest = up / "python" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(release_dir("0.5.2") / rel, dest)
    repo = _repo(up)
    shas = {"base": _commit(repo, "SGLang 0.5.2")}
    repo.git.tag("v0.5.2")
    user = tmp_path / "user-clone"
    git.Repo.clone_from(str(up), str(user))

    _edit(
        up,
        f"{TRITON_OPS}/prefill_attention.py",
        "Memory-efficient attention for prefill.",
        "Memory-efficient attention for prefill (Triton).",
    )
    shas["unrelated"] = _commit(repo, "Prefill attention: docstring")
    _edit(
        up, f"{TRITON_OPS}/prefill_attention.py", "        BLOCK = 128\n", "        BLOCK = 128  # Hopper and newer\n"
    )
    shas["prefill-context"] = _commit(repo, "Prefill attention: note which GPUs take BLOCK 128")
    _edit(
        up,
        f"{TRITON_OPS}/extend_attention.py",
        "_is_hip = is_hip()\n\n",
        "_is_hip = is_hip()\n# SM12x (RTX PRO 6000 Blackwell, RTX 5090, DGX Spark) take their own tile sizes.\n"
        "_is_sm12x = _is_cuda and CUDA_CAPABILITY[0] == 12\n\n",
    )
    shas["extend-merged"] = _commit(repo, "Extend attention: SM12x flag")
    (up / "python" / MOVED_DECODE).parent.mkdir(parents=True)
    repo.git.mv(f"python/{TRITON_OPS}/decode_attention.py", f"python/{MOVED_DECODE}")
    _edit(up, MOVED_DECODE, "import triton\n", "import triton  # kernels live in sglang.kernels now\n")
    shas["decode-moved"] = _commit(repo, "Move the decode kernels to sglang/kernels/ops/attention")
    _edit(
        up,
        "sglang/srt/utils.py",
        "_warned_bool_env_var_keys = set()\n",
        "@lru_cache(maxsize=1)\ndef is_sm120_supported(device=None) -> bool:\n"
        "    major, _ = torch.cuda.get_device_capability(device)\n"
        "    return major == 12 and torch.version.cuda is not None\n\n\n_warned_bool_env_var_keys = set()\n",
    )
    shas["capability"] = _commit(repo, "utils: is_sm120_supported")
    _edit(up, "sglang/version.py", '"0.5.2"', '"0.5.3"')
    shas["release"] = _commit(repo, "Release 0.5.3")
    repo.git.tag("v0.5.3")

    repo.git.checkout("-q", "-b", "conflicting", "v0.5.2")
    _edit(
        up, f"{TRITON_OPS}/prefill_attention.py", "    else:\n        BLOCK = 64\n", "    else:\n        BLOCK = 32\n"
    )
    shas["conflicting"] = _commit(repo, "Prefill attention: BLOCK 32 below Hopper")
    repo.git.checkout("-q", "main")
    return up, user, shas


def _clone_state(user: Path) -> dict:
    repo = git.Repo(user)
    return {
        "head": repo.head.commit.hexsha,
        "branch": repo.active_branch.name,
        "status": repo.git.status("--porcelain"),
        "worktrees": repo.git.worktree("list", "--porcelain"),
        "files": sorted(p.relative_to(user).as_posix() for p in user.rglob("*") if ".git" not in p.parts),
    }


def _copy_series(tmp_path: Path, ids: list[str] | None = None) -> Path:
    dest = tmp_path / "series"
    shutil.copytree(SERIES, dest)
    if ids is not None:
        (dest / "series.toml").write_text("patches = [" + ", ".join(f'"{i}"' for i in ids) + "]\n")
        for folder in dest.iterdir():
            if folder.is_dir() and folder.name not in ids:
                shutil.rmtree(folder)
    return dest


def _hashes(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_check_upstream_ref_classifies_each_event_and_leaves_the_clone_alone(history):
    up, user, shas = history
    before = _clone_state(user)
    code, data = run_json("check-upstream", "--ref", "origin/main", "--repo", str(user), "--series", str(SERIES))
    assert code == 4, data
    assert data["target"]["commit"] == shas["release"], "the ref was not fetched"
    assert data["target"]["version"] == "0.5.3" and data["target"]["exact_release"] is True
    by_id = {p["id"]: p for p in data["patches"]}
    assert {i: p["status"] for i, p in by_id.items()} == {
        "up-prefill-block": "conflict",
        "up-extend-flag": "present-upstream",
        "up-decode-splits": "not-applicable",
        "up-capability-helper": "present-upstream",
    }

    prefill = by_id["up-prefill-block"]
    assert prefill["variant"] == "0.5.2.diff"
    [hunk] = prefill["hunks"]
    assert hunk["file"] == f"{TRITON_OPS}/prefill_attention.py" and hunk["index"] == 1
    assert "        BLOCK = 128  # Hopper and newer" in hunk["found"]
    assert "-        BLOCK = 128" in hunk["changed"]
    assert "+        BLOCK = 128  # Hopper and newer" in hunk["changed"]
    assert [c["sha"] for c in hunk["commits"]] == [shas["prefill-context"]], hunk
    assert hunk["commits"][0]["subject"] == "Prefill attention: note which GPUs take BLOCK 128"
    assert hunk["history"].startswith("git log -L")

    extend = by_id["up-extend-flag"]
    assert "reverse-applies" in extend["detail"]
    assert any("no marker" in w for w in extend["warnings"])

    decode = by_id["up-decode-splits"]
    [moved] = decode["moved"]
    assert moved["old"] == f"{TRITON_OPS}/decode_attention.py" and moved["new"] == MOVED_DECODE
    assert moved["similarity"] >= 0.9 and moved["compared"] == "file"
    assert MOVED_DECODE in decode["detail"]

    assert "upstream marker found: sglang/srt/utils.py:" in by_id["up-capability-helper"]["detail"]
    assert data["exit_code"] == 4 and "up-prefill-block" in data["message"]

    after = _clone_state(user)
    assert after == before, "the user's clone changed"
    assert git.Repo(user).commit("origin/main").hexsha == shas["release"]


def test_markdown_table_and_exit_codes(history, tmp_path):
    _, user, shas = history
    proc = run_cli(
        "check-upstream", "--ref", "origin/main", "--repo", str(user), "--series", str(SERIES), "--format", "markdown"
    )
    assert proc.returncode == 4
    md = proc.stdout
    assert md.startswith("### sm120kit check-upstream: SGLang `origin/main @ ")
    assert "| patch | status | variant | detail |" in md
    assert "| `up-prefill-block` | **CONFLICT** | 0.5.2.diff |" in md
    assert f"upstream `{shas['prefill-context'][:12]}`" in md and "```diff" in md
    assert "**Warnings**" in md and "Traceback" not in proc.stderr

    proc = run_cli("check-upstream", "--ref", "origin/main", "--repo", str(user), "--series", str(SERIES), "--no-fetch")
    out = proc.stdout
    assert proc.returncode == 4 and "up-prefill-block      CONFLICT" in out
    assert "upstream commits that changed these lines (git log -L" in out
    assert f"{shas['prefill-context'][:12]}" in out and shas["unrelated"][:12] not in out
    assert "error: 1 patch(es) conflict with SGLang origin/main" in proc.stderr

    # Without the conflicting patch: exit 0, but the moved file and the missing marker are warnings.
    series = _copy_series(tmp_path, ["up-extend-flag", "up-decode-splits", "up-capability-helper"])
    proc = run_cli("check-upstream", "--ref", "v0.5.3", "--repo", str(user), "--series", str(series))
    assert proc.returncode == 0, proc.stderr
    assert "moved to sglang/kernels/ops/attention/decode_attention.py" in proc.stderr
    code, data = run_json(
        "check-upstream", "--ref", "v0.5.3", "--repo", str(user), "--series", str(series), "--error-on-warn"
    )
    assert code == 14 and data["exit_code"] == 14 and len(data["warnings"]) == 2

    proc = run_cli("check-upstream", "--ref", "no-such-branch", "--repo", str(user), "--series", str(series))
    assert proc.returncode == 2 and "'no-such-branch' does not name a commit" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("check-upstream", "--ref", "v0.5.3", "--release", "0.5.2", "--series", str(series))
    assert proc.returncode == 2 and "exactly one target" in proc.stderr


def test_conflict_names_the_commit_on_a_branch_and_folder_targets_work(history):
    up, user, shas = history
    code, data = run_json("check-upstream", "--ref", "origin/conflicting", "--repo", str(user), "--series", str(SERIES))
    assert code == 4 and data["target"]["exact_release"] is False and data["target"]["version"] == "0.5.2"
    prefill = next(p for p in data["patches"] if p["id"] == "up-prefill-block")
    assert [c["sha"] for c in prefill["hunks"][0]["commits"]] == [shas["conflicting"]]
    others = {p["id"]: p["status"] for p in data["patches"] if p["id"] != "up-prefill-block"}
    assert set(others.values()) == {"applies"}

    # A folder (the upstream checkout itself, on main): same classification, history from its own repo.
    code, data = run_json("check-upstream", str(up), "--series", str(SERIES))
    assert code == 4 and data["target"]["kind"] == "folder"
    statuses = {p["id"]: p["status"] for p in data["patches"]}
    assert statuses["up-prefill-block"] == "conflict" and statuses["up-decode-splits"] == "not-applicable"
    assert data["patches"][0]["hunks"][0]["commits"][0]["sha"] == shas["prefill-context"]


@pytest.mark.slow
def test_refresh_rebuilds_variants_that_the_engine_then_applies(history, tmp_path):
    up, user, shas = history
    series = _copy_series(tmp_path)
    # up-decode-splits' metadata in another layout: its variants as an inline array, comments after values.
    decode_meta = series / "up-decode-splits" / "patch.toml"
    text = decode_meta.read_text()
    old_variants = '[[variants]]\ndiff = "0.5.2.diff"\nreleases = ">=0.5.2"\nbase = "0.5.2"\n\n'
    inline = (
        "variants = [\n  { diff = '0.5.2.diff', releases = '>=0.5.2', base = '0.5.2' },  # the first\n]  # inline\n\n"
    )
    assert text.count(old_variants) == 1
    decode_meta.write_text(text.replace(old_variants, "").replace("[upstream]\n", inline + "[upstream]\n"))
    decode_before = decode_meta.read_text()
    before = _hashes(series)
    clone_before = _clone_state(user)

    # A ref that is not a tagged release needs --as-release.
    proc = run_cli(
        "refresh", "up-prefill-block", "--ref", "origin/main~1", "--repo", str(user), "--series", str(series)
    )
    assert proc.returncode == 2 and "--as-release" in proc.stderr

    # --dry-run prints the new diff and writes nothing.
    proc = run_cli(
        "refresh", "up-prefill-block", "--ref", "origin/main", "--repo", str(user), "--series", str(series), "--dry-run"
    )
    assert proc.returncode == 0, proc.stderr
    assert "+        # sm120kit test patch: 99 KB of shared memory per block on SM12x." in proc.stdout
    assert "         BLOCK = 128  # Hopper and newer" in proc.stdout
    assert _hashes(series) == before

    code, data = run_json(
        "refresh", "up-prefill-block", "--ref", "origin/main", "--repo", str(user), "--series", str(series)
    )
    assert code == 0, data
    assert data["outcome"] == "written" and data["verified"] == "applies"
    assert data["new_variant"] == {"diff": "0.5.3.diff", "releases": ">=0.5.3", "base": "0.5.3"}
    assert data["old_variant_releases"] == {"before": ">=0.5.2", "after": ">=0.5.2,<0.5.3"}
    assert data["base_source"].startswith("tag v0.5.2 of ")
    assert [f["merge"] for f in data["files"]] == ["clean"]

    code, data = run_json(
        "refresh", "up-decode-splits", "--ref", "origin/main", "--repo", str(user), "--series", str(series)
    )
    assert code == 0 and data["outcome"] == "written", data
    [moved] = data["files"]
    assert moved["path"] == MOVED_DECODE and moved["old_path"] == f"{TRITON_OPS}/decode_attention.py"
    assert decode_meta.read_text() == decode_before.replace(
        "  { diff = '0.5.2.diff', releases = '>=0.5.2', base = '0.5.2' },  # the first\n",
        "  { diff = '0.5.2.diff', releases = '>=0.5.2,<0.5.3', base = '0.5.2' },  # the first\n"
        '  {diff = "0.5.3.diff", releases = ">=0.5.3", base = "0.5.3"},\n',
    )

    # Present upstream: nothing to write.
    code, data = run_json(
        "refresh", "up-extend-flag", "--ref", "origin/main", "--repo", str(user), "--series", str(series)
    )
    assert code == 0 and data["outcome"] == "present-upstream" and data["written"] == []

    meta = (series / "up-prefill-block" / "patch.toml").read_text()
    assert 'releases = ">=0.5.2,<0.5.3"' in meta and "# A comment that refresh must keep." in meta
    assert meta.index("0.5.3.diff") < meta.index("[[markers]]")
    loaded = load_series(series)
    variants = {v.name: str(v.releases) for v in loaded.get("up-prefill-block").variants}
    assert set(variants) == {"0.5.2.diff", "0.5.3.diff"}
    assert _clone_state(user) == clone_before

    # Never overwrite silently: a second refresh for 0.5.3 is refused, --replace rebuilds in place.
    proc = run_cli("refresh", "up-prefill-block", "--ref", "origin/main", "--repo", str(user), "--series", str(series))
    assert proc.returncode == 8 and "already has variant 0.5.3.diff" in proc.stderr
    code, data = run_json(
        "refresh", "up-prefill-block", "--ref", "origin/main", "--repo", str(user), "--series", str(series), "--replace"
    )
    assert code == 0 and data["replaced"] is True and data["from_variant"] == "0.5.2.diff"

    # The proof: the patch engine applies the refreshed series to a clone of the new release.
    target = tmp_path / "apply-clone"
    git.Repo.clone_from(str(up), str(target), branch="v0.5.3")
    code, data = run_json("apply", str(target), "--series", str(series))
    assert code == 0, data
    statuses = {p["id"]: (p["status"], p["variant"]) for p in data["patches"]}
    assert statuses["up-prefill-block"] == ("applied", "0.5.3.diff")
    assert statuses["up-decode-splits"] == ("applied", "0.5.3.diff")
    prefill = (target / "python" / TRITON_OPS / "prefill_attention.py").read_text()
    assert (
        "BLOCK = 128  # Hopper and newer\n    else:\n        BLOCK = 64\n    if _is_cuda and CUDA_CAPABILITY[0] == 12:"
    ) in prefill
    decode = (target / "python" / MOVED_DECODE).read_text()
    assert "# sm120kit test patch: the split count must fit the logits buffer." in decode

    # And the upgrade check now passes on that release.
    code, data = run_json("check-upstream", "--ref", "v0.5.3", "--repo", str(user), "--series", str(series))
    assert code == 0 and {p["status"] for p in data["patches"]} == {"applies", "present-upstream"}


def _conflicting_refresh(user: Path, series: Path) -> tuple[str, ...]:
    """refresh of up-prefill-block onto origin/conflicting, where upstream changed the lines the patch changes."""
    return (
        "refresh",
        "up-prefill-block",
        "--ref",
        "origin/conflicting",
        "--repo",
        str(user),
        "--as-release",
        "0.5.3",
        "--series",
        str(series),
    )


def test_refresh_merge_conflict_is_left_for_a_person(history, tmp_path):
    _, user, _ = history
    series = _copy_series(tmp_path)
    before = _hashes(series)
    args = _conflicting_refresh(user, series)
    code, data = run_json(*args)
    assert code == 4, data
    assert data["outcome"] == "conflict" and data["written"] == []
    [merged] = data["files"]
    assert merged["merge"] == "conflict"
    [conflict] = merged["conflicts"]
    assert conflict["upstream"] == ["        BLOCK = 32"]
    assert conflict["base"] == ["        BLOCK = 64"]
    assert "        # sm120kit test patch: 99 KB of shared memory per block on SM12x." in conflict["patch"]
    assert _hashes(series) == before, "the series changed although the merge conflicted"
    draft = Path(data["draft_dir"])
    text = (draft / TRITON_OPS / "prefill_attention.py").read_text()
    assert "<<<<<<< sglang origin/conflicting" in text and ">>>>>>> up-prefill-block 0.5.2.diff" in text
    assert (draft / "0.5.3.diff").is_file()

    proc = run_cli(*args)
    assert proc.returncode == 4
    assert f"needs a person: {TRITON_OPS}/prefill_attention.py line" in proc.stdout
    assert "error: up-prefill-block: the merge onto origin/conflicting" in proc.stderr
    json.loads(run_cli(*args, "--json").stdout)


def test_refresh_takes_a_resolution_from_the_draft_folder(history, tmp_path):
    up, user, _ = history
    series = _copy_series(tmp_path)
    args = _conflicting_refresh(user, series)
    code, data = run_json(*args)
    assert code == 4
    draft = Path(data["draft_dir"])
    merged = draft / TRITON_OPS / "prefill_attention.py"
    text = merged.read_text()

    proc = run_cli(*args, "--resolved", str(draft))
    assert proc.returncode == 2 and "still has conflict markers" in proc.stderr

    # A person keeps upstream's BLOCK = 32 and the patch's SM12x branch.
    start, end = text.index("<<<<<<< "), text.index(">>>>>>> ")
    end = text.index("\n", end) + 1
    resolution = (
        "        BLOCK = 32\n    if _is_cuda and CUDA_CAPABILITY[0] == 12:\n"
        "        # sm120kit test patch: 99 KB of shared memory per block on SM12x.\n"
        "        BLOCK = 64\n"
    )
    merged.write_text(text[:start] + resolution + text[end:])
    code, data = run_json(*args, "--resolved", str(draft))
    assert code == 0 and data["outcome"] == "written" and data["verified"] == "applies", data
    assert [f["merge"] for f in data["files"]] == ["resolved"]

    target = tmp_path / "apply-clone"
    git.Repo.clone_from(str(up), str(target), branch="conflicting")
    code, data = run_json("apply", str(target), "--series", str(series))
    assert code == 0, data
    prefill = next(p for p in data["patches"] if p["id"] == "up-prefill-block")
    assert (prefill["status"], prefill["variant"]) == ("applied", "0.5.3.diff")
    assert resolution in (target / "python" / TRITON_OPS / "prefill_attention.py").read_text()


def test_matrix_over_refs_and_a_release(history):
    _, user, shas = history
    code, data = run_json(
        "matrix",
        "--releases",
        "0.5.2",
        "--ref",
        "origin/main",
        "--ref",
        "origin/conflicting",
        "--repo",
        str(user),
        "--series",
        str(SERIES),
    )
    assert code == 4, data
    labels = [r["target"]["label"] for r in data["rows"]]
    assert labels == [
        "0.5.2",
        f"origin/main @ {shas['release'][:12]}",
        f"origin/conflicting @ {shas['conflicting'][:12]}",
    ]
    release, main, conflicting = (r["cells"] for r in data["rows"])
    assert set(release.values()) == {"0.5.2"}, "the series applies as made on the real 0.5.2"
    assert main == {
        "up-prefill-block": "CONFLICT",
        "up-extend-flag": "upstream",
        "up-decode-splits": "moved",
        "up-capability-helper": "upstream",
    }
    assert conflicting["up-prefill-block"] == "CONFLICT" and conflicting["up-decode-splits"] == "0.5.2"
    assert "conflicts on 2 target(s)" in data["message"]
    assert git.Repo(user).git.worktree("list", "--porcelain").count("worktree ") == 1
