"""The patch manager's commands through ``python -m sm120kit``: exit codes per error class, ``--json``
output that parses, ``--dry-run`` that changes nothing, and ``apply --release`` on a cached release."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from apply_support import DEMO_EXPECTED, DEMO_SERIES, REPO_ROOT, run_cli, run_json, tree_hashes

from sm120kit.sglang import releases

S = ("--series", str(DEMO_SERIES))


def test_json_for_every_command_and_dry_run_changes_nothing(installed_tree):
    package = installed_tree("0.5.6", link=True)  # only the patch manager writes to it
    before = tree_hashes(package.parent)

    code, data = run_json("patches", *S, "--release", "0.5.6")
    assert code == 0 and [p["id"] for p in data["patches"]] == list(DEMO_EXPECTED["0.5.6"])
    assert data["patches"][1]["variant_for_release"] == "0.5.6.diff"
    assert data["patches"][0]["upstream"]["reference"].startswith("https://")

    code, data = run_json("apply", str(package), *S, "--dry-run")
    assert code == 0 and data["dry_run"] is True and data["written"] == []
    assert {p["id"]: p["status"] for p in data["patches"]} == DEMO_EXPECTED["0.5.6"]
    assert tree_hashes(package.parent) == before

    code, data = run_json("apply", str(package), *S)
    assert code == 0 and data["exit_code"] == 0 and len(data["written"]) == 2
    assert data["release"] == "0.5.6" and data["target"]["kind"] == "installed"
    note = next(p for p in data["patches"] if p["id"] == "demo-extend-attention-note")
    assert note["status"] == "applied" and note["hunks"][0]["offset"] == 0

    code, data = run_json("status", str(package), *S)
    assert code == 0 and data["problems"] == []
    assert {p["id"]: p["status"] for p in data["patches"]}["demo-new-module"] == "applied"

    code, data = run_json("revert", str(package), "--dry-run")
    assert code == 0 and {f["action"] for f in data["files"]} == {"restored", "removed"}
    code, data = run_json("revert", str(package))
    assert code == 0 and data["kept_copies"] == []
    assert tree_hashes(package.parent) == before


def test_human_output_has_table_summary_and_conflict_detail(installed_tree):
    package = installed_tree("0.5.2")
    rel = package / "srt/layers/attention/triton_ops/extend_attention.py"
    rel.write_text(rel.read_text().replace("\n_is_hip = is_hip()\n", "\n_is_hip = is_hip()  # local\n"))
    proc = run_cli("apply", str(package), *S)
    assert proc.returncode == 4
    out = proc.stdout
    assert "demo-extend-attention-note  conflict" in out
    assert "sglang/srt/layers/attention/triton_ops/extend_attention.py hunk 1: expected at line 28" in out
    assert "    ! | _is_hip = is_hip()  # local" in out and "      | if _is_cuda:" in out
    assert "nothing changed." in out
    assert "error: 1 patch(es) do not apply: demo-extend-attention-note. Nothing was written." in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("case", ["usage", "not-sglang", "series", "strict", "dirty", "state"])
def test_exit_code_per_error_class(case, tmp_path, installed_tree, git_clone_tree):
    if case == "usage":
        proc = run_cli("apply", str(tmp_path), "--release", "0.5.2", *S)
        assert proc.returncode == 2 and "not both" in proc.stderr
    elif case == "not-sglang":
        proc = run_cli("apply", str(tmp_path), *S)
        assert proc.returncode == 3 and "python/sglang" in proc.stderr
    elif case == "series":
        proc = run_cli("patches", "--series", str(tmp_path))
        assert proc.returncode == 8 and "has no series.toml yet" in proc.stderr
    elif case == "strict":
        # On 0.5.23 the capability patch is present upstream; a series that only knows 0.5.2 is
        # not-applicable there, which --strict turns into a failure.
        series = tmp_path / "series"
        (series / "only-old").mkdir(parents=True)
        (series / "series.toml").write_text('patches = ["only-old"]\n')
        src = DEMO_SERIES / "demo-capability-helper"
        (series / "only-old" / "0.5.2.diff").write_text((src / "0.5.2.diff").read_text())
        (series / "only-old" / "patch.toml").write_text(
            (src / "patch.toml")
            .read_text()
            .replace('"demo-capability-helper"', '"only-old"')
            .replace("is_sm120_supported\\b", "never_present_anywhere")
        )
        package = installed_tree("0.5.23", link=True)  # only the patch manager writes to it
        assert run_cli("apply", str(package), "--series", str(series)).returncode == 0
        proc = run_cli("apply", str(package), "--series", str(series), "--strict")
        assert proc.returncode == 14 and "not applicable" in proc.stderr
    elif case == "dirty":
        clone = git_clone_tree("0.5.2")
        utils = clone / "python/sglang/srt/utils.py"
        utils.write_text(utils.read_text() + "# local\n")
        code, data = run_json("apply", str(clone), *S)
        assert code == 5 and data["error"] == "dirty-tree" and "python/sglang/srt/utils.py" in data["message"]
    elif case == "state":
        package = installed_tree("0.5.2", link=True)  # the test edits only the state record apply creates
        assert run_cli("apply", str(package), *S).returncode == 0
        (package / ".sm120kit" / "state.json").write_text("{not json")
        proc = run_cli("revert", str(package))
        assert proc.returncode == 6 and "state.json" in proc.stderr


def test_verbose_shows_traceback_only_with_v(tmp_path):
    quiet = run_cli("apply", str(tmp_path), *S)
    loud = run_cli("-v", "apply", str(tmp_path), *S)
    assert quiet.returncode == loud.returncode == 3
    assert "Traceback" not in quiet.stderr and "Traceback" in loud.stderr


def test_apply_release_uses_a_working_copy_in_the_cache(tmp_path, release_dir):
    """``apply --release X`` patches ``<cache>/work/X`` made from the cached release, never the release."""
    cache = tmp_path / "cache"
    (cache / "releases").mkdir(parents=True)
    pristine = release_dir("0.5.10")
    os.symlink(pristine, cache / "releases" / "0.5.10")  # the download cache, shared read-only
    before = tree_hashes(pristine)
    env = {"SM120KIT_CACHE_DIR": str(cache)}
    code, data = run_json("apply", "--release", "0.5.10", *S, env=env)
    assert code == 0, data
    work = cache / "work" / "0.5.10"
    assert data["target"]["package_dir"] == str(work / "sglang")
    assert (work / "sglang/srt/sm120kit_demo.py").is_file()
    assert tree_hashes(pristine) == before
    code, data = run_json("status", "--release", "0.5.10", *S, env=env)
    assert code == 0 and {p["status"] for p in data["patches"]} == {"applied", "present-upstream"}
    proc = run_cli("apply", "--release", "0.5.10", *S, "--fresh", env=env)
    assert proc.returncode == 0 and "2 applied" in proc.stdout
    code, data = run_json("revert", "--release", "0.5.10", env=env)
    assert code == 0
    assert tree_hashes(work) == before


def test_bundled_series_default_and_missing_working_copy(tmp_path):
    env = {"SM120KIT_CACHE_DIR": str(tmp_path)}
    # The bundled series is well-formed (8 would mean it is not), so status on a release with no working
    # copy says that, with code 3.
    proc = run_cli("status", "--release", "0.5.2", env=env)
    assert proc.returncode == 3, proc.stderr
    assert "no working copy" in proc.stderr and "sm120kit apply --release 0.5.2" in proc.stderr
    proc = run_cli("patches", "--json")
    assert proc.returncode == 0, proc.stderr
    bundled = json.loads(proc.stdout)
    assert bundled["patches"] and Path(bundled["path"]) == REPO_ROOT / "patches" / "sglang"
    assert releases.DEFAULT_RELEASE in run_cli("apply", "--help").stdout
    assert Path(json.loads(run_cli("patches", "--series", str(DEMO_SERIES), "--json").stdout)["path"]) == DEMO_SERIES


def test_no_path_means_the_importable_sglang(installed_tree):
    """With no PATH the target is the sglang this interpreter would import (found, never imported)."""
    package = installed_tree("0.5.17", link=True)  # a dry run: nothing writes to it
    env = {"PYTHONPATH": str(package.parent)}
    code, data = run_json("apply", *S, "--dry-run", env=env)
    assert code == 0, data
    assert data["target"]["kind"] == "importable" and data["target"]["package_dir"] == str(package)
    assert {p["id"]: p["status"] for p in data["patches"]} == DEMO_EXPECTED["0.5.17"]
