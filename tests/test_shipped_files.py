"""[[files]] entries: whole files a patch ships from this repository (docs/series-format.md).

On the real series and a real release: the kernel modules land byte for byte, status sees them, a revert
after the created modules were imported (their bytecode written) leaves the tree byte-identical. On a copy
of the demonstration series: a shipped file applies and reverts, is already applied once written, a
destination that exists with other bytes is a conflict, and every malformed entry is refused with its file
and line.
"""

from __future__ import annotations

import os
import py_compile
import shutil
from pathlib import Path

import pytest

from apply_support import DEMO_SERIES, tree_hashes
from conftest import REPO_ROOT
from sm120kit.errors import SeriesError
from sm120kit.patching.engine import apply_series, revert_series, series_status
from sm120kit.patching.plan import plan_series
from sm120kit.patching.series import load_series
from sm120kit.sglang.target import find_target

ATTENTION = "sglang/kernels/ops/attention"


def test_series_ships_kernels_and_revert_removes_their_bytecode(installed_tree):
    package = installed_tree("0.5.23")
    top = package.parent
    # SGLang's own module imported before apply: its bytecode stays through apply and revert.
    py_compile.compile(str(top / ATTENTION / "extend_attention.py"), doraise=True)
    pristine = tree_hashes(top)

    result = apply_series(find_target(package), load_series())
    assert result.exit_code == 0, result.message
    for name in ("sm120_mla.py", "sm120_mla_mma.py"):
        shipped = top / ATTENTION / name
        assert shipped.read_bytes() == (REPO_ROOT / "kernels" / "sm120_attention" / name).read_bytes()
        assert shipped.stat().st_mode & 0o777 == 0o644
        py_compile.compile(str(shipped), doraise=True)  # what importing the patched tree leaves behind
    configs = top / "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_3_1"
    ours = sorted(p.name for p in (REPO_ROOT / "kernels" / "moe_configs" / "triton_3_3_1").iterdir())
    assert all((configs / name).is_file() for name in ours)
    status = series_status(find_target(package), load_series())
    assert status.exit_code == 0 and status.problems == ()
    assert {f.path for f in status.files} >= {f"{ATTENTION}/sm120_mla.py", f"{ATTENTION}/sm120_mla_mma.py"}

    assert revert_series(find_target(package)).exit_code == 0
    assert tree_hashes(top) == pristine, "revert left something behind (bytecode of created modules?)"


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


GOOD = '''[[files]]
source = "kernels/demo/shipped.py"
dest = "sglang/srt/sm120kit_shipped.py"
releases = ">=0.5.2"
'''


def test_a_shipped_file_is_planned_applied_and_reverted_like_a_created_file(tmp_path, installed_tree):
    series = load_series(_series_copy(tmp_path, GOOD))
    package = installed_tree("0.5.23")
    pristine = tree_hashes(package.parent)
    result = apply_series(find_target(package), series)
    assert result.exit_code == 0, result.message
    assert (package / "srt" / "sm120kit_shipped.py").read_text() == "VALUE = 1\n"
    again = plan_series(package.parent, series, version="0.5.23")
    assert {p.patch_id: str(p.status) for p in again.patches}["demo-new-module"] == "already-applied"
    assert revert_series(find_target(package)).exit_code == 0
    assert tree_hashes(package.parent) == pristine


def test_a_destination_that_exists_with_other_bytes_is_a_conflict(tmp_path, release_dir):
    root = release_dir("0.5.23")
    entry = GOOD.replace("sglang/srt/sm120kit_shipped.py", "sglang/version.py")
    plan = plan_series(root, load_series(_series_copy(tmp_path, entry)), version="0.5.23", recorded=())
    row = next(p for p in plan.patches if p.patch_id == "demo-new-module")
    assert str(row.status) == "conflict" and "sglang/version.py" in row.reason


@pytest.mark.parametrize("change, words", [
    (('source = "kernels/demo/shipped.py"', 'source = "../kernels/demo/shipped.py"'), "'..' component"),
    (('source = "kernels/demo/shipped.py"', 'source = "/etc/passwd"'), "not a relative path"),
    (('source = "kernels/demo/shipped.py"', 'source = "kernels/demo/absent.py"'), "does not exist"),
    (('dest = "sglang/srt/sm120kit_shipped.py"', 'dest = "other/x.py"'), "does not start with 'sglang/'"),
    (('dest = "sglang/srt/sm120kit_shipped.py"', 'dest = "sglang/.sm120kit/x.py"'), "state folder"),
    (('releases = ">=0.5.2"', 'releases = "<0.5.0"'), "would never be shipped"),
    (('releases = ">=0.5.2"', 'releases = "soon"'), "not a PEP 440 specifier"),
    (('releases = ">=0.5.2"\n', 'releases = ">=0.5.2"\nmode = "4755"\n'), "unknown key 'mode'"),
])
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
    with pytest.raises(SeriesError, match="symbolic link"):
        load_series(series)
