"""The one reader of a commit's release (sm120kit.sglang.gitrepo.release_of_commit)."""

from __future__ import annotations

import subprocess

from sm120kit.sglang.gitrepo import SglangClone, release_of_commit, release_tag


def _git(*args, cwd):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_release_tag():
    assert release_tag("v0.5.23") == "0.5.23"
    assert release_tag("v0.5.10.dev3") == "0.5.10.dev3"
    for bad in ("0.5.2", "v1", "vfoo", "gateway-v0.1", ""):
        assert release_tag(bad) is None


def test_tagged_nearest_and_none(tmp_path):
    _git("init", "-q", cwd=tmp_path)
    (tmp_path / "f").write_text("1")
    _git("add", "f", cwd=tmp_path)
    _git("commit", "-qm", "one", cwd=tmp_path)
    assert release_of_commit(tmp_path).release is None and release_of_commit(tmp_path).readable
    _git("tag", "v0.5.2", cwd=tmp_path)
    _git("tag", "not-a-release", cwd=tmp_path)
    found = release_of_commit(tmp_path)
    assert (found.release, found.exact, found.tag) == ("0.5.2", True, "v0.5.2")
    (tmp_path / "f").write_text("2")
    _git("commit", "-qam", "two", cwd=tmp_path)
    found = release_of_commit(tmp_path)
    assert (found.release, found.exact, found.tag) == ("0.5.2", False, "v0.5.2")
    assert SglangClone(tmp_path).release_at("HEAD") == ("0.5.2", False)
    assert not release_of_commit(tmp_path / "missing").readable
