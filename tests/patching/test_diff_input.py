"""Bad or unusual diff input gets a clear error naming the file and line (exit 8), never silence, a
traceback or a file with a mangled name: CRLF diffs, NUL and control characters in paths, git-quoted
paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from apply_support import run_cli, small_tree, tree_hashes, utils_series, write_series

from sm120kit.patching.hunks import unquote_path


def _series_with(tmp_path: Path, diff: str, name: str = "series") -> Path:
    folder = tmp_path / name
    write_series(folder, [{"id": "p", "diffs": {"a.diff": "x"}, "variants": [("a.diff", ">=0.5", "0.5.2")]}])
    (folder / "p" / "a.diff").write_bytes(diff.encode("utf-8"))
    return folder


def _new_file(header_path: str, body: str = "+X = 1\n") -> str:
    return (
        f"diff --git {header_path.replace('sglang/', 'a/sglang/', 1)} {header_path.replace('sglang/', 'b/sglang/', 1)}\n"
        "new file mode 100644\n--- /dev/null\n"
        f"+++ {header_path.replace('sglang/', 'b/sglang/', 1)}\n@@ -0,0 +1 @@\n{body}"
    )


def test_crlf_diff_is_a_series_error_not_silently_not_applicable(tmp_path):
    package = small_tree(tmp_path / "site")
    series = utils_series(tmp_path / "series", package.parent)
    diff = series / "edit-utils" / "a.diff"
    diff.write_bytes(diff.read_bytes().replace(b"\n", b"\r\n"))
    before = tree_hashes(package.parent)
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 8, (proc.returncode, proc.stdout, proc.stderr)
    assert f"{diff}:1:" in proc.stderr and "CRLF" in proc.stderr and "Traceback" not in proc.stderr
    assert tree_hashes(package.parent) == before


def test_a_file_with_crlf_lines_is_still_patched_exactly(tmp_path):
    """A diff of a file whose own lines end in CRLF has LF headers and CR in its lines: that is data."""
    package = small_tree(tmp_path / "site")
    root = package.parent
    (package / "srt" / "dos.py").write_bytes(b"".join(b"LINE_%d = %d\r\n" % (i, i) for i in range(20)))
    pristine = tree_hashes(root)
    text = (package / "srt" / "dos.py").read_bytes().decode()
    import difflib

    new = text.replace("LINE_4 = 4\r\n", "LINE_4 = 40\r\n")
    diff = "".join(
        difflib.unified_diff(
            text.splitlines(keepends=True), new.splitlines(keepends=True), "a/sglang/srt/dos.py", "b/sglang/srt/dos.py"
        )
    )
    diff = diff.replace("--- a/sglang/srt/dos.py\r\n", "--- a/sglang/srt/dos.py\n")  # headers in LF
    series = _series_with(tmp_path, diff)
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert (package / "srt" / "dos.py").read_bytes() == new.encode()
    assert run_cli("revert", str(package)).returncode == 0
    assert tree_hashes(root) == pristine


@pytest.mark.parametrize(
    "path,shown",
    [
        ("sglang/srt/a\x00b.py", "\\x00"),
        ('"sglang/srt/a\\000b.py"', "\\x00"),
        ('"sglang/srt/a\\nb.py"', "\\n"),
        ('"sglang/srt/a\\tb.py"', "\\t"),
    ],
)
def test_control_characters_in_diff_paths_are_a_series_error(tmp_path, path, shown):
    package = small_tree(tmp_path / "site")
    series = _series_with(tmp_path, _new_file(path))
    before = tree_hashes(package.parent)
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 8, (proc.returncode, proc.stderr)
    assert "a.diff:" in proc.stderr and "control character" in proc.stderr and shown in proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert tree_hashes(package.parent) == before
    assert not [p for p in (package / "srt").iterdir() if p.name.startswith("a")]


def test_git_quoted_paths_are_unescaped(tmp_path):
    """git writes non-ASCII bytes of a path as octal escapes inside quotes."""
    package = small_tree(tmp_path / "site")
    series = _series_with(tmp_path, _new_file('"sglang/srt/caf\\303\\251 \\"q\\".py"'))
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 0, proc.stderr
    assert (package / "srt" / 'café "q".py').read_text() == "X = 1\n"
    assert sorted(p.name for p in (package / "srt").iterdir()) == ["__init__.py", 'café "q".py', "utils.py"]
    assert run_cli("revert", str(package)).returncode == 0
    assert not (package / "srt" / 'café "q".py').exists()


def test_unquote_path():
    assert unquote_path('"a/x\\\\y\\"z\\t"') == 'a/x\\y"z\t'
    assert unquote_path("a/plain.py") == "a/plain.py"
    for bad in ('"a/open', '"a/\\q"', '"a/\\377"'):
        with pytest.raises(ValueError):
            unquote_path(bad)


def test_malformed_quoted_path_is_a_series_error(tmp_path):
    package = small_tree(tmp_path / "site")
    series = _series_with(tmp_path, _new_file('"sglang/srt/bad\\qescape.py"'))
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 8 and "unknown escape" in proc.stderr, proc.stderr
