"""SGLang releases from PyPI, downloaded once into the cache and unpacked as an installed package.

``fetch_release("0.5.23")`` returns a folder that holds ``sglang/`` and ``sglang-0.5.23.dist-info``, laid
out as site-packages holds them. Only the wheel is downloaded (``pip download --no-deps``); nothing is
installed and no dependency is fetched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sm120kit import runner
from sm120kit.errors import DownloadError, ToolFailed, UsageError

DEFAULT_RELEASE = "0.5.23"
"""The release the README's main command uses when none is given."""

# Platforms for which some SGLang wheel exists; the pure-Python files are the same in each.
_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in range(17, 40)) + ("manylinux2014_x86_64", "any")


def cache_dir() -> Path:
    """``$SM120KIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/sm120kit``, else ``~/.cache/sm120kit``."""
    env = os.environ.get("SM120KIT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sm120kit"


def check_version(text: str) -> str:
    try:
        Version(text)
    except InvalidVersion:
        raise UsageError(f"'{text}' is not a release version (expected something like 0.5.23 or 0.5.6.post2).")
    return text


def release_dir(version: str, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "releases" / version


def fetch_release(version: str, *, cache: Path | None = None, console=None) -> Path:
    """Download and unpack SGLang ``version`` (cached); return the folder holding ``sglang/``."""
    check_version(version)
    dest = release_dir(version, cache)
    if (dest / "sglang" / "__init__.py").is_file():
        return dest
    wheels = (cache or cache_dir()) / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(wheels, version)
    if wheel is None:
        if console:
            console.info(f"downloading sglang=={version} from PyPI ...")
        argv = runner.python_argv("-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                                  "--python-version", "3.11", "--implementation", "cp")
        for platform in _PLATFORMS:
            argv += ["--platform", platform]
        argv += ["-d", str(wheels), f"sglang=={version}"]
        try:
            runner.run(argv, what=f"download of sglang {version}", timeout=1800)
        except ToolFailed as exc:
            raise DownloadError(
                f"Could not download sglang=={version} from PyPI: "
                f"{(exc.output_tail.strip().splitlines() or ['pip gave no reason'])[-1]}",
                hint="Check the version exists (pip index versions sglang) and that PyPI is reachable.",
            ) from exc
        wheel = _find_wheel(wheels, version)
        if wheel is None:
            raise DownloadError(f"pip reported success but no sglang {version} wheel is in {wheels}.")
    _unpack(wheel, dest)
    return dest


def _find_wheel(folder: Path, version: str) -> Path | None:
    for wheel in sorted(folder.glob("sglang-*.whl")):
        parts = wheel.name.split("-")
        if len(parts) > 1 and _same_version(parts[1], version):
            return wheel
    return None


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _unpack(wheel: Path, dest: Path) -> None:
    """Unpack ``sglang/`` and the dist-info of ``wheel`` into ``dest`` atomically (temp folder + rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist()
                       if m.startswith("sglang/") or (m.startswith("sglang-") and ".dist-info/" in m)]
            zf.extractall(tmp, members)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def parse_release_range(text: str, available: list[str]) -> list[str]:
    """``"0.5.2..0.5.23"`` -> every version in ``available`` between the two, inclusive, sorted."""
    if ".." not in text:
        return [check_version(v.strip()) for v in text.split(",") if v.strip()]
    low, high = (check_version(p.strip()) for p in text.split("..", 1))
    lo, hi = Version(low), Version(high)
    return sorted((v for v in available if lo <= Version(v) <= hi), key=Version)


def available_releases(*, console=None) -> list[str]:
    """Versions of sglang on PyPI (``pip index versions``), newest last."""
    result = runner.run(runner.python_argv("-m", "pip", "index", "versions", "sglang"),
                        what="pip index versions sglang", timeout=120)
    for line in result.stdout.splitlines():
        if line.strip().startswith("Available versions:"):
            versions = [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
            return sorted(versions, key=Version)
    raise DownloadError("pip index versions sglang printed no version list.")
