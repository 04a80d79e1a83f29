"""The TOML reader shared by the patch series and the recipes: line finding, errors, key checks."""

from __future__ import annotations

import sys

import pytest

from sm120kit.errors import RecipeError, SeriesError
from sm120kit.util import tomldoc

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DOC = '''\
# a comment with "quotes" and [brackets]
id = "demo"                                        # 2
description = """                                  # 3
key = "not a key"
[not-a-table]
[[not-an-entry]]
"""
after = 1                                          # 8
literal = \'\'\'
[still.inside] = 1
\'\'\'
quoted_end = """ends with two quotes"""""           # 12
escaped = """a \\""" b                                # 13
still = "inside"
"""
sources = [                                        # 16
  "x = 1",
  "[nope]",
  ["nested", "]"],
]
bracket = "]"                                      # 21
hash = "# [" # ]                                   # 22
notes."attention-backend".why = "w"                # 23
'dotted.literal' = 2                               # 24
"esc\\u0041" = 3                                   # 25

[upstream]                                         # 27
forwarded = true                                   # 28

[[variants]]                                       # 30
diff = "0.5.2.diff"                                # 31

[[variants]]                                       # 33
diff = "0.5.7.diff"                                # 34
releases = ">=0.5.7"                               # 35

[variants.extra]                                   # 37
note = "belongs to the second entry"               # 38

[[variants.files]]                                 # 40
path = "a"                                         # 41

[ notes . "a.b" ]                                  # 43
why = "x"                                          # 44
'''


@pytest.fixture(scope="module")
def lines() -> tomldoc.Lines:
    tomllib.loads(DOC)  # the document is valid TOML
    return tomldoc.Lines(DOC)


def test_arrays_of_tables_are_addressed_by_entry_index(lines):
    assert lines.line_of(("variants", 0)) == 30
    assert lines.line_of(("variants", 0, "diff")) == 31
    assert lines.line_of(("variants", 1)) == 33
    assert lines.line_of(("variants", 1, "diff")) == 34
    assert lines.line_of(("variants", 1, "releases")) == 35
    assert lines.line_of(("variants",)) == 30  # the array itself: its first entry
    # a sub-table and a nested array of tables belong to the latest entry
    assert lines.line_of(("variants", 1, "extra", "note")) == 38
    assert lines.line_of(("variants", 1, "files", 0, "path")) == 41
    # a key the entry lacks points at the entry's header
    assert lines.line_of(("variants", 0, "releases")) == 30


def test_multi_line_strings_hide_their_contents(lines):
    assert lines.line_of(("description",)) == 3
    assert lines.line_of(("after",)) == 8
    assert ("key",) not in lines.where and ("not-a-table",) not in lines.where
    assert ("not-an-entry",) not in lines.where and ("not-an-entry", 0) not in lines.where
    assert lines.line_of(("literal",)) == 9 and ("still.inside",) not in lines.where
    assert lines.line_of(("quoted_end",)) == 12
    assert lines.line_of(("escaped",)) == 13 and ("still",) not in lines.where


def test_multi_line_arrays_and_brackets_or_hash_inside_strings(lines):
    assert lines.line_of(("sources",)) == 16
    assert ("nope",) not in lines.where
    assert lines.line_of(("bracket",)) == 21
    assert lines.line_of(("hash",)) == 22
    # the unbalanced "]" and "[" inside strings did not leave an array open: later keys are found
    assert lines.line_of(("upstream", "forwarded")) == 28


def test_dotted_and_quoted_keys(lines):
    assert lines.line_of(("notes", "attention-backend", "why")) == 23
    assert lines.line_of(("dotted.literal",)) == 24
    assert lines.line_of(("escA",)) == 25  # escapes in a quoted key are decoded, as tomllib does
    assert lines.line_of(("notes", "a.b", "why")) == 44
    assert lines.line_of(("notes", "a.b")) == 43


def test_every_key_tomllib_reads_is_located_on_a_line_that_names_it(lines):
    data = tomllib.loads(DOC)
    text_lines = DOC.splitlines()

    def leaves(value, path):
        if isinstance(value, dict):
            for key, inner in value.items():
                yield from leaves(inner, path + (key,))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, inner in enumerate(value):
                yield from leaves(inner, path + (i,))
        else:
            yield path

    found = list(leaves(data, ()))
    assert len(found) == 19
    for path in found:
        number = lines.where.get(path)
        assert number is not None, path
        last = path[-1]
        assert last in text_lines[number - 1] or (last == "escA" and "esc" in text_lines[number - 1]), path


