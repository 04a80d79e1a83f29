"""Where the data folders (``patches/``, ``recipes/``) are: inside the wheel, or in the source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent  # sm120kit/


def data_dir(name: str) -> Path:
    """``patches`` or ``recipes``: the wheel carries them under ``sm120kit/_data``; an editable or source
    install reads them from the checkout beside the package."""
    bundled = _PACKAGE / "_data" / name
    if bundled.is_dir():
        return bundled
    return _PACKAGE.parent / name


def patches_dir() -> Path:
    return data_dir("patches")


def recipes_dir() -> Path:
    return data_dir("recipes")
