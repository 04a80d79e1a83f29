"""Shared pieces of the CLI: the context object and the options every command takes."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import click

from sm120kit.ui import Console, print_json


@dataclass
class AppContext:
    verbose: bool = False
    quiet: bool = False

    def console(self, json_mode: bool = False) -> Console:
        return Console(verbose=self.verbose, quiet=self.quiet, json_mode=json_mode)


def json_option(func: Callable) -> Callable:
    """Add ``--json`` to a command: JSON on stdout, human progress on stderr."""
    return click.option("--json", "json_mode", is_flag=True,
                        help="Print the result as JSON on stdout (schema in the README).")(func)


def emit(json_mode: bool, data: Any, human: Callable[[], None]) -> None:
    """Print ``data`` as JSON, or call ``human()`` to print the table form."""
    if json_mode:
        print_json(data)
    else:
        human()


def pass_app(func: Callable) -> Callable:
    @click.pass_obj
    @functools.wraps(func)
    def wrapper(app: AppContext, *args, **kwargs):
        return func(app, *args, **kwargs)

    return wrapper
