"""sm120-moe-configs fits the down-projection config read from a ``*_down.json`` file too (0.5.4.post2 on).

A config file pair is planted for a small MoE under the faked RTX PRO 6000's device name: an up config
that fits and a down config whose tiles need 245760 B in bf16. The shared-memory audit runs SGLang's own
config choice and kernel launcher for both projections (device faked, no GPU here; each kernel a real
Triton compile for sm_120): the release as published launches the down kernel as read, over the limit,
and with the series applied it fits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from sm120kit.audit import shapes  # noqa: E402
from sm120kit.audit import smem as smem_audit  # noqa: E402
from sm120kit.cli import main as cli_main  # noqa: E402
from sm120kit.hardware.fake_device import PRESETS  # noqa: E402
from sm120kit.sglang.launchers import resolve  # noqa: E402

pytestmark = pytest.mark.slow

LIMIT = 101376
MATRIX = """
[[moe]]
name = "planted"
num_experts = 8
top_k = 2
hidden_size = 1024
intermediate_size = 512
quantizations = ["bf16"]
tokens = [256]
"""
UP = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
DOWN = {
    "BLOCK_SIZE_M": 64,
    "BLOCK_SIZE_N": 256,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 8,
    "num_stages": 4,
}  # 3 copies x 128 x (64 + 256) x 2 B = 245760 B


def _plant(root: Path) -> None:
    config_module = resolve(root, "moe").files[1]
    folder = config_module.parent / "configs" / "triton_3_3_1"
    stem = f"E=8,N=512,device_name={PRESETS['12.0'].name.replace(' ', '_')}"
    (folder / f"{stem}.json").write_text(json.dumps({"256": UP}))
    (folder / f"{stem}_down.json").write_text(json.dumps({"256": DOWN}))


@pytest.mark.parametrize("version", ["0.5.4.post2", "0.5.10", "0.5.23"])
def test_oversized_down_config_is_fitted(installed_tree, tmp_path, capsys, version, audit_cache):
    pristine, patched = installed_tree(version), None
    patched_site = tmp_path / "patched"
    import shutil

    shutil.copytree(pristine.parent, patched_site)
    patched = patched_site / "sglang"
    with pytest.raises(SystemExit) as exc:
        cli_main(["apply", str(patched)])
    assert exc.value.code == 0, capsys.readouterr().err
    for tree in (pristine, patched):
        _plant(tree.parent)
    (tmp_path / "m.toml").write_text(MATRIX)
    matrix = shapes.load_matrix([tmp_path / "m.toml"], include_default=False)
    cache = audit_cache(tmp_path / "cache")
    results = {
        label: smem_audit.audit_tree(tree.parent, archs=("12.0",), matrix=matrix, cache=cache, jobs=1)
        for label, tree in (("published", pristine), ("patched", patched))
    }
    for result in results.values():
        assert not result.errors, [c.error for c in result.cases]
        (case,) = result.cases
        assert len(case.kernels) == 2  # up, then down
    up, down = results["published"].cases[0].kernels
    assert up.shared <= LIMIT and down.shared == 245760
    assert (down.block["BLOCK_SIZE_N"], down.block["BLOCK_SIZE_K"], down.num_stages) == (256, 128, 4)
    up, down = results["patched"].cases[0].kernels
    assert up.shared <= LIMIT and 0 < down.shared <= LIMIT
    assert down.block["BLOCK_SIZE_M"] == 64 and down.num_stages < 4
