"""``fetch-deps`` where the declared hosts cannot be reached: archives made from a local clone
(``--from-git``) and checked against ``URL_HASH``, folders filled by hand kept as "provided", and every
dependency that cannot be had named with how to provide it (the others are still fetched).

The declared host (``sm120kit.invalid``) never resolves, so nothing here reaches a network. The local clone
is a real git repository; the expected hash of its archive is computed from the tarball made by ``git archive``
and GNU ``gzip -n``, which is how GitHub makes ``/archive/REF.tar.gz`` (checked byte for byte against the
published archives of fmt and FlashInfer pinned by SGLang 0.5.18: docs/build-kernel.md).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from build_support import PACKAGES, git, make_dependency_mirror, run_cli

HOST = "https://sm120kit.invalid/owner"

pytestmark = pytest.mark.skipif(shutil.which("gzip") is None, reason="gzip is not on PATH")


def _source(tmp_path: Path, declarations: str) -> Path:
    src = tmp_path / "src"
    src.mkdir(parents=True)
    (src / "pyproject.toml").write_text('[project]\nname = "local-kernel"\nversion = "0.1.0"\n')
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.26)\nproject(local)\ninclude(FetchContent)\n" + declarations
    )
    return src


def _github_tarball(repo: Path, ref: str, prefix: str, dest: Path) -> str:
    """SHA-256 of ``git archive --format=tar --prefix=PREFIX/ REF | gzip -n`` (GitHub's recipe)."""
    tar = dest / "expected.tar"
    subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", f"--prefix={prefix}/", "-o", str(tar), ref], check=True
    )
    subprocess.run(["gzip", "-n", "-f", str(tar)], check=True)
    return hashlib.sha256((dest / "expected.tar.gz").read_bytes()).hexdigest()


def _declare_url(name: str, url: str, sha256: str) -> str:
    return f"FetchContent_Declare(\n    {name}\n    URL      {url}\n    URL_HASH SHA256={sha256}\n)\n"


@pytest.fixture
def clone(tmp_path) -> Path:
    """A local clone of "owner/minidep" with tag v1.0 and a second commit after it."""
    repo = make_dependency_mirror(tmp_path) / "minidep.git"
    (repo / "NEWS").write_text("after 1.0\n")
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "after 1.0", cwd=repo)
    return repo


