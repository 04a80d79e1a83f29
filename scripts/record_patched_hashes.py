#!/usr/bin/env python3
"""Record what the series writes into every final SGLang release, for the byte-identity test.

For each final release from 0.5.2 on (PyPI; downloaded into the sm120kit cache), the series is applied to a
fresh copy of the unpacked release, and every file that differs from the release afterwards (created or
changed; the ``.sm120kit`` state folder aside) is stored with its SHA-256, mode and action, beside the
status of each patch, in ``tests/data/patched-hashes.json``. Run it when a change is meant to alter what
lands in SGLang, and say so in the commit:

    python scripts/record_patched_hashes.py            # all final releases >= 0.5.2
    python scripts/record_patched_hashes.py 0.5.23     # just these (merged into the file)
    python scripts/record_patched_hashes.py --patch ID # only patch ID (a patch new to the series), merged

``--patch`` is for a patch added to the series after the record: record it from the commit that adds it,
before its layout changes, and the test holds its files as well.

``tests/series/test_patched_identity.py`` applies the series again and compares.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from packaging.version import Version

from sm120kit.patching.engine import apply_series
from sm120kit.patching.series import load_series
from sm120kit.patching.treepath import STATE_DIR
from sm120kit.sglang import releases
from sm120kit.sglang.target import find_target

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "patched-hashes.json"


def final_releases() -> list[str]:
    found = [v for v in releases.available_releases() if not Version(v).is_prerelease]
    return sorted((v for v in found if Version(v) >= Version("0.5.2")), key=Version)


def tree_files(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root`` (the folder holding ``sglang/``) but sm120kit's state folder: path ->
    (SHA-256, permission bits)."""
    out: dict[str, tuple[str, int]] = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != STATE_DIR]
        for name in names:
            path = Path(folder) / name
            out[path.relative_to(root).as_posix()] = (
                hashlib.sha256(path.read_bytes()).hexdigest(),
                path.lstat().st_mode & 0o7777,
            )
    return out


def record(version: str, patch_id: str | None = None) -> dict:
    """``{"patches": {id: status}, "files": {path: {"sha256", "mode", "action"}}}`` for one release: what
    applying the series to a fresh copy of it changes (only ``patch_id``'s status and files if given)."""
    with tempfile.TemporaryDirectory(prefix="sm120kit-record-") as tmp:
        site = Path(tmp) / "site-packages"
        shutil.copytree(releases.fetch_release(version), site, symlinks=True)
        pristine = tree_files(site)
        result = apply_series(find_target(site / "sglang"), load_series())
        if result.exit_code != 0:
            sys.exit(f"{version}: apply exited {result.exit_code}: {result.message}")
        patched = tree_files(site)
    owners = {c.path: c.patches for c in result.plan.changes}
    files = {}
    for path in sorted(set(pristine) | set(patched)):
        if pristine.get(path) == patched.get(path):
            continue
        if patch_id is not None and patch_id not in owners.get(path, ()):
            continue
        digest, mode = patched.get(path, (None, None))
        action = "create" if path not in pristine else "delete" if path not in patched else "modify"
        files[path] = {"sha256": digest, "mode": mode, "action": action}
    statuses = {p.patch_id: str(p.status) for p in result.plan.patches if patch_id in (None, p.patch_id)}
    return {"patches": statuses, "files": files}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="*", help="releases to record (default: every final release >= 0.5.2)")
    ap.add_argument(
        "--patch",
        metavar="ID",
        help="record only this patch's status and files, merged into the record of each release",
    )
    args = ap.parse_args(argv)
    merge = bool(args.versions or args.patch)
    data = json.loads(DATA.read_text(encoding="utf-8")) if DATA.is_file() and merge else {}
    for version in args.versions or final_releases():
        new = record(version, args.patch)
        if args.patch:
            entry = data.setdefault(version, {"patches": {}, "files": {}})
            entry["patches"].update(new["patches"])
            entry["files"] = dict(sorted({**entry["files"], **new["files"]}.items()))
        else:
            data[version] = new
        print(f"{version}: {len(new['files'])} files")
    data = dict(sorted(data.items(), key=lambda kv: Version(kv[0])))
    DATA.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
