"""Upgrade checks of the real SM120 series against real SGLang releases from PyPI.

What each patch does on a release is read from the series' own metadata (the variant its range selects)
and from facts about the releases (the extend-attention fix ships from 0.5.9, the capability helpers from
0.5.20, the PCIe-IPC all-reduce from 0.5.21, the double-sparsity kernel is gone from 0.5.11); a moved file and a real merge conflict come from
copies of the series with their newer variants taken out, as the series looked before them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from apply_support import run_cli, run_json
from conftest import REPO_ROOT
from packaging.version import Version
from series_support import copy_series

from sm120kit.patching.series import load_series

REPO = REPO_ROOT
SERIES = REPO / "patches" / "sglang"
CHECKED = ("0.5.2", "0.5.17", "0.5.23")


def _expected(version: str) -> dict[str, str]:
    v = Version(version)
    out = {}
    for patch in load_series(SERIES).patches:
        if patch.id == "sm120-extend-attention" and v >= Version("0.5.9"):
            out[patch.id] = "present-upstream"
        elif patch.id == "sm120-capability" and v >= Version("0.5.20"):
            out[patch.id] = "present-upstream"
        elif patch.id == "sm120-pcie-allreduce" and v >= Version("0.5.21"):
            out[patch.id] = "present-upstream"
        elif patch.variant_for(version) is None:
            out[patch.id] = "not-applicable"
        else:
            out[patch.id] = "applies"
    return out


def _series_without(tmp_path: Path, patch_id: str, drop: str, open_variant: str) -> Path:
    """A copy of the real series where ``patch_id`` lacks variant ``drop`` and ``open_variant``'s range has
    no upper bound: the series as it was before ``drop`` was made."""
    dest = copy_series(tmp_path)
    folder = dest / patch_id
    (folder / drop).unlink()
    text = (folder / "patch.toml").read_text()
    block = re.search(r'\n\[\[variants\]\]\ndiff = "' + re.escape(drop) + r'"\n[^\[]*', text)
    assert block, f"no [[variants]] block for {drop}"
    text = text.replace(block.group(0), "\n")
    text = re.sub(r'(diff = "' + re.escape(open_variant) + r'"\nreleases = ")(>=[^,"]+),<[^"]+"', r'\1\2"', text)
    (folder / "patch.toml").write_text(text)
    assert drop not in {v.name for v in load_series(dest).get(patch_id).variants}
    return dest


@pytest.mark.slow
def test_series_on_three_releases(release_dir):
    for version in CHECKED:
        release_dir(version)
        code, data = run_json("check-upstream", "--release", version)
        assert code == 0, data
        assert data["target"] == {**data["target"], "kind": "release", "version": version, "exact_release": True}
        statuses = {p["id"]: p["status"] for p in data["patches"]}
        assert statuses == _expected(version), version
        series = load_series(SERIES)
        for patch in data["patches"]:
            if patch["status"] == "applies":
                assert patch["variant"] == series.get(patch["id"]).variant_for(version).name
            if patch["status"] == "present-upstream":
                assert patch["detail"].startswith("upstream marker found: sglang/")
        assert data["warnings"] == [] and data["exit_code"] == 0


@pytest.mark.slow
def test_matrix_table_json_and_markdown(release_dir):
    for version in CHECKED:
        release_dir(version)
    code, data = run_json("matrix", "--releases", ",".join(CHECKED))
    assert code == 0, data
    assert [r["target"]["label"] for r in data["rows"]] == list(CHECKED)
    for row in data["rows"]:
        assert row["statuses"] == _expected(row["target"]["label"])
        for pid, cell in row["cells"].items():
            if row["statuses"][pid] == "applies":
                assert cell.rstrip("+") == row["variants"][pid].removesuffix(".diff")
    assert data["rows"][-1]["cells"]["sm120-capability"] == "upstream"
    assert data["columns"][0] == "capability"

    proc = run_cli("matrix", "--releases", ",".join(CHECKED))
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("SGLang "))
    columns = [p.id.removeprefix("sm120-") for p in load_series(SERIES).patches]
    assert columns[:9] == [
        "capability",
        "extend-attention",
        "prefill-attention",
        "moe-configs",
        "backend-gating",
        "double-sparsity-attention",
        "inkling-moe-stages",
        "mla-attention",
        "decode-kv-splits",
    ]
    assert header.split() == ["SGLang", *columns]
    row = next(line for line in lines if line.startswith("0.5.23 "))
    cells = dict(zip(columns, row.split()[1:]))
    assert [cells["capability"], cells["extend-attention"]] == ["upstream", "upstream"]
    # "+": the variant applies at an offset (0.5.23 moved lines of the Triton backend since 0.5.18).
    assert cells["inkling-moe-stages"] == "0.5.18" and cells["mla-attention"].rstrip("+") == "0.5.18"
    # "+" on 0.5.2 too: sm120-mla-attention's hook, applied first, moves the constructor's lines.
    assert cells["decode-kv-splits"].rstrip("+") == "0.5.15"
    assert cells["flashinfer-mla-fp8-pages"].rstrip("+") == "0.5.15"

    proc = run_cli("matrix", "--releases", ",".join(CHECKED), "--format", "markdown")
    assert proc.returncode == 0
    assert "| SGLang | capability | extend-attention |" in proc.stdout
    assert "| 0.5.2 | 0.5.2 | 0.5.2 | 0.5.2 | 0.5.2 | 0.5.2 | 0.5.2 | - | 0.5.2 | 0.5.2+ | - | 0.5.2 |" in proc.stdout


@pytest.mark.slow
def test_moved_file_found_on_a_release_and_refreshed(tmp_path, release_dir, installed_tree):
    release_dir("0.5.17")
    series = _series_without(tmp_path, "sm120-prefill-attention", "0.5.16.diff", "0.5.2.diff")
    code, data = run_json("check-upstream", "--release", "0.5.17", "--series", str(series))
    assert code == 0, data
    prefill = next(p for p in data["patches"] if p["id"] == "sm120-prefill-attention")
    assert prefill["status"] == "not-applicable"
    [moved] = prefill["moved"]
    assert moved["old"] == "sglang/srt/layers/attention/triton_ops/prefill_attention.py"
    assert moved["new"] == "sglang/kernels/ops/attention/prefill_attention.py"
    assert moved["similarity"] > 0.95 and moved["compared"] == "file"
    assert run_json("check-upstream", "--release", "0.5.17", "--series", str(series), "--error-on-warn")[0] == 14

    code, data = run_json("refresh", "sm120-prefill-attention", "--release", "0.5.17", "--series", str(series))
    assert code == 0 and data["outcome"] == "written", data
    assert data["old_variant_releases"] == {"before": ">=0.5.2", "after": ">=0.5.2,<0.5.17"}
    new_diff = series / "sm120-prefill-attention" / "0.5.17.diff"
    # The merge reproduces, byte for byte, the variant that was made by hand for the moved file.
    assert new_diff.read_text() == (SERIES / "sm120-prefill-attention" / "0.5.16.diff").read_text()

    package = installed_tree("0.5.17")
    code, data = run_json("apply", str(package), "--series", str(series))
    assert code == 0, data
    prefill = next(p for p in data["patches"] if p["id"] == "sm120-prefill-attention")
    assert (prefill["status"], prefill["variant"]) == ("applied", "0.5.17.diff")
    text = (package / "kernels/ops/attention/prefill_attention.py").read_text()
    assert "BLOCK = 64 if row_bytes <= 512 else 32" in text


def test_real_merge_conflict_is_reported_not_written(tmp_path, release_dir):
    release_dir("0.5.23")
    series = _series_without(tmp_path, "sm120-inkling-moe-stages", "0.5.18.diff", "0.5.17.diff")
    meta_before = (series / "sm120-inkling-moe-stages" / "patch.toml").read_bytes()
    code, data = run_json("check-upstream", "--release", "0.5.23", "--series", str(series))
    assert code == 4
    inkling = next(p for p in data["patches"] if p["id"] == "sm120-inkling-moe-stages")
    assert inkling["status"] == "conflict" and inkling["variant"] == "0.5.17.diff"
    assert {h["file"] for h in inkling["hunks"]} == {"sglang/kernels/ops/moe/inkling_moe.py"}
    assert any('"num_stages": 3 if is_sm121() else 4,' in line for h in inkling["hunks"] for line in h["found"])
    assert inkling["hunks"][0]["commits"] == [] and inkling["hunks"][0]["history"] == ""

    code, data = run_json("refresh", "sm120-inkling-moe-stages", "--release", "0.5.23", "--series", str(series))
    assert code == 4 and data["outcome"] == "conflict", data
    conflicts = data["files"][0]["conflicts"]
    assert any(
        "is_sm121()" in " ".join(c["upstream"]) and "is_sm120_supported()" in " ".join(c["patch"]) for c in conflicts
    )
    assert data["base_source"] == "SGLang 0.5.17 from PyPI"
    assert (series / "sm120-inkling-moe-stages" / "patch.toml").read_bytes() == meta_before
    assert not (series / "sm120-inkling-moe-stages" / "0.5.23.diff").exists()
