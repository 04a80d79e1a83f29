"""``fetch-deps`` reads the CMake files of an SGLang tree, which are untrusted input: a dependency name or a
``SOURCE_DIR`` that leads out of ``--into``, a ``GIT_TAG`` git would take as an option, a ``URL_HASH`` of
another algorithm than SHA256, and archives that are damaged or built to fill the disk. Each case runs the
real CLI on a kernel source folder written here (the fixture's CMake form), with real git repositories and
the fixture's real archive served from a local folder (``file://``); files outside ``--into`` are checked
byte for byte afterwards."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
from build_support import PACKAGES, make_dependency_mirror, run_cli
from hostile_support import zip_bomb

MINIDATA = PACKAGES / "minidata-1.0.tar.gz"
MINIDATA_SHA256 = "b449faae6f5de342e0f0b9a5132eb5a1ea5f8ea27faf50626cadc00f3d964bc8"


def _source(tmp_path: Path, declarations: str) -> Path:
    """A kernel source folder (CMakeLists.txt + pyproject.toml) whose CMakeLists declares ``declarations``."""
    src = tmp_path / "src"
    src.mkdir(parents=True)
    (src / "pyproject.toml").write_text('[project]\nname = "hostile-kernel"\nversion = "0.1.0"\n')
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.26)\nproject(hostile)\ninclude(FetchContent)\n" + declarations
    )
    return src


def _victim(tmp_path: Path) -> Path:
    """A folder outside --into that must survive every case untouched."""
    victim = tmp_path / "x"
    victim.mkdir()
    (victim / "precious.txt").write_text("user data\n")
    return victim


def _fetch(src: Path, into: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_cli("fetch-deps", str(src), "--into", str(into), *extra)


# -- folders outside --into ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../x", "ABSOLUTE"])
def test_a_dependency_name_cannot_replace_a_folder_outside_into(tmp_path, name):
    into = tmp_path / "deps" / "inner"
    victim = _victim(tmp_path)
    name = str(victim) if name == "ABSOLUTE" else "../../x"
    src = _source(tmp_path, f"FetchContent_Declare(\n    {name}\n    URL {MINIDATA.as_uri()}\n)\n")
    proc = _fetch(src, into)
    assert proc.returncode == 2, proc.stderr
    assert "CMakeLists.txt:4" in proc.stderr and "not a plain folder name" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
    assert (victim / "precious.txt").read_text() == "user data\n"


def test_a_source_dir_with_dotdot_cannot_leave_into(tmp_path):
    mirror = make_dependency_mirror(tmp_path)
    into = tmp_path / "deps"
    victim = _victim(tmp_path)
    src = _source(
        tmp_path,
        (
            f"FetchContent_Declare(\n    repo-minidata\n    URL {(mirror / 'minidata-1.0.tar.gz').as_uri()}\n)\n"
            f"FetchContent_Declare(\n    inner\n    URL {(mirror / 'minidata-1.0.tar.gz').as_uri()}\n"
            "    SOURCE_DIR ${repo-minidata_SOURCE_DIR}/../../x\n)\n"
        ),
    )
    proc = _fetch(src, into)
    assert proc.returncode == 2, proc.stderr
    assert "CMakeLists.txt:8" in proc.stderr and "'../../x'" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]


# -- git options --------------------------------------------------------------------------------------------


def test_a_git_tag_that_is_an_option_runs_nothing(tmp_path):
    mirror = make_dependency_mirror(tmp_path)
    planted = tmp_path / "planted"
    tag = f'"--upload-pack=touch {planted}; git-upload-pack"'
    src = _source(
        tmp_path,
        f"FetchContent_Declare(\n    repo-minidep\n    GIT_REPOSITORY {mirror / 'minidep.git'}\n    GIT_TAG {tag}\n)\n",
    )
    proc = _fetch(src, tmp_path / "deps")
    assert proc.returncode == 2, proc.stderr
    assert "GIT_TAG" in proc.stderr and "option" in proc.stderr and "CMakeLists.txt:4" in proc.stderr
    assert not planted.exists()


def test_a_plain_git_tag_is_still_fetched(tmp_path):
    mirror = make_dependency_mirror(tmp_path)
    src = _source(
        tmp_path,
        f"FetchContent_Declare(\n    repo-minidep\n    GIT_REPOSITORY {mirror / 'minidep.git'}\n    GIT_TAG v1.0\n)\n",
    )
    proc = _fetch(src, tmp_path / "deps")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "deps" / "repo-minidep" / "include" / "minidep" / "minidep.h").is_file()


# -- URL_HASH -----------------------------------------------------------------------------------------------


def _hash_source(tmp_path: Path, url_hash: str) -> Path:
    return _source(
        tmp_path, f"FetchContent_Declare(\n    repo-minidata\n    URL {MINIDATA.as_uri()}\n    URL_HASH {url_hash}\n)\n"
    )


@pytest.mark.parametrize("algo", ["SHA512", "MD5", "SHA1", "SHA3_256"])
def test_url_hash_of_every_algorithm_is_checked(tmp_path, algo):
    right = hashlib.new(algo.lower(), MINIDATA.read_bytes()).hexdigest()
    wrong = ("0" if right[0] != "0" else "1") + right[1:]
    bad = _fetch(_hash_source(tmp_path / "bad", f"{algo}={wrong}"), tmp_path / "bad" / "deps")
    assert bad.returncode == 10, bad.stderr
    assert f"has {algo} {right}" in bad.stderr and f"expects {wrong}" in bad.stderr
    assert not (tmp_path / "bad" / "deps" / "repo-minidata").exists()
    good = _fetch(_hash_source(tmp_path / "good", f"{algo}={right}"), tmp_path / "good" / "deps")
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "good" / "deps" / "repo-minidata" / "minidata.h").is_file()


@pytest.mark.parametrize("url_hash", ["WHIRLPOOL=00ff", "SHA256", f"SHA256={MINIDATA_SHA256[:-2]}"])
def test_url_hash_that_cannot_be_checked_is_an_error(tmp_path, url_hash):
    proc = _fetch(_hash_source(tmp_path, url_hash), tmp_path / "deps")
    assert proc.returncode == 2, proc.stderr
    assert "URL_HASH" in proc.stderr and "CMakeLists.txt:4" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "deps" / "repo-minidata").exists()


# -- damaged and oversized archives ------------------------------------------------------------------------


def _served(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / "served" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _bad_crc_zip() -> bytes:
    """A zip of the fixture's real files with one byte of a stored member flipped (its CRC then fails)."""
    buffer = io.BytesIO()
    with tarfile.open(MINIDATA) as tar, zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        for member in tar.getmembers():
            if member.isfile():
                zf.writestr(member.name, tar.extractfile(member).read())
    data = bytearray(buffer.getvalue())
    first = zipfile.ZipFile(io.BytesIO(bytes(data))).infolist()[0]
    offset = first.header_offset + 30 + len(first.filename.encode()) + len(first.extra)
    data[offset] ^= 0xFF
    return bytes(data)


