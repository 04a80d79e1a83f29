"""SGLang releases from PyPI, downloaded once into the cache and unpacked as an installed package.

``fetch_release("0.5.23")`` returns a folder that holds ``sglang/`` and ``sglang-0.5.23.dist-info``, laid
out as site-packages holds them. Only the wheel is downloaded (``pip download --no-deps``); nothing is
installed and no dependency is fetched.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sm120kit.util.report import Step, tell
from sm120kit import runner
from sm120kit.util.atomicfile import building_folder
from sm120kit.errors import DownloadError, ToolFailed, UsageError
from sm120kit.util.cache import cache_dir

DEFAULT_RELEASE = "0.5.23"
"""The release the README's main command uses when none is given."""

# Platforms for which some SGLang wheel exists; the pure-Python files are the same in each.
_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in range(17, 40)) + ("manylinux2014_x86_64", "any")


def normalize(text: str) -> str:
    """The one name of a release, as PyPI and the cache folders spell it: ``v0.5.23``, ``0.5.23.0`` and
    ``" 0.5.23"`` are all ``0.5.23`` (PEP 440 normal form, three release numbers at least, no trailing
    zeros beyond them); ``0.5.6-post2`` is ``0.5.6.post2``. :class:`UsageError` if it is no version."""
    try:
        version = Version(text.strip()) if isinstance(text, str) else None
    except InvalidVersion:
        version = None
    if version is None or "/" in text or "\\" in text:
        raise UsageError(f"'{text}' is not a release version (expected something like 0.5.23 or 0.5.6.post2).")
    release = list(version.release)
    while len(release) > 3 and release[-1] == 0:
        release.pop()
    release += [0] * (3 - len(release))
    name = (f"{version.epoch}!" if version.epoch else "") + ".".join(map(str, release))
    if version.pre is not None:
        name += f"{version.pre[0]}{version.pre[1]}"
    if version.post is not None:
        name += f".post{version.post}"
    if version.dev is not None:
        name += f".dev{version.dev}"
    if version.local is not None:
        name += f"+{version.local}"
    return name


def check_version(text: str) -> str:
    """``text`` as a release name (see :func:`normalize`); :class:`UsageError` if it is no version."""
    return normalize(text)


def release_dir(version: str, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "releases" / normalize(version)


_FETCH_WAIT = 3600.0  # seconds another run's download of the same release may take


def fetch_release(version: str, *, cache: Path | None = None, on_step: Step | None = None) -> Path:
    """Download and unpack SGLang ``version`` (cached); return the folder holding ``sglang/``.

    Runs fetching the same release at once (parallel test workers, two shells) take turns on a lock in the
    cache (``releases/.VERSION.lock``); the later one finds it unpacked, so a release folder, once there, is
    never swapped under a reader."""
    from sm120kit.errors import Sm120kitError
    from sm120kit.util.lock import TreeLock

    name = normalize(version)
    dest = release_dir(name, cache)
    if (dest / "sglang" / "__init__.py").is_file():
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        lock = TreeLock(dest.parent / f".{name}.lock", command=f"fetch-release {name}", wait=_FETCH_WAIT)
        lock.acquire()
    except (OSError, Sm120kitError):  # no lock to be had there: the fetch itself names what is wrong
        return _fetch_release(name, cache=cache, on_step=on_step)
    try:
        return _fetch_release(name, cache=cache, on_step=on_step)
    finally:
        lock.release()


def _fetch_release(version: str, *, cache: Path | None = None, on_step: Step | None = None) -> Path:
    """Download and unpack SGLang ``version`` (cached); return the folder holding ``sglang/``."""
    version = normalize(version)
    dest = release_dir(version, cache)
    if (dest / "sglang" / "__init__.py").is_file():
        return dest
    wheels = (cache or cache_dir()) / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(wheels, version)
    if wheel is None:
        tell(on_step, f"downloading sglang=={version} from PyPI ...")
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
    with building_folder(dest) as tmp:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist()
                       if m.startswith("sglang/") or (m.startswith("sglang-") and ".dist-info/" in m)]
            zf.extractall(tmp, members)


def parse_release_range(text: str, available: list[str]) -> list[str]:
    """``"0.5.2..0.5.23"`` -> every version in ``available`` between the two, inclusive, sorted."""
    if ".." not in text:
        return [check_version(v.strip()) for v in text.split(",") if v.strip()]
    low, high = (check_version(p.strip()) for p in text.split("..", 1))
    lo, hi = Version(low), Version(high)
    return sorted((v for v in available if lo <= Version(v) <= hi), key=Version)


def available_releases() -> list[str]:
    """Versions of sglang on PyPI (``pip index versions``), newest last."""
    result = runner.run(runner.python_argv("-m", "pip", "index", "versions", "sglang"),
                        what="pip index versions sglang", timeout=120)
    for line in result.stdout.splitlines():
        if line.strip().startswith("Available versions:"):
            versions = [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
            return sorted(versions, key=Version)
    raise DownloadError("pip index versions sglang printed no version list.")
