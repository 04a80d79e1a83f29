#!/usr/bin/env python3
"""Record what the series writes into every final SGLang release, for the byte-identity test.

For each final release from 0.5.2 on (PyPI; downloaded into the sm120kit cache), the series is planned on
the unpacked release (nothing is written) and the SHA-256 and mode of every file it creates or changes is
stored, with the status of each patch, in ``tests/data/patched-hashes.json``. Run it when a change is meant
to alter what lands in SGLang, and say so in the commit:

    python scripts/record_patched_hashes.py            # all final releases >= 0.5.2
    python scripts/record_patched_hashes.py 0.5.23     # just these (merged into the file)

``tests/test_patched_identity.py`` plans the series again and compares.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from packaging.version import Version

from sm120kit.patching.plan import plan_series
from sm120kit.patching.series import load_series
from sm120kit.sglang import releases

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "patched-hashes.json"


def final_releases() -> list[str]:
    found = [v for v in releases.available_releases() if not Version(v).is_prerelease]
    return sorted((v for v in found if Version(v) >= Version("0.5.2")), key=Version)


def record(version: str) -> dict:
    """``{"patches": {id: status}, "files": {path: {"sha256", "mode", "action"}}}`` for one release."""
    root = releases.fetch_release(version)
    plan = plan_series(root, load_series(), version=version, recorded=())
    files = {}
    for change in plan.changes:
        files[change.path] = {"sha256": hashlib.sha256(change.after).hexdigest() if change.after is not None
                              else None, "mode": change.mode, "action": change.action}
    return {"patches": {p.patch_id: str(p.status) for p in plan.patches}, "files": dict(sorted(files.items()))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="*", help="releases to record (default: every final release >= 0.5.2)")
    args = ap.parse_args(argv)
    data = json.loads(DATA.read_text(encoding="utf-8")) if DATA.is_file() and args.versions else {}
    for version in args.versions or final_releases():
        data[version] = record(version)
        print(f"{version}: {len(data[version]['files'])} files")
    data = dict(sorted(data.items(), key=lambda kv: Version(kv[0])))
    DATA.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