@pytest.mark.parametrize("kind", ["bad-crc-zip", "truncated-tar-gz", "not-an-archive"])
def test_a_damaged_archive_is_a_download_error_naming_it(tmp_path, kind):
    if kind == "bad-crc-zip":
        archive = _served(tmp_path, "minidata.zip", _bad_crc_zip())
    elif kind == "truncated-tar-gz":
        data = MINIDATA.read_bytes()
        archive = _served(tmp_path, "minidata.tar.gz", data[: len(data) * 2 // 3])
    else:
        archive = _served(tmp_path, "minidata.tar.gz", b"<html>not found</html>\n")
    src = _source(tmp_path, f"FetchContent_Declare(\n    repo-minidata\n    URL {archive.as_uri()}\n)\n")
    proc = _fetch(src, tmp_path / "deps", "--json")
    assert proc.returncode == 10, (proc.returncode, proc.stderr)
    assert "repo-minidata" in proc.stderr and "cannot be unpacked" in proc.stderr
    assert "aborted" not in proc.stderr and "Traceback" not in proc.stderr
    assert '"error": "download"' in proc.stdout
    assert not (tmp_path / "deps" / "repo-minidata").exists()
    assert [p.name for p in (tmp_path / "deps").iterdir()] == []


def test_a_zip_bomb_is_refused_before_anything_is_written(tmp_path):
    bomb = _served(tmp_path, "bomb.zip", zip_bomb(24))  # 1.5 GiB from 1.6 MB
    assert len(bomb.read_bytes()) < 2 << 20
    src = _source(tmp_path, f"FetchContent_Declare(\n    repo-bomb\n    URL {bomb.as_uri()}\n)\n")
    start = time.monotonic()
    proc = _fetch(src, tmp_path / "deps")
    assert proc.returncode == 10, proc.stderr
    assert "over the bound" in proc.stderr and "SM120KIT_UNPACK_LIMIT" in proc.stderr
    assert time.monotonic() - start < 60
    assert sum(p.stat().st_size for p in (tmp_path / "deps").rglob("*") if p.is_file()) == 0
