"""Reading a patch series: the demonstration series loads; every malformed input names file and line."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from apply_support import DEMO_SERIES

from sm120kit.errors import SeriesError
from sm120kit.patching.series import load_series


@pytest.fixture
def series_copy(tmp_path) -> Path:
    dest = tmp_path / "series"
    shutil.copytree(DEMO_SERIES, dest)
    return dest


def test_demo_series_loads_with_variants_markers_and_parsed_diffs():
    series = load_series(DEMO_SERIES)
    assert [p.id for p in series.patches] == ["demo-capability-helper", "demo-extend-attention-note", "demo-new-module"]
    note = series.get("demo-extend-attention-note")
    assert [v.name for v in note.variants_newest_first()] == ["0.5.23.diff", "0.5.6.diff"]
    assert note.variant_for("0.5.10").name == "0.5.6.diff"
    assert note.variant_for("0.5.16").name == "0.5.23.diff"
    assert note.variant_for("0.5.6.post2").name == "0.5.6.diff"
    assert note.upstream.forwarded is False and note.upstream.reason
    old = note.variant_for("0.5.2")
    assert len(old.patch_set) == 1 and len(old.patch_set[0]) == 2  # unidiff: one file, two hunks
    assert old.files[0].path == "sglang/srt/layers/attention/triton_ops/extend_attention.py"
    helper = series.get("demo-capability-helper")
    assert helper.variant_for("0.5.6") is None
    assert helper.markers[0].files == ("sglang/srt/utils/common.py", "sglang/srt/utils.py")
    assert helper.markers[0].pattern.search("def is_sm120_supported(device=None)")
    new = series.get("demo-new-module").variants[0].files[0]
    assert new.action == "create" and new.mode == 0o644 and "SM120KIT_DEMO_MODULE" in new.target_text


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def _line_of(path: Path, needle: str) -> int:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return number
    raise AssertionError(needle)


def _error(folder: Path) -> str:
    with pytest.raises(SeriesError) as info:
        load_series(folder)
    return info.value.render()


def _error_at_line(series: Path, toml: Path, needle: str) -> str:
    """The series' load error, which must name ``toml`` and the line of it that holds ``needle``."""
    message = _error(series)
    assert f"{toml}:{_line_of(toml, needle)}:" in message, message
    return message


def test_unknown_key_names_file_line_and_suggests(series_copy):
    toml = series_copy / "demo-new-module" / "patch.toml"
    _edit(toml, 'title = "Demo', 'titel = "Demo')
    message = _error_at_line(series_copy, toml, "titel =")
    assert "unknown key 'titel'" in message and "Did you mean 'title'?" in message


def test_unknown_key_in_a_variant_table(series_copy):
    toml = series_copy / "demo-extend-attention-note" / "patch.toml"
    _edit(toml, 'releases = ">=0.5.16"', 'release = ">=0.5.16"')
    message = _error_at_line(series_copy, toml, "release = ")
    assert "[[variants]] entry 2" in message and "Did you mean 'releases'?" in message


def test_toml_syntax_error_has_line_and_column(series_copy):
    toml = series_copy / "demo-capability-helper" / "patch.toml"
    _edit(toml, "forwarded = true", "forwarded = tru")
    message = _error(series_copy)
    assert re.search(rf"{re.escape(str(toml))}:{_line_of(toml, 'forwarded = tru')}:\d+: not valid TOML", message)


@pytest.mark.parametrize(
    "old,new,needle,expect",
    [
        ('releases = ">=0.5.2,<0.5.3"', 'releases = ">=0.5.2,<<0.5.3"', "releases =", "not a PEP 440 specifier"),
        ('base = "0.5.2"', 'base = "0.5.9"', "base =", "outside its own releases range"),
        ('diff = "0.5.2.diff"', 'diff = "0.5.2.dif"', "diff =", "Did you mean '0.5.2.diff'?"),
        (
            "pattern = 'is_sm120_supported\\b'",
            "pattern = 'is_sm120_supported('",
            "pattern =",
            "not a valid regular expression",
        ),
        ("forwarded = true", 'forwarded = "yes"', "forwarded =", "must be a boolean"),
        (
            'reference = "https://github.com/sgl-project/sglang/pull/11801"',
            'reference = "PR 11801"',
            "reference =",
            "URL of its pull request",
        ),
    ],
)
def test_bad_values_name_the_line(series_copy, old, new, needle, expect):
    toml = series_copy / "demo-capability-helper" / "patch.toml"
    _edit(toml, old, new)
    message = _error_at_line(series_copy, toml, needle)
    assert expect in message


