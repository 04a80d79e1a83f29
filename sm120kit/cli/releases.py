"""``sm120kit fetch-release``: download SGLang releases from PyPI into the cache."""

from __future__ import annotations

import click

from sm120kit.cli import cli
from sm120kit.cli.common import AppContext, emit, json_option, pass_app
from sm120kit.sglang import releases


@cli.command(
    "fetch-release",
    short_help="Download SGLang VERSIONS (e.g. 0.5.23, or a range 0.5.2..0.5.23) into the cache, unpacked.",
)
@click.argument("versions", nargs=-1, required=True)
@json_option
@pass_app
def fetch_release(app: AppContext, versions: tuple[str, ...], json_mode: bool) -> None:
    """Download SGLang VERSIONS (e.g. 0.5.23, or a range 0.5.2..0.5.23) into the cache, unpacked."""
    console = app.console(json_mode)
    wanted: list[str] = []
    for text in versions:
        if releases.check_range(text) is not None:  # a malformed range is named before PyPI is asked
            wanted += releases.parse_release_range(text, releases.available_releases())
        else:
            wanted.append(releases.check_version(text))
    result = []
    for i, version in enumerate(wanted, 1):
        path = releases.fetch_release(version, on_step=console.info)
        console.progress(i, len(wanted), version)
        result.append({"version": version, "path": str(path)})
    emit(json_mode, {"releases": result}, lambda: [console.info(f"{r['version']}: {r['path']}") for r in result])