def test_line_of_falls_back_to_the_enclosing_table_and_else_none(lines):
    assert lines.line_of(("upstream", "reason")) == 27
    assert lines.line_of(("nowhere", "at-all")) is None
    assert lines.line_of(()) is None


def test_fail_builds_the_named_error_class_at_the_line(tmp_path):
    file = tmp_path / "patch.toml"
    file.write_text('id = "x"\n\n[[variants]]\ndiff = 1\n')
    doc = tomldoc.read(file, SeriesError)
    error = doc.fail(("variants", 0, "diff"), "bad diff.", hint="Fix it.")
    assert type(error) is SeriesError
    assert error.message == f"{file}:4: bad diff." and error.hint == "Fix it."
    assert tomldoc.Doc(file, doc.data, doc.lines, RecipeError).fail(("nope",), "m").message == f"{file}: m"


def test_read_names_file_line_and_column_in_the_callers_wording(tmp_path):
    file = tmp_path / "broken.toml"
    file.write_text("a = 1\nb = \n")
    with pytest.raises(SeriesError) as info:
        tomldoc.read(file, SeriesError, tomldoc.Wording(syntax_hint="See the docs."))
    assert info.value.message.startswith(f"{file}:2:") and ": not valid TOML: " in info.value.message
    assert "(at line" not in info.value.message and info.value.hint == "See the docs."
    with pytest.raises(RecipeError) as info:
        tomldoc.read(file, RecipeError, tomldoc.Wording(position_first=False))
    assert info.value.message.startswith(f"{file}: not valid TOML: ") and "(at line 2, column" in info.value.message

    missing = tmp_path / "missing.toml"
    with pytest.raises(RecipeError, match="Cannot read x .*missing.toml: No such file or directory"):
        tomldoc.read(missing, RecipeError, tomldoc.Wording(missing="Cannot read x {file}: {reason}."))
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"a = '\xff'\n")
    with pytest.raises(SeriesError, match=r"latin.toml: cannot be read \('utf-8' codec"):
        tomldoc.read(latin, SeriesError)


def test_check_keys_unknown_wrong_type_and_missing(tmp_path):
    file = tmp_path / "r.toml"
    file.write_text('[gpus]\ncount = true\ncapabilty = "12.0"\n')
    doc = tomldoc.read(file, RecipeError, tomldoc.Wording(keys_hint="Keys: {keys}.", sorted_keys=True))
    known = {"names": list, "count": int, "capability": (str,)}
    with pytest.raises(RecipeError) as info:
        tomldoc.check_keys(doc, {"capabilty": "12.0"}, ("gpus",), known)
    assert info.value.message == (f"{file}:3: unknown key 'capabilty' in [gpus]. Did you mean 'capability'?")
    assert info.value.hint == "Keys: capability, count, names."
    with pytest.raises(RecipeError) as info:  # true is not an integer
        tomldoc.check_keys(doc, {"count": True}, ("gpus",), known)
    assert info.value.message == f"{file}:2: 'count' in [gpus] must be an integer, not true or false (True)."
    with pytest.raises(RecipeError, match=rf"{file}:1: \[gpus\] lacks the required key 'names'\."):
        tomldoc.check_keys(doc, {"count": 2}, ("gpus",), known, required=("names",))
    tomldoc.check_keys(doc, {"count": 2, "names": ["x"]}, ("gpus",), known, required=("names",))  # passes

    series = tomldoc.Wording(
        type_names={str: "string", list: "array"},
        wanted_prefix="a ",
        alternatives={(str, list): "string or array of strings"},
    )
    doc = tomldoc.read(file, SeriesError, series)
    with pytest.raises(
        SeriesError,
        match=r"'file' in \[\[markers\]\] entry 1 must be a string or array of "
        r"strings, not int \(3\)\.",
    ):
        tomldoc.check_keys(doc, {"file": 3}, ("markers", 0), {"file": (str, list)}, what="[[markers]] entry 1")
