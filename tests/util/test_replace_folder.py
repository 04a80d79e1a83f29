"""Folders built in a temporary sibling and swapped in (``util.atomicfile.building_folder`` and
``replace_folder``): the old folder survives a failed build, a failed final rename and a kill between the
renames; leftovers of a killed run are cleaned up (or put back) by the next call; and every site that
replaces a cache folder (unpacked release, working copy, fetched dependency sources, dependency overlay)
keeps the old folder when its final rename fails."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from build_support import make_dependency_mirror
from conftest import REPO_ROOT

from sm120kit.errors import IOFailure
from sm120kit.util import atomicfile
from sm120kit.util.atomicfile import building_folder, replace_folder, sweep_temp_dirs


def _old(dest: Path) -> Path:
    dest.mkdir(parents=True)
    (dest / "keep.txt").write_text("old")
    return dest


def _siblings(dest: Path) -> list[str]:
    return sorted(os.listdir(dest.parent))


def _fail_final_rename(monkeypatch, dest: Path) -> list:
    """``os.replace`` fails once for the rename of the new folder onto ``dest`` (not for putting an old
    folder back from aside)."""
    real = os.replace
    failed = []

    def replace(src, dst, *args, **kwargs):
        if not failed and Path(dst) == dest and ".old@" not in Path(src).name:
            failed.append(src)
            raise OSError(5, "Input/output error (injected)")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    return failed


def test_the_new_folder_replaces_the_old_one(tmp_path):
    dest = _old(tmp_path / "dest")
    with building_folder(dest) as tmp:
        assert tmp.parent == dest.parent and tmp.name.startswith(".dest.tmp@")
        (tmp / "new.txt").write_text("new")
    assert sorted(os.listdir(dest)) == ["new.txt"]
    assert _siblings(dest) == ["dest"]


def test_the_old_folder_survives_a_failed_build(tmp_path):
    dest = _old(tmp_path / "dest")
    with pytest.raises(RuntimeError):
        with building_folder(dest) as tmp:
            (tmp / "half.txt").write_text("half")
            raise RuntimeError("the build failed")
    assert (dest / "keep.txt").read_text() == "old" and not (dest / "half.txt").exists()
    assert _siblings(dest) == ["dest"]


def test_the_old_folder_survives_a_failed_final_rename(tmp_path, monkeypatch):
    dest = _old(tmp_path / "dest")
    failed = _fail_final_rename(monkeypatch, dest)
    with pytest.raises(OSError, match="injected"):
        with building_folder(dest) as tmp:
            (tmp / "new.txt").write_text("new")
    assert failed
    assert sorted(os.listdir(dest)) == ["keep.txt"]
    assert _siblings(dest) == ["dest"]


@pytest.mark.parametrize("umask,expected", [(0o022, 0o755), (0o002, 0o775)])
def test_the_new_folder_follows_the_umask(tmp_path, umask, expected):
    previous = os.umask(umask)
    try:
        with building_folder(tmp_path / "dest") as tmp:
            (tmp / "f").write_text("x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "dest").stat().st_mode) == expected


_KILLED = """
import os, signal, sys
from pathlib import Path
from sm120kit.util.atomicfile import building_folder
dest, when = Path(sys.argv[1]), sys.argv[2]
real, calls = os.replace, []
def replace(src, dst):
    calls.append(src)
    if when == "between-renames" and len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst)
os.replace = replace
with building_folder(dest) as tmp:
    (tmp / "new.txt").write_text("new")
    if when == "building":
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("when", ["building", "between-renames"])
def test_leftovers_of_a_killed_run_are_cleaned_up_by_the_next_call(tmp_path, when):
    dest = _old(tmp_path / "dest")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-c", _KILLED, str(dest), when], env=env, cwd=REPO_ROOT)
    assert proc.returncode == -signal.SIGKILL
    leftovers = [n for n in _siblings(dest) if n.startswith(".")]
    assert leftovers  # the killed run's temporary (or set-aside old) folder
    if when == "between-renames":
        assert not dest.exists()  # the old one is aside under a recognisable name, not gone
    assert sweep_temp_dirs(dest.parent, dest.name)
    assert _siblings(dest) == ["dest"] and (dest / "keep.txt").read_text() == "old"
    with building_folder(dest) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(os.listdir(dest)) == ["new.txt"] and _siblings(dest) == ["dest"]


def test_a_live_runs_folders_are_left_alone(tmp_path):
    _old(tmp_path / "dest")
    mine = atomicfile.make_temp_dir(tmp_path, "dest")
    aside = tmp_path / f".dest.old@{atomicfile.socket.gethostname()}@{os.getpid()}@abcd"
    aside.mkdir()
    assert sweep_temp_dirs(tmp_path, "dest") == []
    assert mine.is_dir() and aside.is_dir()


