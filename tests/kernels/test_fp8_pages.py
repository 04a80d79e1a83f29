"""Patch sm120-flashinfer-mla-fp8-pages on real SGLang releases from PyPI.

The whole bundled series is applied to a copy of each release of the series matrix; the conversion
code is taken from the patched ``flashinfer_mla_backend.py`` and run on CPU: the torch reference and the
Triton kernel (under Triton's interpreter) write, on every row the decode reads, exactly the bits the
whole-pool conversion gives, and an MLA decode over either buffer gives the same output bits. The gate
is checked under faked 12.0/12.1 (on) and 9.0/10.0/8.9/HIP (off) devices. No GPU is used.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import gen_fp8_pages_patch as gen  # scripts/ (pytest's pythonpath)
import pytest
import torch
from conftest import SCRIPTS_DIR, SERIES_RELEASES, SUPPORT_DIR, TESTS_DIR
from series_support import patched_file_reader

from sm120kit.hardware.fake_device import PRESETS, faked_cuda

PATCH_ID = "sm120-flashinfer-mla-fp8-pages"
BACKEND = "sglang/srt/layers/attention/flashinfer_mla_backend.py"


def test_diffs_are_the_generator_output():
    assert gen.main(["--check"]) == 0


@pytest.fixture(scope="module")
def patched_backends(tmp_path_factory):
    """``patched_backends(version)`` -> the text of the patched backend file after the whole series."""
    return patched_file_reader(tmp_path_factory, "fp8-pages", PATCH_ID, BACKEND)


def _helpers(text: str) -> dict:
    """The patch's names, executed from the patched file's own source (no SGLang import)."""
    tree = ast.parse(text)
    keep = [
        n
        for n in tree.body
        if (isinstance(n, ast.FunctionDef) and n.name.startswith("_sm120_"))
        or (
            isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id.startswith("_SM120_FP8") for t in n.targets)
        )
    ]
    source = (
        "from __future__ import annotations\nimport torch\nimport triton as _sm120_triton\n"
        "import triton.language as tl\n\n" + ast.unparse(ast.Module(body=keep, type_ignores=[])) + "\n"
    )
    # Triton reads a kernel's source from its file when the module defines it; the folder goes once it is loaded
    with tempfile.TemporaryDirectory(prefix="fp8-pages-") as folder:
        path = Path(folder) / "fp8_pages_under_test.py"
        path.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(f"fp8_pages_under_test_{abs(hash(text))}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return vars(module)


def _case(seed: int, page_size: int = 1):
    g = torch.Generator().manual_seed(seed)
    tokens = 4096
    pool = (torch.randn(tokens, 1, 576, generator=g) * 3).to(torch.float8_e4m3fn)
    pages = torch.randperm(tokens // page_size, generator=g)[:48]
    read = (pages[:, None] * page_size + torch.arange(page_size)[None, :]).flatten()
    read = torch.cat([read, read[:5]]).to(torch.int32)  # a shared prefix: slots read twice
    lens = torch.tensor([100, read.numel() - 100 - 7, 7], dtype=torch.int32)
    # a CUDA-graph-sized indices buffer: a stale tail after the batch's entries
    indices = torch.cat([read, torch.randint(0, tokens, (300,), generator=g, dtype=torch.int32)])
    return pool, read, lens, indices


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_reference_conversion_is_bit_identical(patched_backends, version):
    text = patched_backends(version)
    assert "k_buffer = _sm120_fp8_pages(" in text and "decode_wrapper,\n" in text
    ns = _helpers(text)
    for page_size in (1, 16):
        pool, read, lens, indices = _case(page_size, page_size)
        out = torch.full(pool.shape, float("nan"), dtype=torch.bfloat16)
        ns["_sm120_convert_pages"](pool, indices, lens, 3, out)
        full = pool.to(torch.bfloat16)
        rows = read.long()
        assert torch.equal(out[rows].view(torch.int16), full[rows].view(torch.int16))
        untouched = torch.ones(pool.shape[0], dtype=torch.bool)
        untouched[rows] = False
        assert torch.isnan(out[untouched].float()).all()  # the stale tail and other rows: not written
        # MLA decode from either buffer: the same bits
        q = torch.randn(3, 16, 576, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        bounds = [0, *torch.cumsum(lens, 0).tolist()]

        def decode(buf):
            outs = []
            for b in range(3):
                kv = buf[rows[bounds[b] : bounds[b + 1]], 0].float()
                p = torch.softmax(q[b].float() @ kv.T / 576**0.5, dim=-1)
                outs.append(p @ kv[:, :512])
            return torch.stack(outs)

        assert torch.equal(decode(out), decode(full))
    # not on a CUDA 12.x device: the whole pool, as the release did
    pool, _, lens, indices = _case(3)
    batch = SimpleNamespace(
        spec_info=None, forward_mode=SimpleNamespace(is_decode=lambda: True), seq_lens=lens, batch_size=3
    )
    got = ns["_sm120_fp8_pages"](pool, SimpleNamespace(_kv_indices_buf=indices), torch.bfloat16, batch)
    assert torch.equal(got.view(torch.int16), pool.to(torch.bfloat16).view(torch.int16))


@pytest.mark.parametrize("version", SERIES_RELEASES)
def test_gate_is_12x_only(patched_backends, version):
    ns = _helpers(patched_backends(version))
    cuda_tensor = SimpleNamespace(device=torch.device("cuda", 0))
    for key, want in (
        ("12.0", True),
        ("12.1", True),
        ("9.0", False),
        ("10.0", False),
        ("8.9", False),
        ("hip-12", False),
    ):
        ns["_SM120_FP8_PAGES_CAPABILITY"].clear()
        with faked_cuda(PRESETS[key]):
            assert ns["_sm120_fp8_pages_enabled"](cuda_tensor) is want, key


KERNEL_CHECK = r"""
import ast, sys, torch
from test_fp8_pages import _helpers, _case
ns = _helpers(open(sys.argv[1]).read())
pool, read, lens, indices = _case(7)
out = torch.zeros(pool.shape, dtype=torch.bfloat16)
ns["_sm120_convert_rows"][(5,)](pool, out, indices, lens, 3, indices.numel(), pool.shape[0], 576,
                                BLOCK_I=16, BLOCK_D=256, BLOCK_R=256)
ref = torch.zeros(pool.shape, dtype=torch.bfloat16)
ns["_sm120_convert_pages"](pool, indices, lens, 3, ref)
assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
written = int((out.float().abs().sum((1, 2)) > 0).sum())
assert written == int(torch.unique(read).numel()), written
print("ok")
"""


@pytest.mark.slow
def test_kernel_matches_the_reference_in_the_interpreter(patched_backends, tmp_path):
    path = tmp_path / "backend.py"
    path.write_text(patched_backends("0.5.23"))
    # this file's folder, then the folders of pytest's pythonpath (this file imports conftest and scripts/)
    here = Path(__file__).resolve().parent
    paths = [str(here), str(TESTS_DIR), str(SUPPORT_DIR), str(SCRIPTS_DIR), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    proc = subprocess.run(
        [sys.executable, "-c", KERNEL_CHECK, str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=here,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
