"""The pure parts of scripts/bench_decode.py, on CPU: its case list, the split caps it compares (the
patch's own code and a real release's), the roofline arithmetic, and the page-only fp8 conversion, which
must give bit-for-bit what converting the whole pool gives on every slot a kernel reads."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from conftest import REPO_ROOT

from sm120kit.sglang import releases

_spec = importlib.util.spec_from_file_location("bench_decode", REPO_ROOT / "scripts" / "bench_decode.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _sglang_modules() -> list[str]:
    return [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]


@pytest.fixture
def on_path(monkeypatch):
    """``put(version)``: that release's SGLang importable for the test; afterwards no module it imported
    stays in sys.modules (later tests check that SGLang is not importable in this environment)."""
    before = set(_sglang_modules())

    def put(version: str):
        monkeypatch.syspath_prepend(str(releases.fetch_release(version)))
        for name in _sglang_modules():
            monkeypatch.delitem(sys.modules, name)

    yield put
    for name in _sglang_modules():
        if name not in before:
            del sys.modules[name]


def test_case_list():
    all_cases = bench.cases("all")
    assert len(all_cases) == 3 * 4 * 3 and len(set(all_cases)) == len(all_cases)
    assert {c for _, c, _ in all_cases} == {8192, 32768, 131072, 185000}
    assert {b for _, _, b in all_cases} == {1, 4, 32}
    assert bench.cases("quick") == [(s, 131072, 1) for s in bench.SHAPES]
    assert bench.SHAPES["mla-16"] == (16, 1, 576, 512)
    assert bench.POOLS == (10**5, 10**6, 4 * 10**6)


def test_split_caps_on_0_5_23(on_path):
    on_path("0.5.23")
    release_mla = bench.release_mla_cap_function()
    assert release_mla is not None  # sglang #20479 is in 0.5.23
    patched = bench.patched_cap_function()
    caps = {s: bench.split_caps(s, 188, patched_cap=patched, release_mla_cap=release_mla) for s in bench.SHAPES}
    assert caps == {"mla-16": (256, 128), "gqa-64/8": (8, 94), "gqa-32/4": (8, 188)}
    # the H200 the benchmark runs on: 132 SMs
    caps = {s: bench.split_caps(s, 132, patched_cap=patched, release_mla_cap=release_mla) for s in bench.SHAPES}
    assert caps == {"mla-16": (256, 128), "gqa-64/8": (8, 66), "gqa-32/4": (8, 132)}


def test_release_without_the_mla_cap_and_old_scheduler(on_path):
    on_path("0.5.2")
    assert bench.release_mla_cap_function() is None
    assert bench.split_caps("mla-16", 188, release_mla_cap=None) == (8, 128)
    scheduler = bench.sglang_split_scheduler()  # defined in triton_backend.py before 0.5.16
    assert type(scheduler).__name__ == "JITFunction"


def test_bytes_and_roofline():
    assert bench.kv_read_bytes("mla-16", 1000, 2) == 2 * 1000 * 576 * 2
    assert bench.kv_read_bytes("gqa-64/8", 1000, 1) == 1000 * 8 * 256 * 2
    assert bench.roofline_share(4 * 10**9, 1.0, 4000.0) == pytest.approx(100.0)


@pytest.mark.parametrize("page_size", [1, 16])
def test_page_only_conversion_is_bit_identical(page_size):
    g = torch.Generator().manual_seed(page_size)
    tokens, lk, lv, heads = 4096, 576, 512, 16
    pool = (torch.randn(tokens, 1, lk, generator=g) * 3).to(torch.float8_e4m3fn)
    pages = torch.randperm(tokens // page_size, generator=g)[:40]
    read = (pages[:, None] * page_size + torch.arange(page_size)[None, :]).flatten()
    read = torch.cat([read, read[:5]])  # a slot read twice (two requests sharing a prefix)
    out = torch.full((tokens, 1, lk), float("nan"), dtype=torch.bfloat16)
    bench.convert_pages(pool, read, out)
    full = pool.to(torch.bfloat16)
    assert torch.equal(out[read].view(torch.int16), full[read].view(torch.int16))
    untouched = torch.ones(tokens, dtype=torch.bool)
    untouched[read] = False
    assert torch.isnan(out[untouched].float()).all()  # nothing outside the pages was written
    # MLA decode over the pages, from either buffer: the same bits
    q = torch.randn(2, heads, lk, generator=g).to(torch.bfloat16)
    indptr = [0, 100, read.numel()]

    def decode(buf):
        outs = []
        for b in range(2):
            kv = buf[read[indptr[b] : indptr[b + 1]], 0].float()
            p = torch.softmax(q[b].float() @ kv.T / lk**0.5, dim=-1)
            outs.append(p @ kv[:, :lv])
        return torch.stack(outs)

    assert torch.equal(decode(out), decode(full))
