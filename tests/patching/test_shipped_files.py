"""[[files]] entries: whole files a patch ships from this repository (docs/series-format.md).

On the real series and a real release: the kernel modules land byte for byte, status sees them, a revert
after the created modules were imported (their bytecode written) leaves the tree byte-identical. On a copy
of the demonstration series: a shipped file applies and reverts, is already applied once written, a
destination that exists with other bytes is a conflict, and every malformed entry is refused with its file
and line.
"""

from __future__ import annotations

import hashlib
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from apply_support import DEMO_SERIES, tree_hashes

from sm120kit.errors import SeriesError
from sm120kit.patching.engine import apply_series, revert_series, series_status
from sm120kit.patching.plan import plan_series
from sm120kit.patching.series import load_series
from sm120kit.sglang.target import find_target


def _tree(top: Path) -> dict[str, tuple]:
    """Every folder and file under ``top``: path -> ("dir",) or (sha256, mode); empty folders count."""
    out: dict[str, tuple] = {}
    for folder, dirs, names in os.walk(top):
        for name in dirs:
            out[(Path(folder) / name).relative_to(top).as_posix()] = ("dir",)
        for name in names:
            path = Path(folder) / name
            out[path.relative_to(top).as_posix()] = (
                hashlib.sha256(path.read_bytes()).hexdigest(),
                path.lstat().st_mode & 0o7777,
            )
    return out