def test_a_long_name_keeps_its_temporary_names_short_and_recognisable(tmp_path):
    name = "x" * 240
    with building_folder(tmp_path / name) as tmp:
        assert len(tmp.name) < 255
    assert os.listdir(tmp_path) == [name]


def test_a_link_at_the_destination_is_replaced_without_touching_its_target(tmp_path):
    target = _old(tmp_path / "target")
    (tmp_path / "dest").symlink_to(target, target_is_directory=True)
    new = atomicfile.make_temp_dir(tmp_path, "dest")
    replace_folder(new, tmp_path / "dest")
    assert not (tmp_path / "dest").is_symlink() and (target / "keep.txt").read_text() == "old"


# -- the sites ----------------------------------------------------------------------------------------------


def test_release_unpack_keeps_the_old_release_when_the_rename_fails(tmp_path, monkeypatch):
    from sm120kit.sglang import releases

    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang/__init__.py", "")
    dest = _old(tmp_path / "releases" / "9.9.9")
    _fail_final_rename(monkeypatch, dest)
    with pytest.raises(IOFailure, match="injected"):  # the disk's error, named (exit 7)
        releases._unpack(wheel, dest)
    assert sorted(os.listdir(dest)) == ["keep.txt"] and _siblings(dest) == ["9.9.9"]
    releases._unpack(wheel, dest)
    assert sorted(os.listdir(dest)) == ["sglang"] and _siblings(dest) == ["9.9.9"]


def test_fresh_work_copy_keeps_the_old_copy_when_the_rename_fails(tmp_path, monkeypatch):
    from sm120kit.errors import IOFailure
    from sm120kit.sglang import releases, workcopy

    pristine = tmp_path / "pristine"
    (pristine / "sglang").mkdir(parents=True)
    (pristine / "sglang" / "__init__.py").write_text("")
    monkeypatch.setattr(releases, "fetch_release", lambda version, **kw: pristine)
    dest = workcopy.work_dir("9.9.9", tmp_path / "cache")
    _old(dest)
    (dest / "sglang").mkdir()
    (dest / "sglang" / "__init__.py").write_text("# patched by the user")
    _fail_final_rename(monkeypatch, dest)
    with pytest.raises(IOFailure, match="injected"):
        workcopy.work_copy("9.9.9", fresh=True, cache=tmp_path / "cache")
    assert (dest / "sglang" / "__init__.py").read_text() == "# patched by the user"
    assert _siblings(dest) == ["9.9.9"]


def _dep(**kw):
    from sm120kit.kernel.deps import Dependency

    return Dependency(name="repo-minidep", declared_in=Path("CMakeLists.txt"), line=1, **kw)


@pytest.mark.parametrize("kind", ["git", "url"])
def test_fetched_dependency_keeps_the_old_source_when_the_rename_fails(tmp_path, monkeypatch, kind):
    from sm120kit.kernel import deps

    mirror = make_dependency_mirror(tmp_path)
    dest = _old(tmp_path / "deps" / "repo-minidep")
    _fail_final_rename(monkeypatch, dest)
    if kind == "git":

        def fetch():
            return deps._fetch_git(
                _dep(git_repository=str(mirror / "minidep.git"), git_tag="v1.0"), dest, lambda text: None
            )
    else:

        def fetch():
            return deps._fetch_url(_dep(url=(mirror / "minidata-1.0.tar.gz").as_uri()), dest)

    with pytest.raises(OSError, match="injected"):
        fetch()
    assert sorted(os.listdir(dest)) == ["keep.txt"] and _siblings(dest) == ["repo-minidep"]
    fetch()
    assert not (dest / "keep.txt").exists() and os.listdir(dest) and _siblings(dest) == ["repo-minidep"]


def test_dependency_overlay_keeps_the_old_overlay_when_the_rename_fails(tmp_path, monkeypatch):
    from packaging.requirements import Requirement

    from sm120kit.audit import probe_env

    monkeypatch.setattr(probe_env, "_pip_target", lambda folder, specs: (folder / "pkg").mkdir(exist_ok=True))
    monkeypatch.setattr(probe_env, "_unmet", lambda folder: [])
    monkeypatch.setattr(probe_env, "_dists", lambda folder: {"pkg": ("1.0", [])})
    dest = _old(tmp_path / "overlays" / "pkg_1")
    _fail_final_rename(monkeypatch, dest)
    with pytest.raises(OSError, match="injected"):
        probe_env._build(dest, [Requirement("pkg==1.0")], None)
    assert sorted(os.listdir(dest)) == ["keep.txt"] and _siblings(dest) == ["pkg_1"]
    probe_env._build(dest, [Requirement("pkg==1.0")], None)
    assert sorted(os.listdir(dest)) == [".complete", "pkg"] and _siblings(dest) == ["pkg_1"]
