"""Release ranges at a variant boundary: pre-releases, holes between ranges, and refresh for a pre-release.

PEP 440 keeps 0.5.10rc0 out of both ``<0.5.10`` and ``>=0.5.10``. The series reads a pre-release (or dev
release) of F as belonging to the range that starts at F unless a range names it explicitly
(sm120kit/patching/ranges.py); a release that still falls between two ranges is a warning. The slow tests run
on the real pre-release wheels from PyPI (0.5.2rc0-rc2, 0.5.3rc0, 0.5.3rc2, 0.5.10rc0: every pre-release PyPI
lists between 0.5.2 and 0.5.23) and on the real series.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from apply_support import run_cli, run_json
from conftest import REPO_ROOT
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from series_support import copy_series

from sm120kit.patching import ranges
from sm120kit.patching.plan import plan_series
from sm120kit.patching.series import load_series
from sm120kit.upstream.refresh import new_ranges

REPO = REPO_ROOT
SERIES = REPO / "patches" / "sglang"
GATING = "sm120-backend-gating"
# Every pre-release of the range the series covers that PyPI lists (pip index versions sglang --pre).
PRERELEASES = ("0.5.2rc0", "0.5.2rc1", "0.5.2rc2", "0.5.3rc0", "0.5.3rc2", "0.5.10rc0")


def _one_patch_series(tmp_path: Path, patch_id: str, edit: tuple[str, str] | None = None) -> Path:
    """A copy of one patch of the real series as a series of its own; ``edit`` replaces one text of its
    patch.toml."""
    dest = tmp_path / "patches" / "sglang"  # the repository's layout: [[files]] sources under tmp_path/kernels
    shutil.copytree(SERIES / patch_id, dest / patch_id)
    shutil.copytree(REPO / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "series.toml").write_text(f'patches = ["{patch_id}"]\n')
    if edit is not None:
        meta = dest / patch_id / "patch.toml"
        text = meta.read_text()
        old, new = edit
        assert text.count(old) == 1, old
        meta.write_text(text.replace(old, new))
    load_series(dest)
    return dest


# -- the reading of a range (quick: the real series' metadata, no release) ----------------------------------


def test_a_prerelease_takes_the_range_that_starts_at_its_release():
    series = load_series(SERIES)
    gating = series.get(GATING)
    assert gating.variant_for("0.5.10rc0").name == "0.5.10.diff"  # was None: in neither <0.5.10 nor >=0.5.10
    assert gating.variant_for("0.5.10.dev4").name == "0.5.10.diff"
    assert gating.variant_for("0.5.3rc2").name == "0.5.3.diff"
    assert gating.variant_for("0.5.4.post1.dev0").name == "0.5.4.post1.diff"
    assert gating.variant_for("0.5.2rc1").name == "0.5.2.diff"
    # 0.5.3rc0 is left out by name ('!=0.5.3rc0'): no variant, and no hole either.
    assert gating.variant_for("0.5.3rc0") is None and gating.gap_around("0.5.3rc0") is None
    # A range that names the pre-release as written wins over the default reading.
    assert series.get("sm120-capability").variant_for("0.5.3rc0").name == "0.5.2.diff"  # '<0.5.3rc1'
    assert series.get("sm120-capability").variant_for("0.5.3rc2").name == "0.5.3.diff"
    assert series.get("sm120-moe-configs").variant_for("0.5.2rc0") is None  # '>=0.5.2rc1'
    # Final releases are untouched.
    for version, name in (("0.5.9", "0.5.4.post1.diff"), ("0.5.10", "0.5.10.diff"), ("0.5.23", "0.5.21.diff")):
        assert gating.variant_for(version).name == name


def test_holes_and_retired_patches():
    specs = [SpecifierSet(">=0.5.2,<0.5.4"), SpecifierSet(">=0.5.6,<0.5.9"), SpecifierSet(">=0.5.10,<0.5.11")]
    assert ranges.hole(specs, "0.5.5") == (0, 1)
    assert ranges.hole(specs, "0.5.9.post1") == (1, 2)
    assert ranges.hole(specs, "0.5.6rc1") is None  # it belongs to '>=0.5.6'
    assert ranges.hole(specs, "0.5.1") is None and ranges.hole(specs, "0.5.11") is None  # outside, not between
    assert ranges.past_all(specs, "0.5.11") and ranges.past_all(specs, "0.5.11rc0")
    assert not ranges.past_all(specs, "0.5.10.post1") and not ranges.past_all(specs, "0.5.5")
    assert not ranges.past_all(specs + [SpecifierSet(">=0.5.20")], "0.5.30")


def test_refresh_ranges_for_a_prerelease_or_dev_release_hold_it():
    """refresh writes '>=X,<F' for a pre-release or dev release X of a release F that has a variant; read
    strictly that range is empty (it was written, then refused as holding nothing)."""
    gating = load_series(SERIES).get(GATING)
    for release, source, expected in (
        ("0.5.3rc1", "0.5.2.diff", ">=0.5.3rc1,<0.5.3"),
        ("0.5.4.post1.dev0", "0.5.4.diff", ">=0.5.4.post1.dev0,<0.5.4.post1"),
    ):
        variant = next(v for v in gating.variants if v.name == source)
        closed, new = new_ranges(gating, variant, release)
        assert closed is None and new == expected
        assert ranges.in_range(SpecifierSet(new), Version(release))
        assert not ranges.in_range(SpecifierSet(new), ranges.final_release(Version(release)))


# -- real pre-release wheels -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("version", PRERELEASES)
def test_every_prerelease_on_pypi_takes_the_series_or_is_left_out_by_name(version, release_dir):
    release_dir(version)
    code, data = run_json("check-upstream", "--release", version, "--error-on-warn")
    assert code == 0 and data["warnings"] == [], data
    series = load_series(SERIES)
    statuses = {p["id"]: (p["status"], p["variant"]) for p in data["patches"]}
    for patch in series.patches:
        status, variant = statuses[patch.id]
        chosen = patch.variant_for(version)
        if chosen is None:
            assert status in ("not-applicable", "present-upstream"), (patch.id, status)
        else:
            assert (status, variant) in (("applies", chosen.name), ("present-upstream", None)), patch.id
    if version == "0.5.10rc0":
        assert statuses[GATING] == ("applies", "0.5.10.diff")
    if version == "0.5.3rc2":
        for patch_id in ("sm120-capability", GATING, "sm120-decode-kv-splits"):
            assert statuses[patch_id] == ("applies", "0.5.3.diff")


@pytest.mark.slow
def test_apply_on_a_prerelease_patches_backend_gating(release_dir):
    root = release_dir("0.5.10rc0")
    code, data = run_json("apply", str(root / "sglang"), "--dry-run")
    assert code == 0 and data["release"] == "0.5.10rc0" and data["exact_release"], data
    gating = next(p for p in data["patches"] if p["id"] == GATING)
    assert (gating["status"], gating["variant"]) == ("applies", "0.5.10.diff")
    assert "sglang/srt/sm12x_backend_gate.py" in {c["path"] for c in data["changes"]}
    assert data["warnings"] == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("version", "edit"),
    [
        # A final release in a hole: 0.5.9 above '<0.5.9' and below '>=0.5.10'.
        ("0.5.9", ('releases = ">=0.5.4.post1,<0.5.10"', 'releases = ">=0.5.4.post1,<0.5.9"')),
        # A pre-release in a hole: 0.5.10rc0 is no pre-release of 0.5.10.post1, where the next range starts.
        (
            "0.5.10rc0",
            (
                'releases = ">=0.5.10,<0.5.12"\nbase = "0.5.10"',
                'releases = ">=0.5.10.post1,<0.5.12"\nbase = "0.5.10.post1"',
            ),
        ),
    ],
)
def test_a_release_in_a_hole_is_a_warning(version, edit, tmp_path, release_dir):
    root = release_dir(version)
    series = _one_patch_series(tmp_path, GATING, edit)
    code, data = run_json("apply", str(root / "sglang"), "--dry-run", "--series", str(series))
    assert code == 0, data
    [patch] = data["patches"]
    assert patch["status"] == "not-applicable" and "hole" in patch["reason"]
    assert len(data["warnings"]) == 1 and data["warnings"][0].startswith(
        f"{GATING}: release {version} falls in a hole of the series"
    )
    proc = run_cli("apply", str(root / "sglang"), "--dry-run", "--series", str(series))
    assert proc.returncode == 0 and "hole of the series" in proc.stdout + proc.stderr

    code, data = run_json("check-upstream", "--release", version, "--series", str(series))
    assert code == 0 and data["patches"][0]["status"] == "not-applicable", data
    warnings = data["warnings"]
    assert any("falls in a hole" in w for w in warnings)
    # Every variant is tried too, newest first: one of the two around the hole places, and is named.
    widen = [w for w in warnings if "widen its release range" in w]
    assert len(widen) == 1 and re.search(r"variant 0\.5\.(4\.post1|10)\.diff ", widen[0]), warnings
    assert data["patches"][0]["moved"] == []
    code, data = run_json("check-upstream", "--release", version, "--series", str(series), "--error-on-warn")
    assert code == 14 and data["exit_code"] == 14


@pytest.mark.slow
def test_refresh_for_a_prerelease_whose_release_has_a_variant(tmp_path, release_dir):
    """0.5.3rc2 (PyPI): sm120-decode-kv-splits' 0.5.3.diff places there only at an offset, so refresh
    rebuilds it. The new range must hold 0.5.3rc2 and stop before 0.5.3, which keeps its variant."""
    release_dir("0.5.3rc2")
    release_dir("0.5.2")
    patch_id = "sm120-decode-kv-splits"
    series = copy_series(tmp_path)
    args = ("refresh", patch_id, "--release", "0.5.3rc2", "--series", str(series))
    code, data = run_json(*args, "--dry-run")
    assert code == 0 and data["outcome"] == "dry-run", data
    assert data["new_variant"] == {"diff": "0.5.3rc2.diff", "releases": ">=0.5.3rc2,<0.5.3", "base": "0.5.3rc2"}
    code, data = run_json(*args)
    assert code == 0 and data["outcome"] == "written", data
    patch = load_series(series).get(patch_id)
    assert patch.variant_for("0.5.3rc2").name == "0.5.3rc2.diff"
    assert patch.variant_for("0.5.3").name == "0.5.3.diff" and patch.variant_for("0.5.2").name == "0.5.2.diff"
    text = (series / patch_id / "patch.toml").read_text()
    assert re.search(r'diff = "0\.5\.3rc2\.diff"\nreleases = ">=0\.5\.3rc2,<0\.5\.3"\nbase = "0\.5\.3rc2"', text)
    plan = plan_series(release_dir("0.5.3rc2"), load_series(series), version="0.5.3rc2")
    mine = next(p for p in plan.patches if p.patch_id == patch_id)
    assert (mine.status, mine.variant.name) == ("applies", "0.5.3rc2.diff")
    assert not any(h.offset for h in mine.hunks)
