"""Terminal output: the progress bar is drawn on a terminal only, colour follows ``NO_COLOR``, ``-q`` keeps
results, every command ends through one exit path, and the help texts say what they do."""

from __future__ import annotations

import io
import os
import re
import sys

import click
import pytest
from click.testing import CliRunner

from sm120kit.cli.common import AppContext
from sm120kit.ui import Console

ANSI = re.compile(r"\x1b\[")
LONG = "/a/very/long/path/to/some/file/in/the/sglang/tree/" * 8


def _read_all(fd: int) -> str:
    """Everything written to the pseudo-terminal ``fd`` so far (a read may return part of it)."""
    import select

    chunks = []
    while select.select([fd], [], [], 0.5)[0]:
        try:
            data = os.read(fd, 100_000)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode()


def _progress(console: Console, total: int = 5) -> None:
    for i in range(1, total + 1):
        console.progress(i, total, f"{LONG}{i}")


# -- progress ------------------------------------------------------------------------------------------------
def test_progress_without_a_terminal_prints_a_start_and_an_end_line():
    out = io.StringIO()
    _progress(Console(stream=out))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("[1/5] ") and lines[1].startswith("[5/5] ")
    assert "\r" not in out.getvalue() and not ANSI.search(out.getvalue())


def test_progress_without_a_terminal_is_silent_with_quiet():
    out = io.StringIO()
    _progress(Console(stream=out, quiet=True))
    assert out.getvalue() == ""


def test_progress_through_a_pipe_draws_no_bar(tmp_path):
    read, write = os.pipe()
    with os.fdopen(write, "w") as stream:
        _progress(Console(stream=stream), total=40)
    with os.fdopen(read) as stream:
        text = stream.read()
    assert text.count("\n") == 2 and "#" not in text and "\r" not in text


def test_a_command_run_by_clirunner_draws_no_bar():
    @click.command()
    @click.pass_obj
    def long_step(app: AppContext) -> None:
        console = app.console()
        _progress(console, total=30)
        console.info("result")

    result = CliRunner().invoke(long_step, [], obj=AppContext())
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"[1/30] {LONG}1", f"[30/30] {LONG}30", "result"]


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
def test_progress_on_a_terminal_draws_one_bar_that_fits_the_width(monkeypatch):
    pty = pytest.importorskip("pty")
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.delenv("NO_COLOR", raising=False)
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w") as stream:
            _progress(Console(stream=stream), total=12)
        text = _read_all(master)
    finally:
        os.close(master)
    assert "[" in text and "#" in text and "12/12" in text
    visible = re.sub(r"\x1b\[\?25[lh]", "", text)
    redraws = [part for line in visible.split("\n") for part in line.split("\r")]
    assert max(len(p.rstrip()) for p in redraws) <= 60, redraws
    assert visible.count("\n") == 1  # one bar, redrawn in place, ended once
    assert "..." in visible  # the long label was cut, not wrapped


def test_progress_on_a_terminal_is_silent_with_quiet():
    pty = pytest.importorskip("pty")
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w") as stream:
            _progress(Console(stream=stream, quiet=True))
            stream.write("end\n")
        text = _read_all(master)
    finally:
        os.close(master)
    assert text.strip() == "end"


# -- colour ----------------------------------------------------------------------------------------------------
def _main(args: list[str], env: dict[str, str | None]) -> tuple[int, str, str]:
    """Run ``main`` (the real exit path) with colour forced on, as on a terminal: exit code, stdout, stderr."""
    from sm120kit.cli import main

    runner = CliRunner()
    with runner.isolation(env=env, color=True) as (out, err, _):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        return code, out.getvalue().decode(), err.getvalue().decode()


@pytest.mark.parametrize("value", ["1", "true", "no"])
def test_no_color_removes_colour_from_the_error_line(tmp_path, value):
    code, out, err = _main(["apply", str(tmp_path / "missing")], {"NO_COLOR": value})
    assert code != 0 and "error: " in err
    assert not ANSI.search(err) and not ANSI.search(out)


def test_the_error_line_is_red_without_no_color(tmp_path):
    code, _, err = _main(["apply", str(tmp_path / "missing")], {"NO_COLOR": None})
    assert code != 0 and "\x1b[31merror: " in err