def _fetch(src: Path, into: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_cli("fetch-deps", str(src), "--into", str(into), *extra)


def test_archives_are_made_from_a_local_clone_and_hash_checked(tmp_path, clone):
    commit = git("rev-parse", "HEAD~1", cwd=clone).strip()
    # GitHub names a tag's folder without its leading "v": minidep-1.0/; a commit's folder: minidep-<sha>/
    tag_hash = _github_tarball(clone, "v1.0", "minidep-1.0", tmp_path)
    commit_hash = _github_tarball(clone, commit, f"minidep-{commit}", tmp_path)
    src = _source(
        tmp_path,
        _declare_url("repo-tagged", f"{HOST}/minidep/archive/v1.0.tar.gz", tag_hash)
        + _declare_url("repo-pinned", f"{HOST}/minidep/archive/{commit}.tar.gz", commit_hash),
    )
    into = tmp_path / "deps"
    proc = _fetch(src, into, "--from-git", f"{HOST}/minidep={clone}", "--json")
    assert proc.returncode == 0, proc.stderr
    deps = {d["name"]: d for d in json.loads(proc.stdout)["dependencies"]}
    assert deps["repo-tagged"]["status"] == "fetched" and deps["repo-tagged"]["revision"] == tag_hash
    assert deps["repo-pinned"]["revision"] == commit_hash and deps["repo-pinned"]["via"] == str(clone)
    for name in ("repo-tagged", "repo-pinned"):  # the archive's top folder is stripped, like FetchContent does
        assert (into / name / "include" / "minidep" / "minidep.h").is_file()
        assert not (into / name / "NEWS").exists()  # the tagged commit, not the clone's HEAD
    manifest = json.loads((into / "sm120kit-deps.json").read_text())
    assert manifest["repo-pinned"]["via"] == str(clone)
    again = _fetch(src, into, "--from-git", f"{HOST}/minidep={clone}", "--json")
    assert {d["status"] for d in json.loads(again.stdout)["dependencies"]} == {"present"}


def test_an_archive_that_does_not_match_url_hash_is_not_unpacked(tmp_path, clone):
    src = _source(tmp_path, _declare_url("repo-minidep", f"{HOST}/minidep/archive/v1.0.tar.gz", "ab" * 32))
    into = tmp_path / "deps"
    proc = _fetch(src, into, "--from-git", f"{HOST}/minidep={clone}")
    assert proc.returncode == 10, proc.stderr
    assert "the archive made from" in proc.stderr and "expects " + "ab" * 32 in proc.stderr
    assert "CMakeLists.txt:4" in proc.stderr and "Traceback" not in proc.stderr
    assert not (into / "repo-minidep").exists()


def test_a_commit_the_clone_lacks_is_named_and_the_others_are_still_fetched(tmp_path, clone):
    data = PACKAGES / "minidata-1.0.tar.gz"
    data_hash = hashlib.sha256(data.read_bytes()).hexdigest()
    missing = "0123456789abcdef0123456789abcdef01234567"
    src = _source(
        tmp_path,
        _declare_url("repo-absent", f"{HOST}/minidep/archive/{missing}.tar.gz", "00" * 32)
        + _declare_url("repo-offline", f"{HOST}/minidata/archive/v1.0.tar.gz", "11" * 32)
        + _declare_url("repo-minidata", data.as_uri(), data_hash),
    )
    into = tmp_path / "deps"
    proc = _fetch(src, into, "--from-git", f"{HOST}/minidep={clone}", "--json")
    assert proc.returncode == 10, proc.stderr  # DownloadError, the first failure's class
    result = json.loads(proc.stdout)
    assert result["ok"] is False
    statuses = {d["name"]: d["status"] for d in result["dependencies"]}
    assert statuses == {"repo-absent": "failed", "repo-offline": "failed", "repo-minidata": "fetched"}
    assert (into / "repo-minidata" / "minidata.h").is_file()
    # one message names each failure, why, and how to provide it
    assert "2 of 3 dependencies could not be fetched" in proc.stderr
    assert f"needs {missing} of {HOST}/minidep, which the local repository {clone} does not hold" in proc.stderr
    assert f"git -C {clone} fetch origin {missing}" in proc.stderr
    assert f"Could not download 'repo-offline' from {HOST}/minidata/archive/v1.0.tar.gz" in proc.stderr
    assert "FETCHCONTENT_SOURCE_DIR_REPO-OFFLINE" in proc.stderr and "Traceback" not in proc.stderr


def test_a_folder_filled_by_hand_is_kept_as_provided(tmp_path):
    src = _source(tmp_path, _declare_url("repo-handmade", f"{HOST}/handmade/archive/v1.0.tar.gz", "22" * 32))
    into = tmp_path / "deps"
    mine = into / "repo-handmade"
    mine.mkdir(parents=True)
    (mine / "handmade.h").write_text("#define HANDMADE 1\n")
    proc = _fetch(src, into, "--json")
    assert proc.returncode == 0, proc.stderr
    (dep,) = json.loads(proc.stdout)["dependencies"]
    assert dep["status"] == "provided" and dep["revision"] is None
    assert sorted(p.name for p in mine.iterdir()) == ["handmade.h"]
    assert (mine / "handmade.h").read_text() == "#define HANDMADE 1\n"
    plan = run_cli("build-kernel", str(src), "--out", str(tmp_path / "out"), "--deps-dir", str(into), "--dry-run")
    assert f"FETCHCONTENT_SOURCE_DIR_REPO-HANDMADE={mine}" in plan.stdout


def test_a_git_dependency_is_fetched_from_the_local_clone(tmp_path, clone):
    src = _source(
        tmp_path,
        f"FetchContent_Declare(\n    repo-minidep\n    GIT_REPOSITORY {HOST}/minidep.git\n    GIT_TAG v1.0\n)\n",
    )
    into = tmp_path / "deps"
    proc = _fetch(src, into, "--from-git", f"{HOST}/minidep={clone}", "--json")
    assert proc.returncode == 0, proc.stderr
    (dep,) = json.loads(proc.stdout)["dependencies"]
    assert dep["status"] == "fetched" and dep["revision"] == git("rev-parse", "v1.0^{commit}", cwd=clone).strip()
    assert (into / "repo-minidep" / "include" / "minidep" / "minidep.h").is_file()


@pytest.mark.parametrize("value", ["no-equals-sign", "relative=path", "https://sm120kit.invalid/x=NOT_A_REPO"])
def test_a_bad_from_git_value_is_a_usage_error(tmp_path, value):
    src = _source(tmp_path, "")
    if value.endswith("NOT_A_REPO"):
        (tmp_path / "plain").mkdir()
        value = value.replace("NOT_A_REPO", str(tmp_path / "plain"))
    proc = _fetch(src, tmp_path / "deps", "--from-git", value)
    assert proc.returncode == 2, proc.stderr
    assert "--from-git" in proc.stderr and "Traceback" not in proc.stderr
