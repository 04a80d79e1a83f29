"""The ``sm120kit`` command line. It parses, calls one core function, and prints; nothing else.

Each command group lives in its own module below and registers itself on :data:`cli`; :func:`main` maps
errors to exit codes (see :mod:`sm120kit.errors`). It is the one exit path: no command calls ``sys.exit`` or
prints its own ``error:`` line; a command that printed its result and fails calls
:func:`sm120kit.cli.common.exit_with`.
"""

from __future__ import annotations

import logging
import sys
import traceback

import click

from sm120kit import __version__
from sm120kit.cli.common import AppContext, ExitAfterResult
from sm120kit.errors import Interrupted, Sm120kitError, UsageError
from sm120kit.ui import echo_error, print_json


class _Group(click.Group):
    """A group whose command list shows each command's whole first sentence, wrapped, not cut at the width."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-v", "--verbose", is_flag=True, help="Show commands run, debug output and tracebacks.")
@click.option("-q", "--quiet", is_flag=True, help="Print only results and errors.")
@click.version_option(__version__, prog_name="sm120kit")
@click.pass_context
def cli(ctx: click.Context, verbose: bool, quiet: bool) -> None:
    """Make SGLang run correctly on NVIDIA SM120 GPUs (RTX PRO 6000 Blackwell, RTX 5090, DGX Spark)."""
    ctx.obj = AppContext(verbose=verbose, quiet=quiet)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s", stream=sys.stderr)


def _register() -> None:
    # One module per command group; importing it adds its commands to `cli`.
    from sm120kit.cli import (
        audit,  # noqa: F401
        build,  # noqa: F401
        explain,  # noqa: F401
        patching,  # noqa: F401
        recipes,  # noqa: F401
        releases,  # noqa: F401
        tune,  # noqa: F401
        upstream,  # noqa: F401
        verify,  # noqa: F401
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    # Only sm120kit's own options count: what follows "--" belongs to another program (serve's SGLang flags).
    own = args[: args.index("--")] if "--" in args else args
    verbose = "-v" in own or "--verbose" in own
    json_mode = "--json" in own
    try:
        _register()
        code = cli.main(args=args, prog_name="sm120kit", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except Sm120kitError as exc:
        if verbose:
            traceback.print_exc()
        if json_mode:
            print_json(exc.to_json())
        echo_error(exc.render())
        if not verbose and exc.exit_code not in (2,):
            click.echo("(run with -v for details)", err=True)
        sys.exit(exc.exit_code)
    except ExitAfterResult as exc:  # the result is printed; only the error line is left
        for message in exc.messages:
            echo_error(message)
        sys.exit(exc.code)
    except click.exceptions.Abort as exc:  # click turns Ctrl-C into Abort
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, EOFError):  # click turns EOFError into Abort too: a bug, not Ctrl-C
            sys.exit(_internal_error(cause, verbose, json_mode))
        if isinstance(cause, Interrupted):  # stopped while writing a tree: say what state it is in
            echo_error(cause.render(), prefix="interrupted: ")
        else:
            click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        if json_mode:  # a usage error found by click still leaves one error document on stdout
            kind = UsageError if exc.exit_code == UsageError.exit_code else Sm120kitError
            print_json(kind(exc.format_message()).to_json())
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        echo_error(exc.render(), prefix="interrupted: ")
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug in sm120kit, not a user error
        sys.exit(_internal_error(exc, verbose, json_mode))


def _internal_error(exc: BaseException, verbose: bool, json_mode: bool) -> int:
    """Say that sm120kit has a bug (the traceback with -v); the exit code main() ends with."""
    if verbose:
        traceback.print_exception(exc)
    message = f"internal error: {type(exc).__name__}: {exc}"[:4000]
    if json_mode:
        print_json(Sm120kitError(message).to_json())
    click.echo(message, err=True)
    click.echo("This is a bug in sm120kit; run again with -v and report the traceback.", err=True)
    return 1