def test_an_empty_no_color_keeps_colour(tmp_path):
    code, _, err = _main(["apply", str(tmp_path / "missing")], {"NO_COLOR": ""})
    assert code != 0 and "\x1b[31merror: " in err


def test_no_color_removes_colour_from_a_console_on_a_terminal(monkeypatch):
    pty = pytest.importorskip("pty")
    monkeypatch.setenv("NO_COLOR", "1")
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w") as stream:
            console = Console(stream=stream)
            with console.step("work"):
                console.progress(1, 1, "x")
        text = _read_all(master)
    finally:
        os.close(master)
    assert "work" in text and not re.search(r"\x1b\[[0-9;]*m", text)


# -- -q keeps results ------------------------------------------------------------------------------------------
def _invoke(*args: str):
    from sm120kit.cli import _register, cli

    _register()
    return CliRunner().invoke(cli, list(args))


def test_quiet_patches_prints_the_list():
    from apply_support import DEMO_EXPECTED, DEMO_SERIES

    quiet = _invoke("-q", "patches", "--series", str(DEMO_SERIES))
    loud = _invoke("patches", "--series", str(DEMO_SERIES))
    assert quiet.exit_code == loud.exit_code == 0, quiet.output
    ids = {i for expected in DEMO_EXPECTED.values() for i in expected}
    assert ids and all(i in quiet.output for i in ids)
    assert "series: " in quiet.output and "-v shows" not in quiet.output  # the hint goes, the result stays
    assert quiet.output in loud.output.replace(
        "(-v shows each patch's problem, change, upstream note and variants)\n", ""
    )


def test_quiet_status_prints_the_result(installed_tree):
    from apply_support import DEMO_SERIES

    package = installed_tree("0.5.6", link=True)  # status only reads it
    quiet = _invoke("-q", "status", str(package), "--series", str(DEMO_SERIES))
    loud = _invoke("status", str(package), "--series", str(DEMO_SERIES))
    assert quiet.exit_code == loud.exit_code == 0, quiet.output
    assert quiet.output == loud.output
    assert "target: " in quiet.output and "series: " in quiet.output and "not-applied" in quiet.output


# -- one exit path ---------------------------------------------------------------------------------------------
def _exits_outside_main() -> list[str]:
    """Calls in sm120kit/cli that end the process or print an error line, outside ``cli.main``."""
    import ast
    from pathlib import Path

    import sm120kit.cli

    found = []
    folder = Path(sm120kit.cli.__file__).parent
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        allowed: set[int] = set()
        if path.name == "__init__.py":
            main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
            allowed = {id(n) for n in ast.walk(main)}
        for node in ast.walk(tree):
            if id(node) in allowed:
                continue
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in ("exit", "_exit", "abort", "echo_error", "secho"):
                    found.append(f"{where} {ast.unparse(node)[:60]}")
            elif isinstance(node, ast.Raise) and node.exc is not None and "SystemExit" in ast.unparse(node.exc):
                found.append(f"{where} raise SystemExit")
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith(("error: ", "interrupted: "))
            ):
                found.append(f"{where} {node.value!r}")
    return found


def test_every_command_ends_through_main():
    assert _exits_outside_main() == []


def test_a_check_that_failed_prints_its_result_then_one_error_line(tmp_path):
    from sm120kit.cli.common import ExitAfterResult, exit_with

    exit_with(0, "nothing")  # no failure: no exit
    with pytest.raises(ExitAfterResult) as info:
        exit_with(13, "2 of 3 checks failed.")
    assert info.value.code == 13

    @click.command()
    def failing() -> None:
        click.echo("the result")
        exit_with(13, "2 of 3 checks failed.")

    from sm120kit import cli as cli_package

    cli_package.cli.add_command(failing, "test-failing")
    try:
        code, out, err = _main(["test-failing"], {"NO_COLOR": "1"})
    finally:
        cli_package.cli.commands.pop("test-failing")
    assert (code, out) == (13, "the result\n")
    assert err == "error: 2 of 3 checks failed.\n"


