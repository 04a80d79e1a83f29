"""Docker build arguments that record what an image carries: this sm120kit and its patch set."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sm120kit.serve.recipe import read_toml
from sm120kit.util.resources import patches_dir


def patch_set(series_dir: Path | None = None) -> list[dict[str, str]]:
    """Each patch of the series in order, with a SHA-256 over its folder's files (metadata and diffs)."""
    series_dir = series_dir or patches_dir() / "sglang"
    series_file = series_dir / "series.toml"
    if not series_file.is_file():
        return []
    doc = read_toml(series_file)
    patches = doc.data.get("patches", [])
    if not isinstance(patches, list) or not all(isinstance(p, str) for p in patches):
        raise doc.fail(("patches",), "'patches' must be an array of patch ids.")
    out = []
    for patch_id in patches:
        folder = series_dir / patch_id
        digest = hashlib.sha256()
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(file.relative_to(folder).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
        out.append({"id": patch_id, "sha256": digest.hexdigest()})
    return out


def docker_build_args(series_dir: Path | None = None) -> dict[str, str]:
    """Build arguments for ``recipes/docker/Dockerfile`` that label the image with this checkout's series."""
    from sm120kit import __version__

    patches = patch_set(series_dir)
    whole = hashlib.sha256("".join(f"{p['id']}:{p['sha256']}\n" for p in patches).encode()).hexdigest()
    return {
        "SM120KIT_VERSION": __version__,
        "SM120KIT_PATCHSET": ",".join(f"{p['id']}@{p['sha256'][:12]}" for p in patches) or "none",
        "SM120KIT_PATCHSET_SHA256": whole,
    }
