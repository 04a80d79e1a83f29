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


def package_path(folder: Path) -> str:
    """A folder (made inside ``folder``) on which ``import sm120kit`` finds this sm120kit and nothing else, for
    a child program run in another interpreter: putting the whole folder that holds sm120kit on its path could
    put another environment's site-packages in front of its own. A link to the package alone avoids that;
    where links cannot be made, the folder holding the package is returned."""
    path = Path(folder) / "sm120kit-path"
    path.mkdir(exist_ok=True)
    link = path / "sm120kit"
    try:
        if not link.is_symlink():
            link.symlink_to(_PACKAGE, target_is_directory=True)
    except OSError:
        return str(_PACKAGE.parent)
    return str(path)