def test_revert_after_import_removes_the_bytecode_of_created_modules_and_nothing_else(tmp_path, release_dir):
    """The real series on 0.5.2: the created modules are compiled as importing the patched tree would (every
    optimisation level), then reverted; the tree is byte for byte the one before apply, folders included.
    triton_ops/__pycache__ existed before (SGLang's own bytecode and an old .pyc of a series module stay);
    srt/__pycache__ did not, and holds only bytecode of a created module, so it goes."""
    top = tmp_path / "site"
    shutil.copytree(release_dir("0.5.2"), top)
    package = top / "sglang"
    triton_ops = package / "srt" / "layers" / "attention" / "triton_ops"
    py_compile.compile(str(triton_ops / "extend_attention.py"), doraise=True)
    (triton_ops / "__pycache__" / "sm120_mla_mma.cpython-39.pyc").write_bytes(b"left by an earlier tree")
    assert not (package / "srt" / "__pycache__").exists()
    pristine = _tree(top)

    result = apply_series(find_target(package), load_series())
    assert result.exit_code == 0, result.message
    created = sorted(c.path for c in result.written if c.before is None and c.path.endswith(".py"))
    assert created == sorted(
        [
            f"sglang/srt/layers/attention/triton_ops/{name}"
            for name in ("sm120_mla.py", "sm120_mla_mma.py", "sm120_mla_nvrtc.py", "sm120_mla_route.py")
        ]
        + ["sglang/srt/sm12x_backend_gate.py"]
    )
    for level in ("0", "1", "2"):
        proc = subprocess.run(
            [sys.executable, "-m", "compileall", "-q", "-o", level, *(str(top / p) for p in created)],
            check=False,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    compiled = sorted(p.name for p in (package / "srt" / "__pycache__").iterdir())
    assert len(compiled) == 3 and all(n.startswith("sm12x_backend_gate.") for n in compiled), compiled
    assert len(list((triton_ops / "__pycache__").glob("sm120_mla.*.pyc"))) == 3
    status = series_status(find_target(package), load_series())
    assert status.exit_code == 0 and status.problems == ()
    assert {f.path for f in status.files} >= set(created)

    assert revert_series(find_target(package)).exit_code == 0
    assert _tree(top) == pristine, "revert left something behind or removed too much"


def _series_copy(tmp_path: Path, files_toml: str, source_text: str = "VALUE = 1\n") -> Path:
    """The demonstration series under tmp/patches/sglang with a [[files]] section added to demo-new-module,
    and a source file tmp/kernels/demo/shipped.py (the data root is tmp/)."""
    series = tmp_path / "patches" / "sglang"
    shutil.copytree(DEMO_SERIES, series)
    (tmp_path / "kernels" / "demo").mkdir(parents=True)
    (tmp_path / "kernels" / "demo" / "shipped.py").write_text(source_text)
    toml = series / "demo-new-module" / "patch.toml"
    text = toml.read_text()
    toml.write_text(text.replace("[[markers]]", files_toml + "\n[[markers]]"))
    return series


GOOD = """[[files]]
source = "kernels/demo/shipped.py"
dest = "sglang/srt/sm120kit_shipped.py"
releases = ">=0.5.2"
"""


def test_a_shipped_file_is_planned_applied_and_reverted_like_a_created_file(tmp_path, installed_tree):
    series = load_series(_series_copy(tmp_path, GOOD))
    package = installed_tree("0.5.2", link=True)  # only the patch manager writes to it
    pristine = tree_hashes(package.parent)
    result = apply_series(find_target(package), series)
    assert result.exit_code == 0, result.message
    assert (package / "srt" / "sm120kit_shipped.py").read_text() == "VALUE = 1\n"
    again = plan_series(package.parent, series, version="0.5.2")
    assert {p.patch_id: str(p.status) for p in again.patches}["demo-new-module"] == "already-applied"
    assert revert_series(find_target(package)).exit_code == 0
    assert tree_hashes(package.parent) == pristine


def test_a_destination_that_exists_with_other_bytes_is_a_conflict(tmp_path, release_dir):
    root = release_dir("0.5.23")
    entry = GOOD.replace("sglang/srt/sm120kit_shipped.py", "sglang/version.py")
    plan = plan_series(root, load_series(_series_copy(tmp_path, entry)), version="0.5.23", recorded=())
    row = next(p for p in plan.patches if p.patch_id == "demo-new-module")
    assert str(row.status) == "conflict" and "sglang/version.py" in row.reason


@pytest.mark.parametrize(
    "change, words",
    [
        (('source = "kernels/demo/shipped.py"', 'source = "../kernels/demo/shipped.py"'), "'..' component"),
        (('source = "kernels/demo/shipped.py"', 'source = "/etc/passwd"'), "not a relative path"),
        (('source = "kernels/demo/shipped.py"', 'source = "kernels/demo/absent.py"'), "does not exist"),
        (('dest = "sglang/srt/sm120kit_shipped.py"', 'dest = "other/x.py"'), "does not start with 'sglang/'"),
        (('dest = "sglang/srt/sm120kit_shipped.py"', 'dest = "sglang/.sm120kit/x.py"'), "state folder"),
        (('releases = ">=0.5.2"', 'releases = "<0.5.0"'), "would never be shipped"),
        (('releases = ">=0.5.2"', 'releases = "soon"'), "not a PEP 440 specifier"),
        (('releases = ">=0.5.2"\n', 'releases = ">=0.5.2"\nmode = "4755"\n'), "unknown key 'mode'"),
    ],
)
def test_malformed_entries_are_refused_with_file_and_line(tmp_path, change, words):
    series = _series_copy(tmp_path, GOOD.replace(*change))
    with pytest.raises(SeriesError) as info:
        load_series(series)
    text = str(info.value)
    assert words in text and "patch.toml:" in text, text


def test_a_source_behind_a_symbolic_link_is_refused(tmp_path):
    series = _series_copy(tmp_path, GOOD.replace("kernels/demo/shipped.py", "kernels/link/shipped.py"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "shipped.py").write_text("SECRET = 1\n")
    os.symlink(outside, tmp_path / "kernels" / "link")
    with pytest.raises(SeriesError, match=r"patch.toml:\d+: .*kernels/link is a symbolic link"):
        load_series(series)


@pytest.mark.parametrize(
    "case, words",
    [
        ("fifo", "neither a regular file nor a folder"),
        ("latin-1", "is not UTF-8 text"),
        ("link-file", "kernels/demo/shipped.py is a symbolic link"),
        ("link-in-folder", "kernels/demo/shipped.py is a symbolic link"),
        ("file-as-folder", "kernels/demo/shipped.py is not a folder"),
        ("too-large", "more than the 64 a shipped file may have"),
    ],
)
def test_a_source_that_is_not_a_plain_file_is_refused_with_file_and_line(tmp_path, monkeypatch, case, words):
    """Nothing is opened through a link or read from a FIFO (which would hang), and each refusal names
    patch.toml and the line of the entry's source."""
    source = {"link-in-folder": "kernels/demo", "file-as-folder": "kernels/demo/shipped.py/inner.py"}.get(
        case, "kernels/demo/shipped.py"
    )
    series = _series_copy(
        tmp_path,
        GOOD.replace("kernels/demo/shipped.py", source).replace(
            "sglang/srt/sm120kit_shipped.py", "sglang/srt/sm120kit_shipped"
        ),
    )
    shipped = tmp_path / "kernels" / "demo" / "shipped.py"
    outside = tmp_path / "outside.py"
    outside.write_text("SECRET = 1\n")
    if case == "fifo":
        shipped.unlink()
        os.mkfifo(shipped)
    elif case == "latin-1":
        shipped.write_bytes("NAME = 'caf\u00e9'\n".encode("latin-1"))
    elif case.startswith("link"):
        shipped.unlink()
        os.symlink(outside, shipped)
    elif case == "too-large":
        monkeypatch.setattr("sm120kit.patching.series.MAX_SOURCE_BYTES", 64)
        shipped.write_text("# " + "x" * 80 + "\n")
    with pytest.raises(SeriesError) as info:
        load_series(series)
    text = str(info.value)
    assert words in text and "demo-new-module/patch.toml:" in text, text


def _copy_release(release: Path, to: Path) -> Path:
    shutil.copytree(release, to)
    return to / "sglang"


def test_a_folder_entry_ships_every_file_byte_for_byte_and_status_sees_an_edit(tmp_path, release_dir):
    """A folder entry: each regular file directly inside (sub-folders skipped) lands with its exact bytes
    (no final newline, CRLF lines) and 0644, or 0755 for an owner-executable source; status and revert see
    an edit of a shipped file as of a created one; revert --force puts the tree back byte for byte."""
    series_dir = _series_copy(
        tmp_path,
        GOOD.replace("kernels/demo/shipped.py", "kernels/demo").replace(
            "sglang/srt/sm120kit_shipped.py", "sglang/srt/sm120kit_files"
        ),
    )
    demo = tmp_path / "kernels" / "demo"
    (demo / "no_newline.json").write_bytes(b'{"a": 1}')
    (demo / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    (demo / "tool.py").write_bytes(b"#!/usr/bin/env python3\nprint(1)\n")
    (demo / "tool.py").chmod(0o755)
    (demo / "sub").mkdir()
    (demo / "sub" / "skipped.py").write_text("X = 1\n")
    series = load_series(series_dir)
    package = _copy_release(release_dir("0.5.2"), tmp_path / "site")
    pristine = tree_hashes(package.parent)

    assert apply_series(find_target(package), series).exit_code == 0
    shipped = package / "srt" / "sm120kit_files"
    assert sorted(p.name for p in shipped.iterdir()) == ["crlf.txt", "no_newline.json", "shipped.py", "tool.py"]
    for name in ("crlf.txt", "no_newline.json", "shipped.py", "tool.py"):
        assert (shipped / name).read_bytes() == (demo / name).read_bytes(), name
        assert (shipped / name).stat().st_mode & 0o777 == (0o755 if name == "tool.py" else 0o644), name

    (shipped / "no_newline.json").write_bytes(b'{"a": 2}')
    status = series_status(find_target(package), series)
    assert status.exit_code == 6
    edited = "sglang/srt/sm120kit_files/no_newline.json"
    assert {f.path: f.condition for f in status.files}[edited] == "edited"
    assert any(edited in p and "changed after apply" in p for p in status.problems)
    refused = revert_series(find_target(package))
    assert refused.exit_code == 6 and edited in refused.message
    reverted = revert_series(find_target(package), force=True)
    assert reverted.exit_code == 0
    kept = next(f.kept_copy for f in reverted.files if f.path == edited)
    assert kept.read_bytes() == b'{"a": 2}'
    shutil.rmtree(package / ".sm120kit")  # the kept copy of the edit, which revert --force leaves on purpose
    assert tree_hashes(package.parent) == pristine


def test_check_upstream_and_matrix_treat_a_shipped_file_as_a_created_file(tmp_path, release_dir):
    """On three copies of 0.5.2: the shipped file absent (applies), present with other bytes (a conflict naming
    it), present with its bytes and the patch's marker (present-upstream); the matrix over the three folders
    says the same."""
    from sm120kit.upstream.check import check_upstream, open_folder
    from sm120kit.upstream.matrix import build_matrix

    series = load_series(_series_copy(tmp_path, GOOD))
    release = release_dir("0.5.2")
    clean = _copy_release(release, tmp_path / "clean")
    other = _copy_release(release, tmp_path / "other")
    (other / "srt" / "sm120kit_shipped.py").write_text("VALUE = 2\n")
    upstream = _copy_release(release, tmp_path / "upstream")
    (upstream / "srt" / "sm120kit_shipped.py").write_text("VALUE = 1\n")
    (upstream / "srt" / "sm120kit_demo.py").write_text("SM120KIT_DEMO_MODULE = True\n")  # the patch's marker

    def status(package: Path):
        with open_folder(package) as target:
            check = check_upstream(series, target, history=False)
        return next(p for p in check.patches if p.patch_id == "demo-new-module")

    assert str(status(clean).status) == "applies"
    conflict = status(other)
    assert str(conflict.status) == "conflict" and "sglang/srt/sm120kit_shipped.py" in conflict.detail
    present = status(upstream)
    assert str(present.status) == "present-upstream" and "sglang/srt/sm120kit_demo.py" in present.detail

    matrix = build_matrix(series, folders=(clean, other, upstream), history=False)
    column = [r.patch_id for r in matrix.results[0].patches].index("demo-new-module")
    assert [str(r.patches[column].status) for r in matrix.results] == ["applies", "conflict", "present-upstream"]
    assert matrix.exit_code() == 4


@pytest.mark.parametrize(
    "bytecode, words",
    [
        ({"cache_existed": "yes", "present": []}, "cache_existed = 'yes' is not true or false"),
        ({"cache_existed": True, "present": ["../../victim.pyc"]}, "present is not a list"),
        ({"cache_existed": True, "present": ["x.pyc"] * 65}, "at most 64"),
        (["x.pyc"], "is not an object"),
    ],
)
def test_a_bytecode_entry_of_the_state_record_is_untrusted_input(bytecode, words):
    from sm120kit.patching.state import FileRecord, Untrusted

    entry = {"path": "sglang/srt/x.py", "before": None, "after": "0" * 64, "mode": None, "bytecode": bytecode}
    with pytest.raises(Untrusted, match="files\\[0\\].bytecode") as info:
        FileRecord.from_json(entry, "files[0]")
    assert words in str(info.value)
    good = FileRecord.from_json({**entry, "bytecode": {"cache_existed": False, "present": ["x.cpython-312.pyc"]}})
    assert FileRecord.from_json(good.to_json()) == good


def test_a_tree_between_releases_gets_the_files_of_the_variant_it_falls_back_to(tmp_path, release_dir):
    """A git commit between releases is planned with every variant, the matching one first: on the 0.5.6
    tree labelled 0.5.17 (not exact), demo-extend-attention-note's 0.5.23.diff finds no file and 0.5.6.diff
    is used, so the [[files]] entry whose range holds 0.5.6 ships, not the one the label falls in."""
    series_dir = tmp_path / "patches" / "sglang"
    shutil.copytree(DEMO_SERIES, series_dir)
    (tmp_path / "kernels" / "demo").mkdir(parents=True)
    (tmp_path / "kernels" / "demo" / "old.py").write_text("LAYOUT = 'triton_ops'\n")
    (tmp_path / "kernels" / "demo" / "new.py").write_text("LAYOUT = 'kernels/ops'\n")
    toml = series_dir / "demo-extend-attention-note" / "patch.toml"
    toml.write_text(
        toml.read_text().replace(
            "[[markers]]",
            """[[files]]
source = "kernels/demo/old.py"
dest = "sglang/srt/sm120kit_note_layout.py"
releases = "<0.5.16"

[[files]]
source = "kernels/demo/new.py"
dest = "sglang/srt/sm120kit_note_layout.py"
releases = ">=0.5.16"

[[markers]]""",
        )
    )
    series = load_series(series_dir)
    assert [(v.name, [e.source for e in v.shipped]) for v in series.get("demo-extend-attention-note").variants] == [
        ("0.5.6.diff", ["kernels/demo/old.py"]),
        ("0.5.23.diff", ["kernels/demo/new.py"]),
    ]

    plan = plan_series(release_dir("0.5.6"), series, version="0.5.17", exact=False, recorded=())
    row = next(p for p in plan.patches if p.patch_id == "demo-extend-attention-note")
    assert str(row.status) == "applies" and row.variant.name == "0.5.6.diff", row.reason
    shipped = next(c for c in plan.changes if c.path == "sglang/srt/sm120kit_note_layout.py")
    assert shipped.after == b"LAYOUT = 'triton_ops'\n" and shipped.before is None
    exact = plan_series(release_dir("0.5.17"), series, version="0.5.17", recorded=())
    assert (
        next(c for c in exact.changes if c.path == "sglang/srt/sm120kit_note_layout.py").after
        == b"LAYOUT = 'kernels/ops'\n"
    )


def test_revert_removes_a_folder_the_series_created_once_its_bytecode_is_gone(tmp_path, release_dir):
    """A shipped module in a folder apply created, imported (compiled) after apply: revert removes the
    module, its bytecode, the __pycache__ folder and then the created folder itself."""
    series = load_series(
        _series_copy(
            tmp_path, GOOD.replace("sglang/srt/sm120kit_shipped.py", "sglang/srt/sm120kit_new_folder/shipped.py")
        )
    )
    top = tmp_path / "site"
    shutil.copytree(release_dir("0.5.2"), top)
    pristine = _tree(top)
    assert apply_series(find_target(top / "sglang"), series).exit_code == 0
    py_compile.compile(str(top / "sglang/srt/sm120kit_new_folder/shipped.py"), doraise=True)
    assert (top / "sglang/srt/sm120kit_new_folder/__pycache__").is_dir()
    assert revert_series(find_target(top / "sglang")).exit_code == 0
    assert _tree(top) == pristine
