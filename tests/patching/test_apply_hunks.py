"""Placing hunks in memory: exact by default, offsets found and reported, fuzz only when asked, EOF newlines."""

from __future__ import annotations

import difflib

import unidiff

from sm120kit.patching.hunks import file_diffs, place_hunks, split_lines


def _diff(old: str, new: str, n: int = 3, path: str = "sglang/x.py"):
    text = "".join(difflib.unified_diff(split_lines(old), split_lines(new), f"a/{path}", f"b/{path}", n=n))
    return file_diffs(unidiff.PatchSet(split_lines(text)))[0]


OLD = "".join(f"line {i}\n" for i in range(1, 41))
NEW = OLD.replace("line 10\n", "line 10 changed\n").replace("line 30\n", "line 30\nline 30b\n")


def test_exact_placement_and_round_trip():
    diff = _diff(OLD, NEW)
    forward = place_hunks(split_lines(OLD), diff)
    assert forward.ok and "".join(forward.lines) == NEW
    assert [h.offset for h in forward.results] == [0, 0]
    back = place_hunks(split_lines(NEW), diff, reverse=True)
    assert back.ok and "".join(back.lines) == OLD
    # Applying again fails forward: its source lines are gone.
    assert not place_hunks(split_lines(NEW), diff).ok


def test_offsets_are_found_and_reported():
    diff = _diff(OLD, NEW)
    shifted = "".join(f"header {i}\n" for i in range(7)) + OLD
    placed = place_hunks(split_lines(shifted), diff)
    assert placed.ok
    assert [h.offset for h in placed.results] == [7, 7]
    assert [h.line for h in placed.results] == [7 + 7, 28 + 7]  # hunks start at lines 7 and 28
    assert "".join(placed.lines) == "".join(f"header {i}\n" for i in range(7)) + NEW


def test_context_change_is_a_conflict_without_fuzz_and_fits_with_fuzz():
    diff = _diff(OLD, NEW)
    drifted = OLD.replace("line 7\n", "line seven\n")  # first context line of hunk 1
    failed = place_hunks(split_lines(drifted), diff)
    assert not failed.ok
    bad = failed.results[0]
    assert bad.status == "conflict" and bad.index == 1
    assert bad.expected[0] == "line 7" and bad.found[0] == "line seven"
    assert bad.closest_line == 7
    fuzzed = place_hunks(split_lines(drifted), diff, fuzz=1)
    assert fuzzed.ok and fuzzed.results[0].fuzz == 1 and fuzzed.results[1].fuzz == 0
    assert "line 10 changed\n" in fuzzed.lines


def test_changed_line_itself_is_never_fuzzed():
    diff = _diff(OLD, NEW)
    moved = OLD.replace("line 10\n", "line ten\n")
    assert not place_hunks(split_lines(moved), diff, fuzz=3).ok


def test_no_newline_at_end_of_file():
    old, new = "a\nb\nc", "a\nb\nC"
    text = (
        "--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1,3 +1,3 @@\n a\n b\n-c\n"
        "\\ No newline at end of file\n+C\n\\ No newline at end of file\n"
    )
    diff = file_diffs(unidiff.PatchSet(split_lines(text)))[0]
    assert diff.hunks[0].source[-1] == "c" and diff.hunks[0].target[-1] == "C"
    placed = place_hunks(split_lines(old), diff)
    assert placed.ok and "".join(placed.lines) == new
    # The same diff does not match a file whose last line does end with a newline.
    assert not place_hunks(split_lines(old + "\n"), diff).ok


def test_split_lines_keeps_form_feeds_and_carriage_returns_inside_lines():
    text = "a\x0cb\nc\r\nd"
    assert split_lines(text) == ["a\x0cb\n", "c\r\n", "d"]
    assert "".join(split_lines(text)) == text


def test_hunks_do_not_overlap_and_keep_order():
    old = "x\n" * 5 + "target\n" + "x\n" * 5 + "target\n" + "x\n" * 5
    new = old.replace("target\n", "TARGET\n")
    diff = _diff(old, new, n=1)
    assert len(diff.hunks) == 2
    placed = place_hunks(split_lines(old), diff)
    assert placed.ok and "".join(placed.lines) == new
