"""The release cache: one folder per release whatever way its name is written, folder modes from the
umask, and no temporary copy left behind by a killed ``apply --release --fresh``. Each test uses its own
cache folder whose releases and wheels link to the shared test cache (nothing is downloaded)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apply_support import DEMO_SERIES, REPO_ROOT, run_cli

from sm120kit.sglang import releases
from sm120kit.util.cache import cache_dir


def _cache(tmp_path: Path, release_dir, version: str, *, wheel: bool = False) -> Path:
    cache = tmp_path / "cache"
    if wheel:
        (cache / "wheels").mkdir(parents=True)
        release_dir(version)  # make sure the shared cache holds it
        [found] = [w for w in (cache_dir() / "wheels").glob(f"sglang-{version}-*.whl")]
        (cache / "wheels" / found.name).symlink_to(found)
    else:
        (cache / "releases").mkdir(parents=True)
        (cache / "releases" / version).symlink_to(release_dir(version), target_is_directory=True)
    return cache


@pytest.mark.parametrize("spelling", ["v0.5.2", "0.5.2.0", " 0.5.2", "0.5.2"])
def test_release_names_are_normalised_before_they_name_a_folder(tmp_path, release_dir, spelling):
    cache = _cache(tmp_path, release_dir, "0.5.2")
    env = {"SM120KIT_CACHE_DIR": str(cache)}
    proc = run_cli("apply", "--release", spelling, "--series", str(DEMO_SERIES), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(cache / "work")) == ["0.5.2"]
    again = run_cli("status", "--release", "0.5.2", "--series", str(DEMO_SERIES), env=env)
    assert again.returncode == 0 and "0.5.2" in again.stdout


def test_release_normal_form():
    assert [releases.normalize(t) for t in ("v0.5.23", "0.5.23.0", " 0.5.23\n", "0.5.6-post2", "0.5")] == [
        "0.5.23",
        "0.5.23",
        "0.5.23",
        "0.5.6.post2",
        "0.5.0",
    ]
    with pytest.raises(Exception, match="not a release version"):
        releases.normalize("../0.5.23")


@pytest.mark.parametrize("umask,expected", [(0o022, 0o755), (0o002, 0o775)])
def test_cache_folders_follow_the_umask(tmp_path, release_dir, umask, expected):
    """mkdtemp makes 0700 folders: renamed into place, a cache made by root would be closed to others."""
    cache = _cache(tmp_path, release_dir, "0.5.2", wheel=True)
    env = dict(os.environ, SM120KIT_CACHE_DIR=str(cache), NO_COLOR="1")

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "sm120kit", *args],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            preexec_fn=lambda: os.umask(umask),
        )

    assert cli("fetch-release", "0.5.2").returncode == 0
    assert stat.S_IMODE((cache / "releases" / "0.5.2").stat().st_mode) == expected
    assert stat.S_IMODE((cache / "releases" / "0.5.2" / "sglang").stat().st_mode) == expected
    proc = cli("apply", "--release", "0.5.2", "--series", str(DEMO_SERIES))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((cache / "work" / "0.5.2").stat().st_mode) == expected


def test_killed_fresh_copy_leaves_no_temporary_copy(tmp_path, release_dir):
    cache = _cache(tmp_path, release_dir, "0.5.23")
    env = dict(os.environ, SM120KIT_CACHE_DIR=str(cache), NO_COLOR="1")
    work = cache / "work"
    leftovers: list[str] = []
    for attempt in range(5):  # the copy must be caught while it is under way
        child = subprocess.Popen(
            [sys.executable, "-m", "sm120kit", "apply", "--release", "0.5.23", "--fresh", "--series", str(DEMO_SERIES)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            if work.is_dir() and any(n.startswith(".") for n in os.listdir(work)):
                child.send_signal(signal.SIGKILL)
                break
            time.sleep(0.005)
        child.wait(timeout=60)
        if child.returncode == -9:
            leftovers = [n for n in os.listdir(work) if n.startswith(".")]
            break
    assert leftovers, "the copy was never caught under way"
    proc = run_cli("apply", "--release", "0.5.23", "--series", str(DEMO_SERIES), env={"SM120KIT_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(work)) == ["0.5.23"]


@pytest.mark.slow  # three interpreters unpack a release
def test_two_runs_fetching_one_release_at_once_take_turns(tmp_path, release_dir):
    """Parallel test workers (scripts/test.sh runs pytest-xdist) and two shells fetch into one cache: the
    second waits for the first's lock, finds the release unpacked and leaves it in place (never swapped
    under a reader); no temporary folder is left."""
    cache = _cache(tmp_path, release_dir, "0.5.2", wheel=True)
    code = (
        "import sys; from pathlib import Path; from sm120kit.sglang import releases; "
        "d = releases.fetch_release('0.5.2', cache=Path(sys.argv[1])); "
        "print((d / 'sglang' / '__init__.py').stat().st_ino)"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(cache)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    assert len({out.strip() for out, _ in outs}) == 1  # one unpacked copy, seen by all three
    assert sorted(p.name for p in (cache / "releases").iterdir()) == [".0.5.2.lock", "0.5.2"]
