"""``sm120kit verify``: a skipped check names its real cause, and a run that verified nothing is not a pass.

The case behind it: on an H200 with the patched 0.5.23 importable but SGLang's import dependency
``starlette`` missing, every check was skipped and the result read "OK: 0 ok, 0 failed, 6 skipped", exit 0;
the two MLA checks said "this SGLang has no sm120_mla module" although the module was there.

The trees are real SGLang releases from PyPI, patched with the real series where the MLA module is needed; the
missing dependency is a real import failure (an import finder refuses ``starlette`` as Python does for a
package that is not installed; tests/support/verify_hidden_dependency.py). This machine has no GPU: where a check must
get past "no GPU" to its imports, that script stands a CPU device labelled 12.0 in for the GPU (it says so);
the "no GPU" run below uses no stand-in at all.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SUPPORT_DIR

from sm120kit.patching.engine import apply_series
from sm120kit.patching.series import load_series
from sm120kit.sglang import releases
from sm120kit.sglang.target import find_target
from sm120kit.verify import verifier
from sm120kit.verify.check import ABSENT, MISSING_PACKAGE, NO_GPU

DRIVER = SUPPORT_DIR / "verify_hidden_dependency.py"
SGLANG_CHECKS = (
    "triton-extend",
    "triton-decode",
    "triton-prefill",
    "triton-fused-moe",
    "triton-tree-verify",
    "triton-mla-decode",
    "torch-native",
)
MLA_CHECKS = ("triton-tree-verify", "triton-mla-decode")


@pytest.fixture(scope="module")
def patched_0523(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("verify-skips") / "0.5.23"
    shutil.copytree(releases.fetch_release("0.5.23"), root)
    apply_series(find_target(root / "sglang"), load_series(REPO_ROOT / "patches" / "sglang"))
    assert (root / "sglang" / "kernels" / "ops" / "attention" / "sm120_mla.py").is_file()
    return root


def _driver(root: Path, hidden: str, mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(root), hidden, mode], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


# -- the verdict: nothing ran is not a pass (no stand-in: this machine really has no GPU) ---------------------------


def test_a_run_in_which_no_check_ran_is_not_a_pass():
    result = verifier.run_verify(verifier.VerifyPlan(backends=("triton",), audits=False))
    if result.kernels_ran:  # pragma: no cover - a machine with a GPU
        pytest.skip("this machine has a GPU")
    assert not result.verified and not result.ok and verifier.exit_code(result) == 13
    assert result.skip_causes() == {NO_GPU: len(result.checks)}
    reason = result.nothing_verified_reason()
    assert reason.startswith("Nothing was verified: every one of the") and "no kernel can run here" in reason
    assert "the static audits were not run" in reason
    # The same run with an environment report that finds nothing wrong: still not a pass, and the verdict says
    # why (this machine's CPU-only torch is an error finding of its own, so the report is emptied here).
    clean = dataclasses.replace(result, report=dataclasses.replace(result.report, flags=()))
    assert (clean.ok, clean.verdict, verifier.exit_code(clean)) == (False, "nothing-verified", 13)
    doc = clean.to_json()
    assert doc["verdict"] == "nothing-verified" and doc["verified"] is False and doc["ok"] is False
    assert doc["summary"]["skip_causes"] == {NO_GPU: len(result.checks)} and doc["summary"]["audits_ran"] == 0
    assert all(c["skip_cause"] == NO_GPU for c in doc["checks"])


# -- the causes: a missing import dependency is not a missing module -------------------------------------------------


@pytest.mark.slow
def test_a_hidden_dependency_is_named_and_the_present_module_is_not_called_absent(patched_0523):
    """Patched 0.5.23 (sm120_mla.py present) with starlette not importable: every SGLang check is skipped for
    the missing package, the MLA checks included; the unpatched release says its MLA module is absent."""
    patched = _driver(patched_0523, "starlette", "checks")
    assert set(patched) == set(SGLANG_CHECKS)
    for name, result in patched.items():
        assert (result["status"], result["skip_cause"], result["packages"]) == (
            "skipped",
            MISSING_PACKAGE,
            ["starlette"],
        ), (name, result)
        assert "'starlette', which is not installed" in result["detail"] and "is in this SGLang" in result["detail"]
        assert "no sm120_mla module" not in result["detail"]
    for name in MLA_CHECKS:
        assert "sm120_mla.py" in patched[name]["detail"]

    unpatched = _driver(releases.fetch_release("0.5.23"), "starlette", "checks")
    for name in MLA_CHECKS:  # truly absent there, whatever else is missing
        assert unpatched[name]["skip_cause"] == ABSENT, unpatched[name]
        assert unpatched[name]["detail"].startswith("this SGLang has no sm120_mla module")
    assert unpatched["triton-extend"]["skip_cause"] == MISSING_PACKAGE


@pytest.mark.slow
def test_cli_with_every_check_skipped_for_a_missing_package_exits_13(patched_0523):
    """The real command line (report included) on the patched tree with starlette hidden and a stand-in GPU:
    exit 13, "verified": false, and the reason names starlette. Without the report's own findings (this
    machine's CPU-only torch), the verdict is "nothing-verified", still exit 13."""
    out = _driver(patched_0523, "starlette", "cli")
    doc = out["document"]
    assert out["exit_code"] == 13 == doc["exit_code"] and doc["ok"] is False and doc["verified"] is False
    assert doc["summary"]["ok"] == doc["summary"]["fail"] == 0 and doc["summary"]["skipped"] == len(SGLANG_CHECKS)
    assert doc["summary"]["skip_causes"] == {MISSING_PACKAGE: len(SGLANG_CHECKS)}
    assert doc["summary"]["missing_packages"] == ["starlette"]
    assert "starlette" in doc["nothing_verified_reason"]
    assert {c["name"]: c["missing_packages"] for c in doc["checks"]} == {n: ["starlette"] for n in SGLANG_CHECKS}
    clean = out["without_report_findings"]
    assert (clean["ok"], clean["verdict"], clean["exit_code"]) == (False, "nothing-verified", 13)
    assert "starlette" in clean["reason"]
