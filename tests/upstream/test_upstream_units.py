"""The pieces of the upgrade checks on their own: metadata edits, version ranges, diff writing, merge
regions, duplicate definitions and moved-file search (on real release files). ``git merge-file`` is the
real program."""

from __future__ import annotations

import shutil
import sys

import pytest
import unidiff
from conftest import REPO_ROOT
from packaging.specifiers import SpecifierSet

from sm120kit.errors import SeriesError
from sm120kit.patching.hunks import file_diffs, place_hunks, split_lines
from sm120kit.patching.series import load_patch, load_series
from sm120kit.upstream.moved import MOVE_SIMILARITY, find_moved
from sm120kit.upstream.refresh import (
    _new_duplicates,
    conflict_regions,
    edit_metadata,
    merge_file,
    new_ranges,
    unified_diff,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = REPO_ROOT
SERIES = REPO / "patches" / "sglang"


def test_new_ranges_close_the_old_range_at_the_new_release():
    series = load_series(SERIES)
    gating = series.get("sm120-backend-gating")
    by_name = {v.name: v for v in gating.variants}
    # Open-ended newest variant: it is closed at the new release, the new one is open-ended.
    assert new_ranges(gating, by_name["0.5.21.diff"], "0.5.24") == (">=0.5.21,<0.5.24", ">=0.5.24")
    # A release inside a closed range: the new variant keeps that range's upper bound.
    assert new_ranges(gating, by_name["0.5.12.diff"], "0.5.15") == (">=0.5.12,<0.5.15", ">=0.5.15,<0.5.19")
    # A release no variant covers (past a closed range): the new range ends where the next one starts.
    ext = series.get("sm120-extend-attention")
    assert new_ranges(ext, ext.variants[1], "0.5.9") == (None, ">=0.5.9")
    prefill = series.get("sm120-prefill-attention")
    assert new_ranges(prefill, prefill.variants[0], "0.5.12") == (">=0.5.2,<0.5.12", ">=0.5.12,<0.5.16")
    for old, new in (new_ranges(gating, by_name["0.5.12.diff"], "0.5.15"),):
        assert not any(
            SpecifierSet(old).contains(v) and SpecifierSet(new).contains(v)
            for v in ("0.5.12", "0.5.14", "0.5.15", "0.5.18", "0.5.19")
        )


def test_edit_metadata_changes_two_places_and_keeps_every_other_line(tmp_path):
    folder = tmp_path / "sm120-backend-gating"
    shutil.copytree(SERIES / "sm120-backend-gating", folder)
    text = (folder / "patch.toml").read_text()
    shutil.copy(folder / "0.5.21.diff", folder / "0.5.24.diff")
    names = [v.name for v in load_patch(folder).variants]
    newest = names.index("0.5.21.diff")
    assert newest == len(names) - 1
    new = edit_metadata(text, newest, ">=0.5.21,<0.5.24", "0.5.24.diff", ">=0.5.24", "0.5.24", len(names))
    old_lines, new_lines = text.splitlines(), new.splitlines()
    removed = [line for line in old_lines if line not in new_lines]
    added = [line for line in new_lines if line not in old_lines]
    assert removed == ['releases = ">=0.5.21"']
    assert added == [
        'releases = ">=0.5.21,<0.5.24"',
        'diff = "0.5.24.diff"',
        'releases = ">=0.5.24"',
        'base = "0.5.24"',
    ]
    # The new entry goes after the last [[variants]] and before the comment that leads the markers.
    assert new.index('diff = "0.5.24.diff"') < new.index("# Present upstream only when")
    (folder / "patch.toml").write_text(new)
    patch = load_patch(folder)
    assert [str(v.releases) for v in patch.variants][-2:] == ["<0.5.24,>=0.5.21", ">=0.5.24"]
    assert patch.variant_for("0.5.24").name == "0.5.24.diff" and patch.variant_for("0.5.23").name == "0.5.21.diff"


UNUSUAL_LAYOUT = """\
id = "demo"   # comments after values, and single-quoted strings
title = 'Demo'
[upstream]
  forwarded = false
  reason = "indented keys"

[[variants]]
base = '0.5.2'        # base first: any key order
diff = "0.5.2.diff"
  releases = '>=0.5.2,<0.5.10'   # closed

[[variants]]
# a comment inside the newest entry
diff = "0.5.10.diff"
releases = ">=0.5.10"  # open-ended
base = "0.5.10"

# This comment leads the markers.
[[markers]]
file = ["a.py", 'b.py']
pattern = '^def x\\('
"""


def test_edit_metadata_keeps_comments_quoting_and_layout(tmp_path):
    new = edit_metadata(UNUSUAL_LAYOUT, 1, ">=0.5.10,<0.5.24", "0.5.24.diff", ">=0.5.24", "0.5.24", 2)
    assert new == UNUSUAL_LAYOUT.replace(
        'releases = ">=0.5.10"  # open-ended\nbase = "0.5.10"\n\n',
        'releases = ">=0.5.10,<0.5.24"  # open-ended\nbase = "0.5.10"\n\n'
        '[[variants]]\ndiff = "0.5.24.diff"\nreleases = ">=0.5.24"\nbase = "0.5.24"\n\n',
    )
    data = tomllib.loads(new)
    assert [v["releases"] for v in data["variants"]] == [">=0.5.2,<0.5.10", ">=0.5.10,<0.5.24", ">=0.5.24"]
    assert data["variants"][2] == {"diff": "0.5.24.diff", "releases": ">=0.5.24", "base": "0.5.24"}
    # A release no variant covers: no range is closed, the entry is still added after the last one (here
    # at the end of the file, after a blank line).
    last = UNUSUAL_LAYOUT.split("# This comment")[0].rstrip("\n") + "\n"
    assert edit_metadata(last, None, None, "0.5.7.diff", ">=0.5.7,<0.5.10", "0.5.7", 2) == (
        last + '\n[[variants]]\ndiff = "0.5.7.diff"\nreleases = ">=0.5.7,<0.5.10"\nbase = "0.5.7"\n'
    )


def test_edit_metadata_extends_an_inline_array_of_variants():
    text = (
        'id = "demo"\nvariants = [\n    { diff = "0.5.2.diff", releases = ">=0.5.2", base = "0.5.2" },  # one\n]\n'
        "# the rest\n[upstream]\nforwarded = false\n"
    )
    new = edit_metadata(text, 0, ">=0.5.2,<0.5.3", "0.5.3.diff", ">=0.5.3", "0.5.3", 1)
    assert new == text.replace(
        '    { diff = "0.5.2.diff", releases = ">=0.5.2", base = "0.5.2" },  # one\n',
        '    { diff = "0.5.2.diff", releases = ">=0.5.2,<0.5.3", base = "0.5.2" },  # one\n'
        '    {diff = "0.5.3.diff", releases = ">=0.5.3", base = "0.5.3"},\n',
    )
    assert tomllib.loads(new)["variants"][1] == {"diff": "0.5.3.diff", "releases": ">=0.5.3", "base": "0.5.3"}


def test_edit_metadata_keeps_the_quoting_of_the_range_it_closes():
    """A range written as a literal string ('...') is closed as one, in a table and in an inline table alike
    (tomlkit releases differ in what a plain assignment writes, so the quoting is chosen explicitly)."""
    table = "id = 'demo'\n\n[[variants]]\ndiff = '0.5.2.diff'\nreleases = '>=0.5.2'  # open\nbase = '0.5.2'\n"
    assert edit_metadata(table, 0, ">=0.5.2,<0.5.3", "0.5.3.diff", ">=0.5.3", "0.5.3", 1) == table.replace(
        "releases = '>=0.5.2'  # open\n", "releases = '>=0.5.2,<0.5.3'  # open\n"
    ) + ('\n[[variants]]\ndiff = "0.5.3.diff"\nreleases = ">=0.5.3"\nbase = "0.5.3"\n')
    inline = "variants = [{ diff = '0.5.2.diff', releases = '>=0.5.2', base = '0.5.2' }]\n"
    new = edit_metadata(inline, 0, ">=0.5.2,<0.5.3", "0.5.3.diff", ">=0.5.3", "0.5.3", 1)
    assert new.startswith("variants = [{ diff = '0.5.2.diff', releases = '>=0.5.2,<0.5.3', base = '0.5.2' },")
    assert [v["releases"] for v in tomllib.loads(new)["variants"]] == [">=0.5.2,<0.5.3", ">=0.5.3"]


def test_edit_metadata_refuses_a_layout_it_would_reorder():
    """tomlkit writes [[variants]] entries split by another table back together: that is refused, clearly."""
    split = UNUSUAL_LAYOUT.replace('[upstream]\n  forwarded = false\n  reason = "indented keys"\n\n', "")
    split = split.replace("[[variants]]\n# a comment", "[upstream]\nforwarded = false\n\n[[variants]]\n# a comment")
    assert tomllib.loads(split)["upstream"] == {"forwarded": False}
    with pytest.raises(
        SeriesError,
        match=r"cannot be edited without reordering it .* put its \[\[variants\]\] "
        r"entries together, or add the new variant by hand",
    ):
        edit_metadata(split, 1, ">=0.5.10,<0.5.24", "0.5.24.diff", ">=0.5.24", "0.5.24", 2)
    with pytest.raises(SeriesError, match="holds 2 variant entries where 3 were loaded"):
        edit_metadata(UNUSUAL_LAYOUT, 1, ">=0.5.10,<0.5.24", "0.5.24.diff", ">=0.5.24", "0.5.24", 3)


def test_unified_diff_round_trips_through_the_engine_with_and_without_final_newline():
    before = "def f():\n    return 1\n\n\nx = 1\ny = 2\nz = 3"  # no newline at the end
    after = "def f():\n    return 2\n\n\nx = 1\ny = 2\nz = 4\n"
    text = unified_diff("sglang/m.py", before, after)
    assert "\\ No newline at end of file\n" in text
    assert text.splitlines()[2] == "@@ -1,7 +1,7 @@"
    [diff] = file_diffs(unidiff.PatchSet(text))
    placed = place_hunks(split_lines(before), diff)
    assert placed.ok and "".join(placed.lines) == after
    # The hunk header carries the enclosing definition, as git's default rule picks it.
    long_before = "".join(f"    x{i} = {i}\n" for i in range(20)).replace("    x10 = 10", "def g():")
    long_after = long_before.replace("x15 = 15", "x15 = 150")
    assert "@@ -13,7 +13,7 @@ def g():" in unified_diff("sglang/m.py", long_before, long_after)
    created = unified_diff("sglang/new.py", None, "A = 1\n")
    assert created.startswith("--- /dev/null\n+++ b/sglang/new.py\n@@ -0,0 +1 @@")


def test_merge_file_clean_and_conflicting_with_regions():
    base = "a\nb\nc\nd\ne\n"
    merged, count = merge_file("A\nb\nc\nd\ne\n", base, "a\nb\nc\nd\nE\n", ("upstream", "base", "patch"))
    assert (merged, count) == ("A\nb\nc\nd\nE\n", 0)
    merged, count = merge_file("a\nB1\nc\nd\ne\n", base, "a\nB2\nc\nd\ne\n", ("upstream", "base", "patch"))
    assert count == 1
    [region] = conflict_regions("sglang/x.py", merged)
    assert (region.line, region.upstream, region.base, region.patch) == (2, ("B1",), ("b",), ("B2",))


def test_duplicate_definitions_from_a_clean_merge_are_caught():
    theirs = "def is_sm120_supported():\n    return True\n\n\ndef other():\n    pass\n"
    merged = theirs + "\n\ndef is_sm120_supported():\n    return False\n"
    assert _new_duplicates("sglang/srt/utils.py", theirs, merged) == ["is_sm120_supported"]
    assert _new_duplicates("sglang/srt/utils.py", theirs, theirs + "\n\ndef third():\n    pass\n") == []
    assert _new_duplicates("sglang/configs/x.json", theirs, merged) == []


def test_find_moved_on_real_releases(release_dir):
    old = "sglang/srt/layers/attention/triton_ops/extend_attention.py"
    reference = (release_dir("0.5.14") / old).read_text()
    moved = find_moved(release_dir("0.5.17"), old, reference)
    assert moved.new == "sglang/kernels/ops/attention/extend_attention.py"
    assert moved.similarity > 0.8 and moved.compared == "file"  # 0.87: three releases of edits since
    # Only the hunk lines to go by: the share of them found in the candidate.
    hunk_lines = reference.splitlines()[20:60]
    by_lines = find_moved(release_dir("0.5.17"), old, None, hunk_lines)
    assert by_lines.new == moved.new and by_lines.compared == "hunks"
    # A file that was removed (double-sparsity attention, gone in 0.5.11) is reported gone.
    gone_path = "sglang/srt/layers/attention/triton_ops/double_sparsity_attention.py"
    gone = find_moved(release_dir("0.5.14"), gone_path, (release_dir("0.5.10") / gone_path).read_text())
    assert gone.new is None and gone.similarity < MOVE_SIMILARITY and gone.nearest
    assert "is gone" in gone.describe()


@pytest.mark.parametrize(
    "args, message",
    [
        (("matrix",), "Name some targets"),
        (("matrix", "--releases", "9.9.1..9.9.9"), "names no SGLang release"),
        (("refresh", "no-such-patch", "--release", "0.5.2"), "has no patch 'no-such-patch'"),
        (("check-upstream", "--release", "not-a-version"), "is not a release version"),
    ],
)
def test_usage_errors_are_one_paragraph(args, message, release_dir):
    from apply_support import run_cli

    release_dir("0.5.2")
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_nightly_workflow_runs_commands_that_parse():
    """Every ``sm120kit`` command in the GitHub Actions workflow parses with the real CLI, the report goes to
    the job summary and to an issue comment, and the schedule is nightly."""
    import shlex

    import click
    import yaml

    from sm120kit.cli import _register, cli

    workflow = yaml.safe_load((REPO / "scripts" / "ci" / "nightly-upstream.yml").read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as true
    assert triggers["schedule"][0]["cron"].split()[2:] == ["*", "*", "*"]
    steps = workflow["jobs"]["check-upstream"]["steps"]
    runs = "\n".join(step.get("run", "") for step in steps)
    commands = [line.strip() for line in runs.splitlines() if line.strip().startswith("sm120kit ")]
    assert len(commands) == 2
    _register()
    for command in commands:
        words = shlex.split(
            command.split(" > ")[0]
            .replace("${{ steps.newest.outputs.version }}", "0.5.23")
            .replace("$SGLANG_REF", "origin/main")
        )
        sub = cli.get_command(click.Context(cli), words[1])
        ctx = sub.make_context(words[1], words[2:])  # raises on an unknown option or a bad value
        assert ctx.params["fmt"] == "markdown"
    assert any("--ref" in c and "--repo sglang-upstream" in c for c in commands)
    assert "$GITHUB_STEP_SUMMARY" in runs and "gh issue comment" in runs
    snippet = runs.split("python -c '", 1)[1].split("'", 1)[0]
    compile(snippet, "nightly-upstream.yml", "exec")
