"""The command-line contract every command keeps: a ``--json`` option, one exit code and one kind per error
class (the table of docs/cli.md lists exactly those), ``--help`` that runs, and on bad input one JSON document on
stdout (the error document, or the result of a check that failed) with the class's exit code and no
traceback. The bad-input runs go through ``python -m sm120kit`` in subprocesses, as a user or CI runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pytest
from conftest import REPO_ROOT

from sm120kit import errors
from sm120kit.cli import _register, cli, main

REPO = REPO_ROOT

# Commands allowed to lack --json, each with the reason. Keep it empty: a command without --json breaks
# scripts and CI jobs that read sm120kit's output.
NO_JSON: dict[str, str] = {}

# Commands whose --json schema is not yet in docs/json-schema.md, with the reason.
SCHEMA_PENDING: dict[str, str] = {}  # command -> why its schema is not documented yet


def _commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> dict[str, click.Command]:
    """Every command below ``group`` (recursively), keyed by its words: ``"apply"``, ``"group sub"``."""
    _register()
    found: dict[str, click.Command] = {}
    for name, command in sorted(group.commands.items()):
        path = prefix + (name,)
        if isinstance(command, click.Group):
            found.update(_commands(command, path))
        else:
            found[" ".join(path)] = command
    return found


def _error_classes() -> list[type[errors.Sm120kitError]]:
    out, todo = [errors.Sm120kitError], [errors.Sm120kitError]
    while todo:
        for sub in todo.pop().__subclasses__():
            out.append(sub)
            todo.append(sub)
    return out


def _documented_exit_codes() -> dict[int, str]:
    """The "Exit codes" table of docs/cli.md: code -> kind ("" for rows without one)."""
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## Exit codes\s*$", text, re.M)
    assert len(headings) == 1, f"docs/cli.md has {len(headings)} '## Exit codes' sections, expected exactly one"
    section = text.split("\n## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows: dict[int, str] = {}
    for line in section.splitlines():
        m = re.match(r"^\|\s*(\d+)\s*\|\s*(?:`([^`]*)`)?\s*\|\s*(.*?)\s*\|\s*$", line)
        if m:
            code = int(m.group(1))
            assert code not in rows, f"docs/cli.md lists exit code {code} twice"
            assert m.group(3), f"docs/cli.md's exit code {code} has no meaning"
            rows[code] = m.group(2) or ""
    assert rows, "docs/cli.md's 'Exit codes' section holds no table rows"
    return rows


# -- introspection ----------------------------------------------------------------------------------------


def test_every_command_takes_json():
    commands = _commands()
    assert {"apply", "status", "audit", "verify", "build-kernel", "serve", "tune-moe"} <= set(commands)
    assert set(NO_JSON) <= set(commands), "NO_JSON names commands that do not exist"
    lacking = [
        name
        for name, command in commands.items()
        if name not in NO_JSON
        and not any(isinstance(p, click.Option) and "--json" in p.opts and p.is_flag for p in command.params)
    ]
    assert not lacking, f"commands without a --json flag: {lacking}"


def test_error_classes_have_unique_codes_and_kinds():
    classes = _error_classes()
    assert len(classes) >= 15
    by_code: dict[int, str] = {}
    by_kind: dict[str, str] = {}
    for cls in classes:
        assert isinstance(cls.exit_code, int) and cls.exit_code not in (0, 130), cls.__name__
        assert re.fullmatch(r"[a-z][a-z-]*", cls.kind), f"{cls.__name__}.kind {cls.kind!r}"
        assert by_code.setdefault(cls.exit_code, cls.__name__) == cls.__name__, (
            f"{cls.__name__} and {by_code[cls.exit_code]} share exit code {cls.exit_code}"
        )
        assert by_kind.setdefault(cls.kind, cls.__name__) == cls.__name__, (
            f"{cls.__name__} and {by_kind[cls.kind]} share kind {cls.kind!r}"
        )
        doc = cls("m", hint="h").to_json()
        assert {k: doc[k] for k in ("error", "exit_code", "message", "hint")} == {
            "error": cls.kind,
            "exit_code": cls.exit_code,
            "message": "m",
            "hint": "h",
        }
    assert errors.UsageError.exit_code == 2  # the code click gives its own usage errors


def test_documented_exit_code_table_matches_errors_py():
    table = _documented_exit_codes()
    classes = {cls.exit_code: cls.kind for cls in _error_classes()}
    documented = {code: kind for code, kind in table.items() if kind}
    assert documented == classes, (
        f"docs/cli.md lists {sorted(documented.items())}; sm120kit/errors.py has {sorted(classes.items())}"
    )
    assert {code for code, kind in table.items() if not kind} == {0, 130}  # success and interrupted


def test_json_schema_documents_every_command():
    text = (REPO / "docs" / "json-schema.md").read_text(encoding="utf-8")
    documented = {
        m
        for line in text.splitlines()
        if line.startswith("#")
        for m in re.findall(r"`sm120kit ([a-z][a-z0-9-]*)", line)
    }
    commands = set(_commands())
    assert set(SCHEMA_PENDING) <= commands, "SCHEMA_PENDING names commands that do not exist"
    missing = sorted(commands - documented - set(SCHEMA_PENDING))
    assert not missing, f"docs/json-schema.md has no section for: {missing}"


@pytest.mark.parametrize("name", sorted(_commands()))
def test_help_runs(name, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*name.split(), "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Usage: sm120kit {name} ") and "--json" in out


# -- bad input through `python -m sm120kit` --------------------------------------------------------------


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sm120kit", *args], capture_output=True, text=True, timeout=300)


def _small_elf_library() -> Path | None:
    """A small shared library of this Python (no CUDA code in it)."""
    folder = sysconfig.get_config_var("DESTSHARED")
    found = sorted(Path(folder).glob("*.so"), key=lambda p: p.stat().st_size) if folder else []
    return found[0] if found else None


# tune-moe on a plain folder with a small MoE's shape (8 experts, top 2, intermediate size 14336)
_TUNE_MOE_PLAIN = ["tune-moe", "{plain}", "-E", "8", "--intermediate-size", "14336", "--topk", "2"]
# name -> (arguments, the error kind expected); {plain} is a folder holding no SGLang, {tmp} a scratch folder.
BAD_INPUT = {
    "apply-plain-folder": (["apply", "{plain}", "--json"], "not-sglang-tree"),
    "status-plain-folder": (["status", "{plain}", "--json"], "not-sglang-tree"),
    "revert-plain-folder": (["revert", "{plain}", "--json"], "not-sglang-tree"),
    "audit-plain-folder": (["audit", "{plain}", "--json"], "not-sglang-tree"),
    "explain-plain-folder": (["explain", "{plain}", "--json"], "not-sglang-tree"),
    "verify-plain-folder": (["verify", "--sglang", "{plain}", "--no-audits", "--json"], "not-sglang-tree"),
    "serve-plain-folder": (
        ["serve", "--recipe", "qwen3-8b-rtx5090", "--sglang", "{plain}", "--dry-run", "--json"],
        "not-sglang-tree",
    ),
    "fetch-release-bad-version": (["fetch-release", "0.5.x", "--json"], "usage"),
    "patches-bad-version": (["patches", "--release", "0.5.x", "--json"], "usage"),
    "audit-bad-version": (["audit", "--release", "0.5.x", "--json"], "usage"),
    "explain-bad-version": (["explain", "--release", "0.5.x", "--json"], "usage"),
    "apply-bad-version": (["apply", "--release", "0.5.x", "--json"], "usage"),
    "build-kernel-plain-folder": (["build-kernel", "{plain}", "--out", "{tmp}/out", "--dry-run", "--json"], "usage"),
    "fetch-deps-plain-folder": (["fetch-deps", "{plain}", "--into", "{tmp}/deps", "--json"], "usage"),
    "inspect-so-missing-file": (["inspect-so", "{plain}/absent.so", "--json"], "usage"),
    "inspect-so-not-elf": (["inspect-so", "{plain}/README.md", "--json"], "usage"),
    "recipes-unknown": (["recipes", "no-such-recipe", "--json"], "usage"),
    "verify-bad-arch": (["verify", "--arch", "twelve", "--json"], "usage"),
    # usage errors click itself finds: a missing argument or option, a value outside an option's choices
    "fetch-release-no-version": (["fetch-release", "--json"], "usage"),
    "serve-no-recipe": (["serve", "--json"], "usage"),
    "audit-bad-launcher": (["audit", "--launcher", "bogus", "--json"], "usage"),
    "tune-moe-plain-folder": (
        [*_TUNE_MOE_PLAIN, "--hidden-size", "4096", "--dry-run", "--json"],
        "not-sglang-tree",
    ),
    "tune-moe-bad-block-shape": (
        [*_TUNE_MOE_PLAIN, "--block-shape", "128", "--dry-run", "--json"],
        "usage",
    ),
}


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory):
    """Every BAD_INPUT case run once, four at a time: name -> (argv, process); and the plain folder."""
    tmp = tmp_path_factory.mktemp("contract")
    plain = tmp / "not-sglang"
    plain.mkdir()
    (plain / "README.md").write_text("a folder that holds no SGLang\n")
    argvs = {name: [a.format(plain=plain, tmp=tmp) for a in args] for name, (args, _) in BAD_INPUT.items()}
    with ThreadPoolExecutor(4) as pool:
        procs = dict(zip(argvs, pool.map(_run, argvs.values())))
    return {name: (argvs[name], procs[name]) for name in BAD_INPUT}, plain


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_prints_the_error_document(bad_input_runs, case):
    runs, plain = bad_input_runs
    args, proc = runs[case]
    kind = BAD_INPUT[case][1]
    code = next(cls.exit_code for cls in _error_classes() if cls.kind == kind)
    context = f"sm120kit {' '.join(args)}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}"
    assert proc.returncode == code, context
    assert "Traceback" not in proc.stderr, context
    doc = json.loads(proc.stdout)  # exactly one document
    assert doc["error"] == kind and doc["exit_code"] == code, context
    assert doc["message"].strip(), context
    if kind == "not-sglang-tree":  # the message names the folder it looked at
        assert str(plain) in doc["message"], context
    assert "error" in proc.stderr.lower(), context  # people still get the message on stderr


def test_failed_check_keeps_one_document(tmp_path):
    """inspect-so --require on a library without the SASS: the result document only, exit 13."""
    library = _small_elf_library()
    if library is None:
        pytest.skip("this Python has no shared extension modules to inspect")
    proc = _run(["inspect-so", str(library), "--require", "sm_120a", "--json"])
    assert proc.returncode == errors.CheckFailed.exit_code, proc.stderr
    doc = json.loads(proc.stdout)
    assert "error" not in doc
    assert doc["require"] == ["sm_120a"] and doc["lacking"] == [str(library)]
    assert doc["libraries"][0]["sass"] == []
    assert "lack SASS for sm_120a" in proc.stderr and "Traceback" not in proc.stderr


def _broken_tree(root: Path, server_args: str) -> Path:
    """An SGLang-shaped tree whose ``sglang.srt.server_args`` fails on import (bad input for the audits)."""
    package = root / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "version.py").write_text('__version__ = "0.5.23"\n')
    (package / "srt" / "__init__.py").write_text("")
    (package / "srt" / "server_args.py").write_text(server_args)
    return root


@pytest.mark.slow
def test_backend_audits_on_a_broken_tree_keep_one_document(tmp_path):
    """explain and audit --backends print their result (ok: false) and exit with the class's code, without a
    second (error) document on stdout."""
    broken = _broken_tree(tmp_path / "raises", 'raise RuntimeError("broken on purpose")\n')
    missing = _broken_tree(tmp_path / "imports", "import sm120kit_contract_absent_module\n")
    with ThreadPoolExecutor(2) as pool:
        explain, audit = pool.map(
            _run,
            (
                [
                    "explain",
                    str(broken),
                    "--model",
                    "llama-mha",
                    "--capability",
                    "12.0",
                    "--flashinfer",
                    "no",
                    "--no-release-pins",
                    "--json",
                ],
                ["audit", str(missing), "--backends", "--arch", "12.0", "--json"],
            ),
        )
    assert explain.returncode == errors.CheckFailed.exit_code, explain.stderr[-2000:]
    doc = json.loads(explain.stdout)
    assert doc["ok"] is False and doc["summary"]["not_run"] == 1
    assert "broken on purpose" in doc["resolutions"][0]["error"]
    assert audit.returncode == errors.MissingDependency.exit_code, audit.stderr[-2000:]
    doc = json.loads(audit.stdout)
    assert doc["ok"] is False and doc["summary"]["not_run"] == doc["summary"]["resolutions"] > 0
    assert {r["missing_module"] for r in doc["resolutions"]} == {"sm120kit_contract_absent_module"}
    assert "Traceback" not in explain.stderr + audit.stderr
