"""``sm120kit audit`` on the patched tree of every release of the audit matrix exits 0.

Each release comes from PyPI, is patched with the real series by ``sm120kit apply`` and audited by the real
command line with its defaults (12.0 and 12.1, the packaged shape matrix, every fused-MoE config file the tree
ships for a 12.x GPU name). The SM120 device is faked (no GPU here); every kernel is a real Triton compile for
sm_120 / sm_121. A case SGLang's own weight loader refuses (an FP8 block-quantized MoE shape whose intermediate
size is not a multiple of the weight block) is ``not-applicable`` and does not fail the audit; every other case
compiles and fits.

Cost: the audit keeps its results and Triton's compiled kernels in ``$SM120KIT_CACHE_DIR/triton-audit``. An
unchanged patched tree is answered from the cache without starting an interpreter (seconds), and releases of
one pytest run share Triton's kernel cache, so a release after the first compiles only the kernels its sources
change. With an empty cache the first release compiles everything (docs/audit.md, "Patched releases pass").

The set CI runs holds the newest release of the matrix in each MoE config era: each variant range of the
series' ``sm120-moe-configs`` patch (the config-selection code differs between them: no ``_down`` files
before 0.5.4.post2, the configs folder moved with the runner in 0.5.11), the newest release included. All
of them are marked slow (minutes each with an empty cache); the other releases run with
SM120KIT_AUDIT_EVERY_RELEASE=1. The newest release is audited as a user runs it, for 12.0 and 12.1; the other
era releases for 12.0 only (``--arch 12.0``), what their era is in the set for. 12.1 is a different input, not
a repeat: its 48 SMs give other KV split counts, and its name (NVIDIA GB10) matches no tuned MoE file, so
SGLang's default configs run; SM120KIT_AUDIT_EVERY_RELEASE=1 audits every release for both.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import REPO_ROOT, SERIES_RELEASES
from packaging.version import Version

from sm120kit.patching.series import load_series

pytest.importorskip("torch")
pytest.importorskip("triton")

from sm120kit.cli import main as cli_main  # noqa: E402

AUDIT_RELEASES = SERIES_RELEASES  # the releases the series and its audit are tested on
SERIES = load_series(REPO_ROOT / "patches" / "sglang")


def moe_config_eras() -> dict[str, str]:
    """Variant base of sm120-moe-configs -> the newest release of the audit matrix in that variant's range."""
    patch = SERIES.get("sm120-moe-configs")
    newest: dict[str, str] = {}
    for version in sorted(AUDIT_RELEASES, key=Version):
        variant = patch.variant_for(version)
        if variant is not None:
            newest[variant.base] = version
    return newest


NEWEST = max(AUDIT_RELEASES, key=Version)
QUICK = set(moe_config_eras().values()) | {NEWEST}


def test_the_quick_set_covers_every_moe_config_era():
    eras = moe_config_eras()
    assert len(eras) == len(SERIES.get("sm120-moe-configs").variants) >= 3, eras
    assert NEWEST in QUICK and len(QUICK) == len(eras)


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory, release_dir):
    def make(version: str):
        site = tmp_path_factory.mktemp(f"audit-{version}") / "site-packages"
        shutil.copytree(release_dir(version), site)
        with pytest.raises(SystemExit) as applied:
            cli_main(["apply", str(site / "sglang"), "--json"])
        assert applied.value.code == 0
        return site / "sglang"

    return make


# Every release of the matrix when SM120KIT_AUDIT_EVERY_RELEASE=1; by default (CI) the era releases only: with
# an empty cache each audit compiles for several minutes on a 2-core machine.
EVERY_RELEASE = os.environ.get("SM120KIT_AUDIT_EVERY_RELEASE") == "1"


@pytest.mark.parametrize(
    "version",
    [
        pytest.param(v, marks=pytest.mark.slow)
        if v in QUICK
        else pytest.param(
            v,
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(not EVERY_RELEASE, reason="set SM120KIT_AUDIT_EVERY_RELEASE=1 for every release"),
            ],
        )
        for v in sorted(AUDIT_RELEASES, key=Version, reverse=True)
    ],
)
def test_audit_of_the_patched_release_exits_0(patched_tree, capsys, version):
    tree = patched_tree(version)
    capsys.readouterr()
    both = EVERY_RELEASE or version == NEWEST
    with pytest.raises(SystemExit) as audited:
        cli_main(["audit", str(tree), "--json"] + ([] if both else ["--arch", "12.0"]))
    out, err = capsys.readouterr()
    doc = json.loads(out)
    failed = [
        (c["arch"], c["id"], c["status"], c["error"])
        for c in doc["cases"]
        if c["status"] in ("compile-error", "import-error", "over-limit")
    ]
    assert audited.value.code == 0 and doc["ok"] is True, (failed[:10], err[-2000:])
    summary = doc["summary"]
    assert summary["over_limit"] == 0 and summary["errors"] == 0
    assert doc["archs"] == (["12.0", "12.1"] if both else ["12.0"])
    assert {c["launcher"] for c in doc["cases"]} >= {"extend", "decode", "prefill", "moe"}
    # The series' own config files are loaded under the device names they are named for.
    tuned = {c["params"].get("device_name") for c in doc["cases"] if c["model"].startswith("tuned-")}
    assert {"NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA GeForce RTX 5090"} <= tuned
    for case in doc["cases"]:
        if case["status"] == "not-applicable":  # only what SGLang's loader refuses, with its reason
            assert case["params"]["quantization"] == "fp8_block" and "fp8.py:" in case["note"], case
