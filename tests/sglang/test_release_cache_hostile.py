"""The release cache when what is in it, or the cache folder itself, is hostile: a zip bomb, a damaged or
truncated wheel, a FIFO named like the wheel, a cache path that is a file, a device, read-only, another
user's or missing; and ``apply --release --fresh`` while another run holds the work copy's lock. Each case
runs the real CLI with a private cache whose wheels are real PyPI wheels from the shared cache (copied, or
linked when only read); a re-download is served by real pip from a local folder (``PIP_FIND_LINKS``,
``PIP_NO_INDEX``), so nothing is fetched from the network."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from apply_support import DEMO_SERIES, REPO_ROOT, run_cli, tree_hashes
from hostile_support import give_away, run_cli_confined, zip_bomb

from sm120kit.util.cache import cache_dir

VERSION = "0.5.2"


def _real_wheel(release_dir, version: str = VERSION) -> Path:
    release_dir(version)  # the shared cache holds it
    [found] = (cache_dir() / "wheels").glob(f"sglang-{version}-*.whl")
    return found


def _cache_with(tmp_path: Path, name: str, data: bytes | None = None) -> Path:
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    if data is not None:
        (cache / "wheels" / name).write_bytes(data)
    return cache


def _cli(cache: Path, *args: str, source: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI with ``cache``; pip may download only from ``source`` (a folder of wheels), never the network."""
    empty = cache.parent / "no-wheels-here"
    empty.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        SM120KIT_CACHE_DIR=str(cache),
        NO_COLOR="1",
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(source or empty),
        PIP_CONFIG_FILE=os.devnull,
    )
    return subprocess.run(
        [sys.executable, "-m", "sm120kit", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _no_temp_folders(cache: Path) -> None:
    left = [p for p in cache.rglob(".*") if ".tmp@" in p.name or ".old@" in p.name]
    assert left == [], left


# -- damaged, oversized and odd cached wheels --------------------------------------------------------------


def _flipped(wheel: Path) -> bytes:
    """The wheel with one byte inside the compressed data of ``sglang/srt/utils.py`` flipped."""
    data = bytearray(wheel.read_bytes())
    info = zipfile.ZipFile(wheel).getinfo("sglang/srt/utils.py")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0x55
    return bytes(data)


def test_a_damaged_cached_wheel_is_set_aside_and_fetched_again(tmp_path, release_dir):
    wheel = _real_wheel(release_dir)
    cache = _cache_with(tmp_path, wheel.name, _flipped(wheel))
    source = tmp_path / "index"
    source.mkdir()
    shutil.copy(wheel, source / wheel.name)
    proc = _cli(cache, "fetch-release", VERSION, "--json", source=source)
    assert proc.returncode == 0, proc.stderr
    assert "damaged" in proc.stderr and f"{wheel.name}.corrupt" in proc.stderr
    got = tree_hashes(cache / "releases" / VERSION)
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in tree_hashes(release_dir(VERSION)).items()}
    assert (cache / "wheels" / f"{wheel.name}.corrupt").is_file()
    assert (cache / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()
    _no_temp_folders(cache)


@pytest.mark.parametrize("damage", ["flipped", "truncated", "zip-bomb", "no-package"])
def test_a_bad_cached_wheel_with_no_way_to_fetch_it_again_is_named(tmp_path, release_dir, damage):
    wheel = _real_wheel(release_dir)
    if damage == "flipped":
        data = _flipped(wheel)
    elif damage == "truncated":
        data = wheel.read_bytes()[: wheel.stat().st_size // 2]
    elif damage == "no-package":
        data = zip_bomb(1, 1024, prefix="other/")  # a valid zip that holds no sglang/ at all
    else:
        data = zip_bomb(70, prefix="sglang/")  # 4.6 MB that unpack to 4.7 GB (the bomb: 2.2 MB, 4.4 GB)
    cache = _cache_with(tmp_path, wheel.name, data)
    start = time.monotonic()
    proc = _cli(cache, "fetch-release", VERSION, "--json")
    assert proc.returncode == 10, proc.stderr
    assert str(cache / "wheels" / wheel.name) in proc.stderr and "damaged" in proc.stderr
    assert "Traceback" not in proc.stderr and "aborted" not in proc.stderr
    assert json.loads(proc.stdout)["error"] == "download"
    if damage == "zip-bomb":
        assert "over the bound" in proc.stderr and time.monotonic() - start < 60
    assert not (cache / "releases" / VERSION).exists()
    assert (cache / "wheels" / f"{wheel.name}.corrupt").read_bytes() == data
    _no_temp_folders(cache)


@pytest.mark.parametrize("command", [["fetch-release", VERSION], ["apply", "--release", VERSION, "--dry-run"]])
def test_a_fifo_named_like_the_cached_wheel_is_refused_without_waiting(tmp_path, release_dir, command):
    wheel = _real_wheel(release_dir)
    cache = _cache_with(tmp_path, wheel.name)
    os.mkfifo(cache / "wheels" / wheel.name)
    try:
        proc = (
            _cli(cache, *command, "--series", str(DEMO_SERIES), timeout=60)
            if command[0] == "apply"
            else _cli(cache, *command, timeout=60)
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the command waited on the FIFO")
    assert proc.returncode == 7, proc.stderr
    assert "FIFO" in proc.stderr and str(cache / "wheels" / wheel.name) in proc.stderr
    assert stat.S_ISFIFO(os.lstat(cache / "wheels" / wheel.name).st_mode)


def test_unpacking_keeps_executable_bits_of_the_real_members(tmp_path, release_dir):
    """The members of the 0.5.23 wheel marked executable, with their zip attributes, in a small wheel."""
    from sm120kit.sglang import releases

    source = zipfile.ZipFile(_real_wheel(release_dir, "0.5.23"))
    chosen = [
        i
        for i in source.infolist()
        if not i.is_dir()
        and i.filename.startswith("sglang/")
        and i.file_size < 100_000
        and ((i.external_attr >> 16) & 0o100 or i.filename in ("sglang/__init__.py", "sglang/version.py"))
    ]
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as out:
        for info in chosen:
            out.writestr(info, source.read(info))
    old = os.umask(0o022)
    try:
        releases._unpack(wheel, tmp_path / "release")
    finally:
        os.umask(old)
    modes = {i.filename: stat.S_IMODE((tmp_path / "release" / i.filename).stat().st_mode) for i in chosen}
    assert modes.pop("sglang/__init__.py") == 0o644 and modes.pop("sglang/version.py", 0o644) == 0o644
    assert len(modes) > 10
    assert set(modes.values()) == {0o755}, modes


@pytest.mark.slow
def test_the_unpacked_release_keeps_the_wheels_executable_bits(tmp_path, release_dir):
    wheel = _real_wheel(release_dir, "0.5.23")
    executable = sorted(
        i.filename
        for i in zipfile.ZipFile(wheel).infolist()
        if not i.is_dir() and (i.external_attr >> 16) & 0o100 and i.filename.startswith("sglang/")
    )
    assert len(executable) > 10  # 0.5.23 ships scripts and modules marked executable
    cache = _cache_with(tmp_path, wheel.name)
    (cache / "wheels" / wheel.name).symlink_to(wheel)
    proc = subprocess.run(
        [sys.executable, "-m", "sm120kit", "fetch-release", "0.5.23"],
        cwd=REPO_ROOT,
        env=dict(os.environ, SM120KIT_CACHE_DIR=str(cache)),
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.umask(0o022),
    )
    assert proc.returncode == 0, proc.stderr
    release = cache / "releases" / "0.5.23"
    modes = {name: stat.S_IMODE((release / name).stat().st_mode) for name in executable}
    assert set(modes.values()) == {0o755}, modes
    assert stat.S_IMODE((release / "sglang" / "srt" / "server_args.py").stat().st_mode) == 0o644


# -- the cache folder itself --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["regular-file", "dev-null", "immutable", "another-users"])
@pytest.mark.parametrize("command", [["fetch-release", VERSION], ["apply", "--release", VERSION]])
def test_a_cache_folder_that_cannot_be_used_is_exit_7_naming_it(tmp_path, kind, command):
    """``another-users``: a 0755 folder of another user id, run in a user namespace where root has no rights
    over it (tests/support/hostile_support.py): the non-root user's view of a root-owned cache."""
    if kind == "regular-file":
        cache = tmp_path / "cache-file"
        cache.write_text("not a folder\n")
    elif kind == "dev-null":
        cache = Path(os.devnull)
    else:
        cache = tmp_path / "cache-ro"
        cache.mkdir()
    env = dict(os.environ, SM120KIT_CACHE_DIR=str(cache), NO_COLOR="1")
    if kind == "another-users":
        tmp_path.chmod(0o755)
        give_away(cache, 0o755)
        proc = run_cli_confined(*command, env=env)
    elif kind == "immutable":
        if subprocess.run(["chattr", "+i", str(cache)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here (the only read-only folder root cannot write)")
        try:
            proc = run_cli(*command, env=env)
        finally:
            subprocess.run(["chattr", "-i", str(cache)])
    else:
        proc = run_cli(*command, env=env)
    assert proc.returncode == 7, proc.stderr
    assert str(cache) in proc.stderr and "SM120KIT_CACHE_DIR" in proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    if kind == "regular-file":
        assert cache.read_text() == "not a folder\n"
    elif kind != "dev-null":
        assert os.listdir(cache) == []


def test_no_home_and_no_cache_setting_is_exit_7(tmp_path):
    """Run as a user id with no passwd entry and no HOME (a user namespace, tests/support/hostile_support.py)."""
    env = {"PATH": os.environ["PATH"], "NO_COLOR": "1"}  # no HOME, SM120KIT_CACHE_DIR or XDG_CACHE_HOME
    proc = run_cli_confined("fetch-release", VERSION, env=env, user="no-passwd")
    assert proc.returncode == 7, proc.stderr
    assert "HOME is not set" in proc.stderr and "SM120KIT_CACHE_DIR" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_fresh_waits_for_the_run_holding_the_work_copys_lock(tmp_path, release_dir):
    cache = tmp_path / "cache"
    (cache / "releases").mkdir(parents=True)
    (cache / "releases" / VERSION).symlink_to(release_dir(VERSION), target_is_directory=True)
    env = {"SM120KIT_CACHE_DIR": str(cache), "SM120KIT_LOCK_WAIT": "0.5"}
    assert run_cli("apply", "--release", VERSION, "--series", str(DEMO_SERIES), env=env).returncode == 0
    work = cache / "work" / VERSION
    before = tree_hashes(work)
    lock = work / "sglang" / ".sm120kit" / "lock"
    with open(lock, "r+") as holder:  # another run holds the tree lock (as apply does)
        fcntl.flock(holder, fcntl.LOCK_EX)
        proc = run_cli("apply", "--release", VERSION, "--fresh", "--series", str(DEMO_SERIES), env=env)
    assert proc.returncode == 7, proc.stderr
    assert "locked by another sm120kit run" in proc.stderr
    assert tree_hashes(work) == before
    again = run_cli("apply", "--release", VERSION, "--fresh", "--series", str(DEMO_SERIES), env=env)
    assert again.returncode == 0, again.stderr
    assert sorted(os.listdir(cache / "work")) == [VERSION]