# -- help ------------------------------------------------------------------------------------------------------
def _help(*words: str) -> str:
    result = _invoke(*words, "--help")
    assert result.exit_code == 0, result.output
    return re.sub(r"-\n\s+", "-", result.output)  # a word the formatter broke at a hyphen, joined again


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("command", ["audit", "explain", "verify", "build-kernel"])
def test_the_capability_option_is_spelled_arch(command):
    text = _help(command)
    assert re.search(r"^\s+--arch CC\b", text, re.M), text
    assert not re.search(r"--(capability|cc|compute-capability)\b", text)


def test_explain_keeps_capability_as_a_hidden_alias():
    from sm120kit.cli import _register, cli

    _register()
    params = {p.name: p for p in cli.commands["explain"].params}
    assert params["capability_alias"].opts == ["--capability"] and params["capability_alias"].hidden
    assert params["capabilities"].opts == ["--arch"]


def test_explain_capability_alias_parses_like_arch(monkeypatch):
    from sm120kit.cli import explain as explain_cli

    seen = {}

    class Stop(Exception):
        pass

    def fake(root, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(explain_cli.backend_audit, "audit_backends", fake)
    result = _invoke("explain", ".", "--arch", "12.0", "--capability", "12.1")
    assert isinstance(result.exception, Stop), result.output
    assert seen["capabilities"] == ("12.0", "12.1")


@pytest.mark.parametrize("command", ["status", "revert"])
def test_release_help_says_what_it_does(command):
    text = _flat(_help(command))
    doing = {"status": "Show the patch states of", "revert": "Restore the original files of"}[command]
    assert f"--release X {doing} the cached working copy of SGLang release X" in text


def test_json_help_names_the_schema_document():
    from test_cli_contract import _commands

    for name in _commands():
        assert "docs/json-schema.md" in _flat(_help(*name.split())), name


def test_the_command_list_shows_whole_summaries():
    from test_cli_contract import _commands

    text = _flat(_help())
    for name, command in _commands().items():
        if " " in name:
            continue
        summary = command.get_short_help_str(limit=10_000)
        assert not summary.endswith("...") and summary.endswith("."), (name, summary)
        assert f"{name} {summary}" in text, name


# -- core code reports through callbacks -----------------------------------------------------------------------
# serve/recipes.py still takes a console (its split into modules is under way); nothing else may.
CONSOLE_PENDING: set[str] = set()


def test_core_code_takes_callbacks_not_a_console():
    import ast
    from pathlib import Path

    import sm120kit

    package = Path(sm120kit.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.startswith("cli/") or rel == "ui.py" or rel in CONSOLE_PENDING:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                if any("console" in n for n in names):
                    found.append(f"{rel}:{node.lineno} {node.name}")
            elif isinstance(node, ast.Attribute) and node.attr == "console":
                found.append(f"{rel}:{node.lineno} .console")
    assert found == []


def test_fetch_releases_reports_through_its_callbacks(monkeypatch, tmp_path):
    from sm120kit.upstream import matrix

    monkeypatch.setattr(matrix.releases, "release_dir", lambda v: tmp_path / v)
    monkeypatch.setattr(matrix.releases, "fetch_release", lambda v: tmp_path / v)
    steps, ticks = [], []
    matrix.fetch_releases(["0.5.2", "0.5.3"], jobs=1, progress=lambda *a: ticks.append(a), on_step=steps.append)
    assert steps == ["downloading 2 SGLang release(s) from PyPI (1 at a time) ..."]
    assert sorted(ticks) == [(1, 2, "downloaded 0.5.2"), (2, 2, "downloaded 0.5.3")] or [t[:2] for t in ticks] == [
        (1, 2),
        (2, 2),
    ]


def test_progress_goes_to_stderr_and_results_to_stdout():
    @click.command()
    @click.pass_obj
    def long_step(app: AppContext) -> None:
        console = app.console()
        _progress(console, total=3)
        console.info("result")

    result = CliRunner().invoke(long_step, [], obj=AppContext())
    assert result.stdout == "result\n"
    assert result.stderr.splitlines() == [f"[1/3] {LONG}1", f"[3/3] {LONG}3"]
