"""Multi-GPU 12.x all-reduce: the topology reader, ``verify``'s findings, ``explain``'s rules, the recipes.

No GPU is here, so topologies are nvidia-smi's output, written in the format it prints (tab-separated
matrices, an underlined header; the 2x RTX 5090 peer matrix with GNS is what such boxes report, e.g.
https://github.com/noonghunna/club-3090/issues/1229), fed to the reader directly or through a stand-in
``nvidia-smi`` on PATH so the probe runs through the runner for real. SGLang trees are the real releases
from PyPI; FlashInfer is a folder with the files the check reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATA_DIR

from sm120kit.audit import slow_settings
from sm120kit.errors import RecipeError
from sm120kit.hardware import arch
from sm120kit.hardware.topology import parse_link_matrix, parse_peer_matrix, probe_topology, topology_from_text
from sm120kit.patching.engine import apply_series
from sm120kit.patching.series import load_series
from sm120kit.serve.recipe import find_recipe, load_recipe
from sm120kit.sglang import pcie_allreduce
from sm120kit.sglang.target import find_target
from sm120kit.verify import topology as multi_gpu
from sm120kit.verify.report import INFO, WARNING

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""
PEER_LEGEND = """
Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  DR   = Disabled by regkey
  U    = Unknown
"""


def link_matrix(labels: list[list[str]], numa: list[int], nics: int = 0) -> str:
    n = len(labels)
    head = (
        "\t\x1b[4m"
        + "\t".join([f"GPU{i}" for i in range(n)] + [f"NIC{i}" for i in range(nics)])
        + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    )
    rows = ""
    for i, row in enumerate(labels):
        cpus = "0-47,96-143" if numa[i] == 0 else "48-95,144-191"
        rows += (
            f"GPU{i}\t"
            + "\t".join(f" {c} " if c == "X" else c for c in row + ["NODE"] * nics)
            + f"\t{cpus}\t{numa[i]}\t\tN/A\n"
        )
    for k in range(nics):
        rows += f"NIC{k}\t" + "\t".join(["NODE"] * n + ["X" if j == k else "PIX" for j in range(nics)]) + "\n"
    return head + rows + LEGEND


def peer_matrix(status: list[list[str]]) -> str:
    n = len(status)
    return (
        " \t"
        + "\t".join(f"GPU{i}" for i in range(n))
        + "\t\n"
        + "".join(f" GPU{i}\t" + "\t".join(row) + "\t\n" for i, row in enumerate(status))
        + PEER_LEGEND
    )


def square(n: int, same: str, other: str | None = None, split: int | None = None) -> list[list[str]]:
    """n x n labels: X on the diagonal, ``same`` within a half, ``other`` across halves (at ``split``)."""
    rows = []
    for i in range(n):
        row = []
        for j in range(n):
            if i == j:
                row.append("X")
            elif split is not None and (i < split) != (j < split):
                row.append(other)
            else:
                row.append(same)
        rows.append(row)
    return rows


EIGHT_PCIE = topology_from_text(
    link_matrix(square(8, "NODE", "SYS", 4), [0] * 4 + [1] * 4, nics=2), peer_matrix(square(8, "OK"))
)
TWO_5090 = topology_from_text(link_matrix(square(2, "PHB"), [0, 0]), peer_matrix(square(2, "GNS")))
TWO_H200 = topology_from_text(link_matrix(square(2, "NV18"), [0, 0]), peer_matrix(square(2, "OK")))


# -- nvidia-smi's matrices ------------------------------------------------------------------------------------


def test_the_link_and_peer_matrices_are_read_nics_and_escapes_left_out():
    names, links, affinity, numa = parse_link_matrix(link_matrix(square(8, "NODE", "SYS", 4), [0] * 4 + [1] * 4, 2))
    assert names == tuple(f"GPU{i}" for i in range(8)) and numa == (0,) * 4 + (1,) * 4
    assert links[0][1] == "NODE" and links[0][4] == "SYS" and links[5][5] == "X" and len(links[0]) == 8
    assert affinity[0] == "0-47,96-143" and affinity[7] == "48-95,144-191"
    assert EIGHT_PCIE.cross_numa_pairs() == [(i, j) for i in range(4) for j in range(4, 8)]
    assert not EIGHT_PCIE.any_nvlink and EIGHT_PCIE.pairs_without_peer_access() == []
    assert EIGHT_PCIE.describe() == (
        "8 GPU(s); links NODE, SYS (PCIe only); peer access between every pair; NUMA node(s) 0, 1"
    )
    assert TWO_5090.pairs_without_peer_access() == [(0, 1)] and TWO_5090.peer_status(0, 1) == "GNS"
    assert "no peer access for 1 of 1 pair(s) (GNS)" in TWO_5090.describe()
    assert TWO_H200.all_nvlink and "(NVLink)" in TWO_H200.describe()
    assert TWO_H200.to_json()["links"] == [["X", "NV18"], ["NV18", "X"]]
    assert parse_peer_matrix(peer_matrix(square(2, "GNS")))[1] == (("X", "GNS"), ("GNS", "X"))


def test_real_output_of_one_h200():
    """What nvidia-smi printed on a one-GPU H200 machine (tests/data/nvidia-smi/: escape codes, tabs, the
    empty column before GPU NUMA ID, as printed)."""
    data = DATA_DIR / "nvidia-smi"
    found = topology_from_text(
        (data / "h200-1gpu-topo-m.txt").read_text(), (data / "h200-1gpu-topo-p2p-r.txt").read_text()
    )
    assert found.gpus == ("GPU0",) and found.links == (("X",),) and found.peer == (("X",),)
    assert found.cpu_affinity == ("0-15",) and found.numa == (0,) and found.pairs == []
    assert not found.all_nvlink and found.describe() == "1 GPU(s); NUMA node(s) 0"


def test_text_that_is_no_matrix_is_refused():
    with pytest.raises(ValueError, match="no matrix header"):
        parse_link_matrix("No devices were found\n")
    with pytest.raises(ValueError, match="peer matrix lists"):
        topology_from_text(link_matrix(square(2, "PHB"), [0, 0]), peer_matrix(square(3, "OK")))


def test_the_probe_runs_nvidia_smi_through_the_runner(tmp_path, monkeypatch):
    """A stand-in nvidia-smi (no NVIDIA driver here) prints the two matrices for the two queries."""
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert probe_topology() == (None, "nvidia-smi is not on PATH (no NVIDIA driver here)")
    (tmp_path / "m.txt").write_text(link_matrix(square(2, "PHB"), [0, 0]))
    (tmp_path / "p.txt").write_text(peer_matrix(square(2, "GNS")))
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        f'#!/bin/sh\ncase "$2" in -m) cat {tmp_path}/m.txt;; -p2p) cat {tmp_path}/p.txt;; *) exit 2;; esac\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{path}")
    found, note = probe_topology()
    assert note == "" and found == TWO_5090
    fake.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch' >&2; exit 9\n")
    assert probe_topology() == (
        None,
        "nvidia-smi topo -m failed (exit 9: Failed to initialize NVML: Driver/library version mismatch)",
    )


def test_no_12x_card_has_nvlink():
    assert arch.has_nvlink((12, 0)) is False and arch.has_nvlink((12, 1)) is False
    assert arch.has_nvlink((9, 0)) is None


# -- FlashInfer and SGLang ------------------------------------------------------------------------------------


def flashinfer_dir(tmp_path: Path, with_pcie_ipc: bool) -> Path:
    """A flashinfer/ folder with the files the check reads (flashinfer 0.7.x layout, or 0.6.18's)."""
    folder = tmp_path / ("fi-new" if with_pcie_ipc else "fi-old") / "flashinfer"
    (folder / "comm").mkdir(parents=True, exist_ok=True)
    if with_pcie_ipc:
        (folder / "comm" / "pcie_ipc_ar.py").write_text("class PcieIpcAllReduceWorkspace:\n    pass\n")
        (folder / "comm" / "__init__.py").write_text(
            "from .pcie_ipc_ar import (\n    PcieIpcAllReduceWorkspace as PcieIpcAllReduceWorkspace,\n)\n"
        )
    else:
        (folder / "comm" / "__init__.py").write_text("from .trtllm_ar import trtllm_allreduce_fusion\n")
    return folder


def test_flashinfer_and_sglang_are_read_from_their_files(tmp_path, release_dir):
    assert pcie_allreduce.flashinfer_has(flashinfer_dir(tmp_path, True), "0.7.2")[0] is True
    has, why = pcie_allreduce.flashinfer_has(flashinfer_dir(tmp_path, False), "0.6.18")
    assert has is False and "flashinfer 0.6.18 has no flashinfer.comm.PcieIpcAllReduceWorkspace" in why
    assert "it arrived in FlashInfer 0.7.0" in why
    assert pcie_allreduce.flashinfer_has(None, None) == (None, "FlashInfer is not installed")
    assert pcie_allreduce.tree_has(release_dir("0.5.23") / "sglang") == "upstream"
    assert pcie_allreduce.tree_has(release_dir("0.5.21") / "sglang") == "upstream"
    assert pcie_allreduce.tree_has(release_dir("0.5.20") / "sglang") is None
    assert pcie_allreduce.backport_covers("0.5.18") and not pcie_allreduce.backport_covers("0.5.15")
    assert pcie_allreduce.backport_covers("0.5.20") and not pcie_allreduce.backport_covers("0.5.21")
    # the range written here is the patch's own
    patch = load_series().get(pcie_allreduce.BACKPORT_PATCH)
    for version in ("0.5.15", "0.5.16", "0.5.18", "0.5.20", "0.5.21"):
        assert (patch.variant_for(version) is not None) == pcie_allreduce.backport_covers(version), version


def test_switch_values_are_read_as_sglang_reads_them():
    assert [pcie_allreduce.env_bool(v) for v in ("1", "true", "YES", "y", "0", "no", "", None, "on")] == [
        True,
        True,
        True,
        True,
        False,
        False,
        None,
        None,
        None,
    ]
    assert pcie_allreduce.deterministic({"SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "1"})
    assert not pcie_allreduce.deterministic(
        {"SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "1", "SGLANG_USE_1STAGE_ALLREDUCE": "0"}
    )
    assert pcie_allreduce.deterministic({}, {"enable_deterministic_inference": True})


# -- verify's findings under faked topologies -------------------------------------------------------------------


def info(
    tmp_path,
    release_dir,
    *,
    topology=EIGHT_PCIE,
    release="0.5.23",
    sglang_dir=None,
    fi=True,
    fi_version="0.7.2",
    env=None,
    count=None,
):
    return multi_gpu.from_facts(
        topology=topology,
        topology_note="",
        gpu_count=count,
        nccl="2.27.3",
        nccl_note="",
        nccl_package="nvidia-nccl-cu13 2.27.3",
        flashinfer_dir=flashinfer_dir(tmp_path, fi),
        flashinfer_version=fi_version,
        sglang_dir=sglang_dir or (release_dir(release) / "sglang" if release else None),
        sglang_version=release,
        env=env or {},
    )


def _warnings(flags):
    return [f.message for f in flags if f.severity == WARNING]


def test_an_8x_12x_box_without_the_switch_is_told_to_set_it(tmp_path, release_dir):
    flags = multi_gpu.assess(info(tmp_path, release_dir), (12, 0))
    (warning,) = [f for f in flags if f.severity == WARNING]
    assert warning.component == "all-reduce"
    assert "8 GPUs of compute capability 12.0, which have no NVLink" in warning.message
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is not set" in warning.message
    assert warning.fix.startswith("Set SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1")
    assert [f.severity for f in flags if "cross NUMA nodes" in f.message] == [INFO]
    on = multi_gpu.assess(info(tmp_path, release_dir, env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}), (12, 0))
    assert _warnings(on) == []
    rows = dict(info(tmp_path, release_dir, env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}).rows())
    assert rows["SGLang PCIe-IPC all-reduce"].startswith(
        "yes (SGLang's own, 0.5.21 on); SGLANG_ENABLE_PCIE_IPC_ALLREDUCE on"
    )
    assert rows["FlashInfer pcie_ipc_comm"].startswith("yes: flashinfer.comm.PcieIpcAllReduceWorkspace is there")
    assert rows["NCCL"] == "2.27.3 (torch), package nvidia-nccl-cu13 2.27.3"


def test_each_reason_to_fall_back_to_nccl_is_named(tmp_path, release_dir):
    env = {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    old_fi = _warnings(multi_gpu.assess(info(tmp_path, release_dir, fi=False, fi_version="0.6.18", env=env), (12, 0)))
    assert len(old_fi) == 1 and "flashinfer 0.6.18 has no flashinfer.comm.PcieIpcAllReduceWorkspace" in old_fi[0]
    det = multi_gpu.assess(
        info(tmp_path, release_dir, env={**env, "SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "1"}), (12, 0)
    )
    assert any("deterministic inference is on" in m for m in _warnings(det))
    (missing,) = [
        f
        for f in multi_gpu.assess(info(tmp_path, release_dir, release="0.5.18", env=env), (12, 0))
        if f.severity == WARNING
    ]
    assert "SGLang 0.5.18 has no PCIe-IPC all-reduce" in missing.message
    assert missing.fix.startswith("`sm120kit apply` adds it to this release (patch sm120-pcie-allreduce)")
    (old,) = _warnings(multi_gpu.assess(info(tmp_path, release_dir, release="0.5.10", env=env), (12, 0)))
    fix = [
        f.fix
        for f in multi_gpu.assess(info(tmp_path, release_dir, release="0.5.10", env=env), (12, 0))
        if f.message == old
    ][0]
    assert fix.startswith("SGLang 0.5.21 or newer has it")
    peerless = multi_gpu.assess(info(tmp_path, release_dir, topology=TWO_5090, env=env), (12, 0))
    (warning,) = _warnings(peerless)
    assert "GPU pairs without peer access (GPU0-GPU1 (GNS)" in warning
    six = multi_gpu.assess(info(tmp_path, release_dir, env=env, count=6), (12, 0))
    assert any(f.severity == INFO and "2, 4 or 8 ranks" in f.message for f in six)


@pytest.fixture(scope="module")
def patched_0518(tmp_path_factory, release_dir) -> Path:
    """0.5.18 with the whole series applied (the PCIe all-reduce backport among it), made once for the tests of
    this file, which only read it: the folder holding ``sglang/``."""
    site = tmp_path_factory.mktemp("patched-0518") / "site"
    try:  # the patch manager replaces files (temporary file + rename), so hard links are safe
        shutil.copytree(release_dir("0.5.18"), site, copy_function=os.link)
    except OSError:
        shutil.rmtree(site, ignore_errors=True)
        shutil.copytree(release_dir("0.5.18"), site)
    assert apply_series(find_target(site / "sglang"), load_series()).exit_code == 0
    return site


def test_a_patched_0518_tree_counts_as_having_it(tmp_path, release_dir, patched_0518):
    site = patched_0518
    assert pcie_allreduce.tree_has(site / "sglang") == "backport"
    got = info(
        tmp_path,
        release_dir,
        release="0.5.18",
        sglang_dir=site / "sglang",
        env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"},
    )
    assert got.sglang_pcie_ipc == "backport" and _warnings(multi_gpu.assess(got, (12, 0))) == []
    assert dict(got.rows())["SGLang PCIe-IPC all-reduce"].startswith("yes (sm120kit's sm120-pcie-allreduce)")


def test_no_findings_off_12x_or_with_one_gpu(tmp_path, release_dir):
    assert multi_gpu.assess(info(tmp_path, release_dir, topology=TWO_H200), (9, 0)) == []
    one = topology_from_text(link_matrix([["X"]], [0]))
    assert multi_gpu.assess(info(tmp_path, release_dir, topology=one), (12, 0)) == []
    assert multi_gpu.assess(None, (12, 0)) == []


# -- explain's rules on real releases ---------------------------------------------------------------------------


def _ctx(package_dir, **kw):
    base = dict(
        release=None,
        capability="12.0",
        package_dir=package_dir,
        given={},
        values={},
        env={},
        attention="mla",
        sm_count=188,
    )
    base.update(kw)
    return slow_settings.Context(**base)


def _found(ctx) -> dict:
    return {f.rule: f for f in slow_settings.find(ctx)}


def test_rules_name_every_multi_gpu_12x_case_with_its_fix(release_dir, patched_0518):
    on = {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    tree = release_dir("0.5.23") / "sglang"
    off = _found(_ctx(tree, release="0.5.23", given={"tp_size": 8}))
    assert list(off) == ["pcie-allreduce-off"]
    finding = off["pcie-allreduce-off"]
    assert finding.setting == "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" and finding.severity == slow_settings.SLOW
    assert finding.fix.startswith("Set SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1") and "5.3 us" in finding.source
    assert "sglang/srt/distributed/device_communicators/pcie_ipc_ar.py:" in finding.source
    assert not _found(_ctx(tree, release="0.5.23", given={"tp_size": 8}, env=on))
    for det in (
        {"given": {"tp_size": 4, "enable_deterministic_inference": True}, "env": on},
        {"given": {"tp_size": 4}, "env": {**on, "SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "true"}},
    ):
        assert list(_found(_ctx(tree, release="0.5.23", **det))) == ["pcie-allreduce-deterministic"]
    missing = _found(_ctx(release_dir("0.5.18") / "sglang", release="0.5.18", given={"tp_size": 2}))
    assert (
        list(missing) == ["pcie-allreduce-missing"] and "sm120-pcie-allreduce" in missing["pcie-allreduce-missing"].fix
    )
    assert list(_found(_ctx(tree, release="0.5.23", given={"tp_size": 6}, env=on))) == ["pcie-allreduce-tp-size"]
    # a single GPU, another GPU family, or no readable tree: nothing
    assert not _found(_ctx(tree, release="0.5.23", given={"tp_size": 1}))
    assert not _found(_ctx(tree, release="0.5.23", given={"tp_size": 8}, capability="9.0"))
    assert not _found(_ctx(None, release="0.5.23", given={"tp_size": 8}))
    # with the backport applied (patched_0518: the whole series applies, exit code 0), 0.5.18 behaves as 0.5.23
    site = patched_0518
    patched = _found(_ctx(site / "sglang", release="0.5.18", given={"tp_size": 8}))
    assert list(patched) == ["pcie-allreduce-off"]
    assert "sm120_pcie_ipc_ar.py" in patched["pcie-allreduce-off"].source
    assert not _found(_ctx(site / "sglang", release="0.5.18", given={"tp_size": 8}, env=on))


@pytest.mark.slow
def test_explain_reports_a_tp8_resolution_without_the_switch():
    base = [
        sys.executable,
        "-m",
        "sm120kit",
        "explain",
        "--release",
        "0.5.23",
        "--model",
        "deepseek-v3-mla",
        "--arch",
        "12.0",
        "--flashinfer",
        "yes",
        "--json",
    ]
    proc = subprocess.run(base + ["--", "--tp-size", "8"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (res,) = json.loads(proc.stdout)["resolutions"]
    assert [f["rule"] for f in res["slow"]] == ["pcie-allreduce-off"]
    assert res["slow"][0]["fix"].startswith("Set SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1")
    fixed = subprocess.run(
        base[:-1] + ["--env", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1", "--json", "--", "--tp-size", "8"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert fixed.returncode == 0 and json.loads(fixed.stdout)["resolutions"][0]["slow"] == []


# -- the recipes ---------------------------------------------------------------------------------------------------


def test_multi_gpu_recipes_switch_it_on_and_say_whether_nccl_was_measured():
    for name, hidden, layers in (
        ("kimi-k2-thinking-8x-rtx-pro-6000", 7168, 61),
        ("qwen3-30b-a3b-2x-rtx-pro-6000", 2048, 48),
    ):
        recipe = find_recipe(name)
        env = {s.name: s.value for s in recipe.env}
        assert env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
        assert (recipe.hidden_size, recipe.layers) == (hidden, layers)
        assert "decode" in recipe.notes["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"].why
        for key, value in env.items():
            if key.startswith("NCCL_"):
                assert recipe.notes[key].measured.startswith("not measured"), key
    kimi = find_recipe("kimi-k2-thinking-8x-rtx-pro-6000").to_json()
    assert kimi["model"]["hidden_size"] == 7168 and kimi["notes"]["NCCL_PROTO"]["measured"]


def test_an_nccl_setting_without_a_measured_note_is_refused(tmp_path):
    text = find_recipe("kimi-k2-thinking-8x-rtx-pro-6000").path.read_text()
    path = tmp_path / "kimi-k2-thinking-8x-rtx-pro-6000.toml"
    path.write_text(text.replace('measured = "not measured', 'xmeasured = "', 1).replace("\nxmeasured = ", "\n#", 1))
    with pytest.raises(RecipeError, match=r"the note of NCCL_P2P_LEVEL does not say whether its value was measured"):
        load_recipe(path)
    path.write_text(text.replace("hidden_size = 7168", "hidden_size = 0"))
    with pytest.raises(RecipeError, match=r"model.hidden_size must be a positive integer"):
        load_recipe(path)


@pytest.mark.slow
def test_recipes_check_fails_on_a_multi_gpu_recipe_without_the_switch(tmp_path):
    folder = tmp_path / "serve"
    folder.mkdir()
    text = find_recipe("qwen3-30b-a3b-2x-rtx-pro-6000").path.read_text()
    text = text.replace('SGLANG_ENABLE_PCIE_IPC_ALLREDUCE = "1"\n', "")
    text = text[: text.index("[notes.SGLANG_ENABLE_PCIE_IPC_ALLREDUCE]")]
    (folder / "qwen3-30b-a3b-2x-rtx-pro-6000.toml").write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "sm120kit", "recipes", "--check", "--dir", str(folder), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, NO_COLOR="1"),
    )
    assert proc.returncode == 13, proc.stderr[-2000:]
    results = json.loads(proc.stdout)["checked"]
    assert results and all(not r["ok"] for r in results)
    assert all("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE runs on 12.x but slowly" in r["error"] for r in results)