def test_overlapping_variant_ranges_are_rejected(series_copy):
    toml = series_copy / "demo-extend-attention-note" / "patch.toml"
    _edit(toml, 'releases = ">=0.5.2,<0.5.16"', 'releases = ">=0.5.2,<0.5.20"')
    assert "overlap" in _error(series_copy)


def test_not_forwarded_needs_a_reason(series_copy):
    toml = series_copy / "demo-new-module" / "patch.toml"
    _edit(toml, 'reason = "demonstration patch for the test suite"', "")
    assert "reason" in _error_at_line(series_copy, toml, "forwarded = false")


def test_id_must_match_folder(series_copy):
    toml = series_copy / "demo-new-module" / "patch.toml"
    _edit(toml, 'id = "demo-new-module"', 'id = "demo-new-modul"')
    assert f"{toml}:1: id 'demo-new-modul' differs from its folder name" in _error(series_copy)


def test_series_names_missing_patch_with_suggestion_and_unlisted_folder(series_copy):
    toml = series_copy / "series.toml"
    _edit(toml, '"demo-new-module"]', '"demo-new-modul"]')
    assert "Did you mean 'demo-new-module'?" in _error_at_line(series_copy, toml, "patches =")
    _edit(toml, ', "demo-new-modul"]', "]")
    assert "does not list" in _error(series_copy)


def test_corrupt_diff_names_diff_file_and_line(series_copy):
    diff = series_copy / "demo-extend-attention-note" / "0.5.6.diff"
    lines = diff.read_text().splitlines(keepends=True)
    # Drop one context line from the first hunk: the header's line counts no longer add up.
    del lines[5]
    diff.write_text("".join(lines))
    message = _error(series_copy)
    assert re.search(rf"{re.escape(str(diff))}:\d+: not a valid unified diff", message), message
    line = int(re.search(rf"{re.escape(str(diff))}:(\d+):", message).group(1))
    assert 4 <= line <= len(lines)


def test_diff_outside_the_package_is_rejected(series_copy):
    diff = series_copy / "demo-capability-helper" / "0.5.2.diff"
    diff.write_text(
        diff.read_text()
        .replace("a/sglang/srt/utils.py", "a/python/sglang/srt/utils.py")
        .replace("b/sglang/srt/utils.py", "b/python/sglang/srt/utils.py")
    )
    message = _error(series_copy)
    assert f"{diff}:2:" in message and "not inside the package" in message  # the +++ line


def test_empty_diff_is_rejected(series_copy):
    diff = series_copy / "demo-capability-helper" / "0.5.2.diff"
    diff.write_text("this is not a diff\n")
    assert "holds no file changes" in _error(series_copy)


def test_missing_and_empty_series(tmp_path):
    assert "does not exist" in _error(tmp_path / "nothing")
    assert "has no series.toml yet" in _error(tmp_path)
    (tmp_path / "series.toml").write_text("patches = []\n")
    assert load_series(tmp_path).patches == ()
    (tmp_path / "series.toml").write_text("")
    assert load_series(tmp_path).patches == ()


# -- audit: the shared-memory audit cases that prove a patch's kernels ---------------------------------------


def test_audit_entries_are_read_and_optional(series_copy):
    toml = series_copy / "demo-extend-attention-note" / "patch.toml"
    _edit(toml, "\n[upstream]", '\naudit = ["extend/deepseek-v3-mla", "prefill/vision-hd256"]\n\n[upstream]')
    series = load_series(series_copy)
    assert series.get("demo-extend-attention-note").audit == ("extend/deepseek-v3-mla", "prefill/vision-hd256")
    assert series.get("demo-new-module").audit == ()
    assert series.get("demo-extend-attention-note").to_json()["audit"] == [
        "extend/deepseek-v3-mla",
        "prefill/vision-hd256",
    ]


@pytest.mark.parametrize(
    "value,expect",
    [
        ('"extend/x"', "'audit' in patch.toml must be a array"),
        ("[]", "'audit' is empty"),
        ('["deepseek-v3-mla"]', 'is not "launcher/entry"'),
        ('["extnd/deepseek-v3-mla"]', "names the launcher 'extnd'"),
        ('["extend/a", "extend/a"]', "lists 'extend/a' twice"),
        ("[3]", "entry 1 of 'audit' (3)"),
    ],
)
def test_bad_audit_entries_name_the_line(series_copy, value, expect):
    toml = series_copy / "demo-extend-attention-note" / "patch.toml"
    _edit(toml, "\n[upstream]", f"\naudit = {value}\n\n[upstream]")
    message = _error(series_copy)
    assert f"{toml}:{_line_of(toml, 'audit =')}:" in message, message
    assert expect in message, message
