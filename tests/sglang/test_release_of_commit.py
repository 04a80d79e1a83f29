"""The one reader of a commit's release (sm120kit.sglang.gitrepo.release_of_commit)."""

from __future__ import annotations

import subprocess

from sm120kit.sglang.gitrepo import SglangClone, release_of_commit, release_tag


def _git(*args, cwd):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True
    )


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


def _commit(cwd, message):
    _git("commit", "-q", "--allow-empty", "-m", message, cwd=cwd)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_release_tags_on_release_branches(tmp_path):
    """SGLang's layout from 0.5.7 on: releases are tagged on branches cut from main, so main's own history
    holds only the old tags and ``git describe`` on a main commit names v0.5.6.post2 however late it is."""
    repo = tmp_path
    _git("init", "-q", "-b", "main", cwd=repo)
    sha = {"c1": _commit(repo, "c1")}
    _git("tag", "-a", "-m", "0.5.6.post2", "v0.5.6.post2", cwd=repo)  # annotated, as upstream's are
    sha["c2"] = _commit(repo, "c2")
    _git("checkout", "-q", "-b", "release/v0.5.10", cwd=repo)
    _commit(repo, "rc")
    _git("tag", "v0.5.10rc0", cwd=repo)
    _commit(repo, "final")
    _git("tag", "v0.5.10", cwd=repo)
    sha["r3"] = _commit(repo, "a fix after 0.5.10 on its branch")
    _git("checkout", "-q", "main", cwd=repo)
    sha["c3"] = _commit(repo, "c3")
    _git("checkout", "-q", "-b", "release/v0.5.18", cwd=repo)
    _commit(repo, "release 0.5.18")
    _git("tag", "v0.5.18", cwd=repo)
    _git("checkout", "-q", "main", cwd=repo)
    sha["c4"] = _commit(repo, "c4")

    found = release_of_commit(repo, sha["c4"])
    assert (found.release, found.exact, found.fork) == ("0.5.18", False, sha["c3"])  # git describe: 0.5.6.post2
    assert "v0.5.18" in found.describe() and sha["c3"][:12] in found.describe()
    # Before the 0.5.18 branch was cut, after the 0.5.10 one: 0.5.10, the highest release forked there.
    assert (release_of_commit(repo, sha["c3"]).release, release_of_commit(repo, sha["c3"]).fork) == (
        "0.5.10",
        sha["c2"],
    )
    # On main before any release branch: the tag in its history. The later tags contain it: not before it.
    found = release_of_commit(repo, sha["c2"])
    assert (found.release, found.fork) == ("0.5.6.post2", None)
    # A fix on the 0.5.10 branch follows 0.5.10, not 0.5.18, whose branch left main later but not its history.
    found = release_of_commit(repo, sha["r3"])
    assert (found.release, found.exact, found.fork) == ("0.5.10", False, None)
    found = release_of_commit(repo, "v0.5.18")
    assert (found.release, found.exact) == ("0.5.18", True)
    assert release_of_commit(repo, sha["c4"], follow=False).release is None
