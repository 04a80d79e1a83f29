"""SGLang releases from PyPI, downloaded once into the cache and unpacked as an installed package.

``fetch_release("0.5.23")`` returns a folder that holds ``sglang/`` and ``sglang-0.5.23.dist-info``, laid
out as site-packages holds them. Only the wheel is downloaded (``pip download --no-deps``); nothing is
installed and no dependency is fetched.

A cached wheel is untrusted: it is opened only if it is a regular file (a FIFO of that name would block),
unpacked with a bound on its size (:mod:`sm120kit.util.archive`), its members checked against their CRC
and against the SHA-256 the wheel's own ``RECORD`` lists, and its executable bits kept. A wheel that fails
those checks is set aside as ``NAME.corrupt`` and downloaded again, once; a fresh download that fails them
is a :class:`DownloadError` naming the file.
"""

from __future__ import annotations

import base64
import csv
import errno
import io
import os
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sm120kit import runner
from sm120kit.errors import DownloadError, IOFailure, Sm120kitError, ToolFailed, UsageError
from sm120kit.util import archive, regularfile
from sm120kit.util.atomicfile import building_folder
from sm120kit.util.cache import cache_dir, cache_error, writable_dir
from sm120kit.util.report import Step, tell

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
    wheels = writable_dir((cache or cache_dir()) / "wheels")
    writable_dir(dest.parent)
    wheel = _find_wheel(wheels, version)
    fresh = wheel is None
    if wheel is None:
        wheel = _download(wheels, version, on_step)
    try:
        _unpack(wheel, dest)
    except archive.BadArchive as exc:
        corrupt = _set_aside(wheel)
        if fresh:
            raise _corrupt_error(wheel, exc, corrupt, downloaded=True) from None
        tell(
            on_step,
            f"the cached {wheel.name} is damaged ({exc}); set aside as {corrupt.name}, downloading it again ...",
        )
        try:
            wheel = _download(wheels, version, on_step)
        except DownloadError as again:
            raise DownloadError(
                f"The cached wheel {wheel} is damaged ({exc}); it was set aside as {corrupt}, and downloading "
                f"it again failed: {again.message}",
                hint=again.hint,
            ) from None
        try:
            _unpack(wheel, dest)
        except archive.BadArchive as second:
            raise _corrupt_error(wheel, second, _set_aside(wheel), downloaded=True) from None
    return dest


def pip_download_argv(requirement: str, dest: Path, platforms: tuple[str, ...] = _PLATFORMS) -> list[str]:
    """argv of ``pip download`` that fetches the binary wheel of ``requirement`` alone (no dependencies) into
    ``dest``, for CPython 3.11 on any of ``platforms``, whatever this interpreter is."""
    argv = runner.python_argv(
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
    )
    for platform in platforms:
        argv += ["--platform", platform]
    return argv + ["-d", str(dest), requirement]


def _download(wheels: Path, version: str, on_step: Step | None) -> Path:
    tell(on_step, f"downloading sglang=={version} from PyPI ...")
    argv = pip_download_argv(f"sglang=={version}", wheels)
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
    return wheel


def _set_aside(wheel: Path) -> Path:
    """Rename a damaged wheel to ``NAME.corrupt`` (kept for a look, never picked up again)."""
    corrupt = wheel.with_name(wheel.name + ".corrupt")
    try:
        os.replace(wheel, corrupt)
    except OSError as exc:
        raise cache_error(wheel, exc) from None
    return corrupt


def _corrupt_error(wheel: Path, exc: Exception, corrupt: Path, *, downloaded: bool) -> DownloadError:
    what = "The wheel just downloaded" if downloaded else "The cached wheel"
    return DownloadError(
        f"{what}, {wheel}, cannot be unpacked: {exc}. It was set aside as {corrupt}.",
        hint="Run the command again to download it once more; if it fails the same way, check "
        "the network or proxy between you and PyPI (or the file you placed in the cache).",
    )


def _find_wheel(folder: Path, version: str) -> Path | None:
    """The cached wheel of ``version``: a regular file (a link to one is fine). :class:`IOFailure` when the
    name is taken by something else (a FIFO would block the unpacking for good)."""
    for wheel in sorted(folder.glob("sglang-*.whl")):
        parts = wheel.name.split("-")
        if len(parts) > 1 and _same_version(parts[1], version):
            if not regularfile.is_regular(wheel):
                raise IOFailure(
                    f"The cached wheel {wheel} is {regularfile.describe(wheel)}, not a file; sm120kit "
                    "reads only regular files there.",
                    hint=f"Remove {wheel} and run the command again (the wheel is downloaded anew).",
                )
            return wheel
    return None


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _wanted(name: str) -> bool:
    return name.startswith("sglang/") or (name.startswith("sglang-") and ".dist-info/" in name)


def _unpack(wheel: Path, dest: Path) -> None:
    """Unpack ``sglang/`` and the dist-info of ``wheel`` into ``dest`` atomically (temp folder + rename),
    checking each member against the wheel's RECORD. :class:`archive.BadArchive` for a damaged wheel,
    :class:`IOFailure` for the disk (full, read-only)."""
    try:
        fd = regularfile.open_regular(wheel)
    except OSError as exc:
        raise IOFailure(
            f"Cannot read the cached wheel {wheel}: {exc.strerror or exc}.",
            hint=f"Remove {wheel} and run the command again (the wheel is downloaded anew).",
        ) from None
    with os.fdopen(fd, "rb") as handle:
        try:
            with building_folder(dest) as tmp:
                digests: dict[str, str] = {}
                archive.unpack(handle, tmp, select=_wanted, digests=digests)
                if not (tmp / "sglang" / "__init__.py").is_file():
                    raise archive.BadArchive("it holds no sglang/__init__.py, so it is no SGLang wheel")
                _check_record(tmp, digests)
        except OSError as exc:
            raise _disk_error(dest, exc) from None


def _disk_error(dest: Path, exc: OSError) -> Sm120kitError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return IOFailure(
            f"Cannot unpack the release into {dest}: {exc.strerror}. The partly unpacked copy was removed.",
            hint=cache_error(dest, exc).hint,
        )
    return cache_error(dest, exc)


def _check_record(folder: Path, digests: dict[str, str]) -> None:
    """Each unpacked member against the ``sha256=`` its ``*.dist-info/RECORD`` lists (PEP 376/427)."""
    records = sorted(folder.glob("sglang-*.dist-info/RECORD"))
    if not records:
        return
    try:
        text = regularfile.read_text(records[0], errors="replace")
    except OSError:
        return
    listed: dict[str, str] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[1].startswith("sha256="):
            listed[row[0]] = row[1][len("sha256=") :]
    for name, digest in digests.items():
        want = listed.get(name)
        if want is None:
            continue
        got = base64.urlsafe_b64encode(bytes.fromhex(digest)).rstrip(b"=").decode()
        if got != want:
            raise archive.BadArchive(f"{name} does not match the SHA-256 the wheel's RECORD lists for it")


def check_range(text: str) -> tuple[str, str] | None:
    """``"LOW..HIGH"`` -> (LOW, HIGH) as release names; ``None`` for a list. :class:`UsageError` naming the
    whole text when a side is missing or not a version (``../../x`` is no range)."""
    if ".." not in text:
        return None
    low, _, high = text.partition("..")
    try:
        if not low.strip() or not high.strip():
            raise UsageError("")
        return check_version(low.strip()), check_version(high.strip())
    except UsageError:
        raise UsageError(
            f"'{text}' is not a release range: expected LOW..HIGH with two versions, like "
            "0.5.2..0.5.23 (or a comma-separated list, like 0.5.2,0.5.23)."
        ) from None


def parse_release_range(text: str, available: list[str]) -> list[str]:
    """``"0.5.2..0.5.23"`` -> every version in ``available`` between the two, inclusive, sorted."""
    bounds = check_range(text)
    if bounds is None:
        return [check_version(v.strip()) for v in text.split(",") if v.strip()]
    lo, hi = Version(bounds[0]), Version(bounds[1])
    return sorted((v for v in available if lo <= Version(v) <= hi), key=Version)


def available_releases() -> list[str]:
    """Versions of sglang on PyPI (``pip index versions``), newest last."""
    result = runner.run(
        runner.python_argv("-m", "pip", "index", "versions", "sglang"), what="pip index versions sglang", timeout=120
    )
    for line in result.stdout.splitlines():
        if line.strip().startswith("Available versions:"):
            versions = [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
            return sorted(versions, key=Version)
    raise DownloadError("pip index versions sglang printed no version list.")
