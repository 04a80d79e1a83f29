"""The route of the ``sm120-mla-attention`` kernels (``sm120_mla_route``): which path runs an MLA call.

The route is a pure function of the call's shape, dtypes and SM count and of what the CUDA kernels offer, so
most of this needs no device: the choices on every case of scripts/bench_mla.py are pinned to what the launcher
chose before the choice became a function (its module constants at 23ca299: the same path, split count,
fewest tokens a split and tail placement). The launcher's side (what it hands the CUDA kernels for the route
it is given) runs with stand-ins for the CUDA kernels and the Triton prefix kernels, as this machine has no GPU.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
from conftest import REPO_ROOT

from sm120_attention import sm120_mla_route as routes

# What the launcher chose for each case of scripts/bench_mla.py before the route table (23ca299), by
# (kind, draft tokens, heads, KV dtype, batch): (path, splits, fewest tokens a split, where the draft tail goes)
# on 132 SMs (the H200 of the benchmarks) and 188 (RTX PRO 6000) with the CUDA kernels (one program an SM in
# a one launch), and on 132 SMs without them (no NVRTC: Triton only; "triton pair": _prefix_pair_kernel).
PINNED = {
    ("decode", 1, 16, "bf16", 1): (
        ("triton", 256, 64, "none"),
        ("triton", 256, 64, "none"),
        ("triton", 256, 64, "none"),
    ),
    ("decode", 1, 16, "bf16", 4): (
        ("cuda16 one launch", 33, 256, "none"),
        ("cuda16 one launch", 47, 256, "none"),
        ("triton", 256, 256, "none"),
    ),
    ("decode", 1, 16, "bf16", 32): (
        ("triton", 33, 256, "none"),
        ("triton", 47, 256, "none"),
        ("triton", 33, 256, "none"),
    ),
    ("decode", 1, 16, "fp8", 1): (
        ("cuda16 one launch", 132, 64, "none"),
        ("cuda16 one launch", 188, 64, "none"),
        ("triton", 256, 64, "none"),
    ),
    ("decode", 1, 128, "bf16", 1): (
        ("cuda64 one launch", 66, 256, "none"),
        ("cuda64 one launch", 94, 256, "none"),
        ("triton", 132, 256, "none"),
    ),
    ("verify", 1, 16, "bf16", 1): (
        ("cuda16 one launch", 131, 64, "one launch"),
        ("cuda16 one launch", 187, 64, "one launch"),
        ("triton", 256, 64, "merge"),
    ),
    ("verify", 1, 16, "fp8", 1): (
        ("cuda16 one launch", 131, 64, "one launch"),
        ("cuda16 one launch", 187, 64, "one launch"),
        ("triton", 256, 64, "merge"),
    ),
    ("verify", 2, 16, "bf16", 1): (
        ("cuda16 one launch", 65, 256, "one launch"),
        ("cuda16 one launch", 93, 256, "one launch"),
        ("triton pair", 256, 64, "merge"),
    ),
    ("verify", 8, 4, "bf16", 1): (
        ("cuda16 one launch", 65, 256, "one launch"),
        ("cuda16 one launch", 93, 256, "one launch"),
        ("triton pair", 256, 64, "merge"),
    ),
    ("verify", 8, 8, "bf16", 1): (
        ("cuda64 one launch", 131, 256, "one launch"),
        ("cuda64 one launch", 187, 256, "one launch"),
        ("triton pair", 132, 256, "merge"),
    ),
    ("verify", 8, 16, "bf16", 1): (
        ("cuda64 one launch", 65, 256, "one launch"),
        ("cuda64 one launch", 93, 256, "one launch"),
        ("triton pair", 66, 256, "merge"),
    ),
    ("verify", 8, 16, "fp8", 1): (
        ("cuda64 one launch", 65, 256, "one launch"),
        ("cuda64 one launch", 93, 256, "one launch"),
        ("triton pair", 66, 256, "merge"),
    ),
    ("verify", 8, 32, "bf16", 1): (
        ("cuda64 one launch", 32, 256, "one launch"),
        ("cuda64 one launch", 46, 256, "one launch"),
        ("triton pair", 33, 256, "own pass"),
    ),
    ("verify", 8, 128, "bf16", 1): (
        ("cuda64", 8, 256, "own pass"),
        ("cuda64", 11, 256, "own pass"),
        ("triton pair", 8, 256, "own pass"),
    ),
    ("verify", 16, 16, "bf16", 1): (
        ("cuda64 one launch", 32, 256, "one launch"),
        ("cuda64 one launch", 46, 256, "one launch"),
        ("triton pair", 33, 256, "own pass"),
    ),
    ("verify", 32, 16, "bf16", 1): (
        ("cuda64", 16, 256, "own pass"),
        ("cuda64", 23, 256, "own pass"),
        ("triton pair", 16, 256, "own pass"),
    ),
    # Cases added after the route table (the fp8 KV and 8-head set, --cases fp8): the table's choice when added.
    # Triton's until the transposed body's bf16 form was timed (docs/benchmarks.md, "Route: 16-row programs").
    ("decode", 1, 8, "bf16", 1): (
        ("cuda16 one launch", 132, 64, "none"),
        ("cuda16 one launch", 188, 64, "none"),
        ("triton", 256, 64, "none"),
    ),
    ("decode", 1, 8, "bf16", 4): (
        ("cuda16 one launch", 33, 256, "none"),
        ("cuda16 one launch", 47, 256, "none"),
        ("triton", 256, 256, "none"),
    ),
    ("decode", 1, 8, "fp8", 1): (
        ("cuda16 one launch", 132, 64, "none"),
        ("cuda16 one launch", 188, 64, "none"),
        ("triton", 256, 64, "none"),
    ),
    ("decode", 1, 16, "fp8", 4): (
        ("cuda16 one launch", 33, 256, "none"),
        ("cuda16 one launch", 47, 256, "none"),
        ("triton", 256, 256, "none"),
    ),
    ("verify", 8, 8, "fp8", 1): (
        ("cuda64 one launch", 131, 256, "one launch"),
        ("cuda64 one launch", 187, 256, "one launch"),
        ("triton pair", 132, 256, "merge"),
    ),
}


def _bench():
    """scripts/bench_mla.py (a script, loaded from its file), for its case lists."""
    spec = importlib.util.spec_from_file_location("bench_mla", REPO_ROOT / "scripts" / "bench_mla.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_case_keys() -> set:
    """(kind, draft tokens, heads, KV dtype, batch) of every case the benchmark times or sweeps."""
    bench = _bench()
    keys = {
        ("verify", drafts, heads, kvd, 1)
        for _, drafts, heads, kvd, _, _ in bench.verify_cases("all") + bench.verify_cases("quick")
    }
    keys |= {
        ("decode", 1, heads, kvd, batch)
        for _, batch, heads, kvd, _ in bench.decode_cases("all") + bench.decode_cases("quick")
    }
    kinds = bench.SWEEP_TILE_CASES + bench.SWEEP_MERGE_CASES + bench.SWEEP_CHUNK_CASES + bench.SWEEP_ROWS16_CASES
    kinds += bench.PROFILE_CASES + [case[:5] for case in bench.TIMELINE_CASES]
    kinds += [("verify",) + case for case in bench.SWEEP_PREFIX_CASES + bench.SWEEP_FUSED_CASES]
    for kind, _, n, heads, kvd in kinds:
        keys.add(("decode", 1, heads, kvd, n) if kind == "decode" else ("verify", n, heads, kvd, 1))
    return keys


def mla_call(kind, drafts, heads, kvd, batch, sm_count=132, cuda=True, capacity=None, **change) -> routes.Call:
    """An MLA 576/512 call as the launcher describes it, with the CUDA kernels' own figures."""
    from sm120_attention import sm120_mla_mma as mma

    capacity = sm_count if capacity is None else capacity
    offer = routes.Cuda(mma.ROWS, mma.ROWS16, mma.FUSED_MAX_SLOTS, capacity, capacity, True) if cuda else None
    call = routes.Call(
        kind == "decode",
        batch,
        drafts,
        heads,
        1,
        576,
        512,
        "float8_e4m3fn" if kvd == "fp8" else "bfloat16",
        kind == "verify",
        sm_count,
        True,
        offer,
    )
    return call._replace(**change)


def summary(route: routes.Route) -> tuple:
    return (route.path + (" pair" if route.pair else ""), route.splits, route.min_chunk, route.tail)


def test_every_benchmark_case_routes_as_the_launcher_did_before():
    keys = bench_case_keys()
    missing = sorted(keys - set(PINNED))
    assert not missing, f"bench_mla.py cases with no pinned route (add their choice to PINNED): {missing}"
    for key in sorted(keys):
        with_132, with_188, triton_only = PINNED[key]
        assert summary(routes.choose(mla_call(*key, sm_count=132))) == with_132, key
        assert summary(routes.choose(mla_call(*key, sm_count=188))) == with_188, key
        assert summary(routes.choose(mla_call(*key, sm_count=132, cuda=False))) == triton_only, key


def test_verify_of_several_requests_with_few_rows_each_keeps_the_cuda_kernels():
    """Target verify of several requests with fewer than 64 query rows each (4 drafts x 8 heads, 2 x 16: 32 rows)
    takes the 16-row one launch up to rows16_max_programs (4) programs a split; past that, fp8 KV keeps it up to
    rows16_max_programs_fp8_verify (32), and bf16 KV takes the 64-row one launch (a program a request, 32 live
    rows) up to one_launch_max_programs_bf16_verify (16) programs a split, where Triton's kernels ran before
    (docs/benchmarks.md "Route: several requests": 2.6-3.9x for fp8, 1.12-2.3x for bf16, on an H100)."""
    table = routes.TABLE
    assert (table.rows16_max_programs_fp8_verify, table.one_launch_min_rows_bf16_verify) == (32, 32)
    assert table.one_launch_max_programs_bf16_verify == 16
    for drafts, heads in ((4, 8), (2, 16)):
        for batch, fp8, bf16 in (
            (2, ("cuda16 one launch", 32, 256, "one launch"), ("cuda16 one launch", 32, 256, "one launch")),
            (4, ("cuda16 one launch", 15, 256, "one launch"), ("cuda64 one launch", 32, 256, "one launch")),
            (8, ("cuda16 one launch", 7, 256, "one launch"), ("cuda64 one launch", 15, 256, "one launch")),
            (16, ("cuda16 one launch", 3, 256, "one launch"), ("cuda64 one launch", 7, 256, "one launch")),
            (32, ("triton pair", 8, 256, "merge"), ("triton pair", 8, 256, "merge")),
        ):
            assert summary(routes.choose(mla_call("verify", drafts, heads, "fp8", batch))) == fp8, (drafts, batch)
            assert summary(routes.choose(mla_call("verify", drafts, heads, "bf16", batch))) == bf16, (drafts, batch)
    # bench_mla.py --cases verify-batch times the route's own pick on these shapes (and only there)
    timed = {
        (drafts, heads, kvd, batch)
        for _, drafts, heads, kvd, _, _, batch in _bench().batched_verify_cases("verify-batch")
    }
    assert timed == {(d, h, k, b) for d, h in ((4, 8), (2, 16)) for k in ("fp8", "bf16") for b in (4, 8)}
    assert not _bench().batched_verify_cases("all")
    # Below 32 rows a request (2 drafts x 8 heads) bf16 keeps Triton's kernels past four 16-row programs a split;
    # decode is unchanged (batch 8 of 16 heads: eight 16-row programs, Triton's).
    assert routes.choose(mla_call("verify", 2, 8, "bf16", 8)).path == routes.TRITON
    assert routes.choose(mla_call("verify", 2, 8, "fp8", 8)).path == routes.CUDA16_ONE_LAUNCH
    assert routes.choose(mla_call("decode", 1, 16, "bf16", 8)).path == routes.TRITON
    assert routes.choose(mla_call("decode", 1, 16, "fp8", 8)).path == routes.TRITON
    # force(TRITON) leaves every such call to Triton's kernels, force(CUDA16_ONE_LAUNCH) to the 16-row launch.
    for kvd in ("fp8", "bf16"):
        call = mla_call("verify", 4, 8, kvd, 8)
        assert routes.choose(call, routes.force(routes.TRITON)).path == routes.TRITON
        assert routes.choose(call, routes.force(routes.CUDA16_ONE_LAUNCH)).path == routes.CUDA16_ONE_LAUNCH


def test_force_selects_each_path_where_its_kernels_take_the_call():
    call = mla_call("verify", 8, 16, "bf16", 1)  # 128 rows: two 64-row programs or eight 16-row ones a split
    assert routes.choose(call).path == routes.CUDA64_ONE_LAUNCH
    for path in routes.PATHS:
        assert routes.choose(call, routes.force(path)).path == path
    sixteen = routes.choose(call, routes.force(routes.CUDA16_ONE_LAUNCH))
    assert (sixteen.splits, sixteen.tail) == (132 // 8 - 1, "one launch")  # the tail's program takes a slot
    assert routes.choose(call, routes.force(routes.CUDA64)).tail == "merge"  # 128 rows: scored in the merge
    with pytest.raises(ValueError, match="no route path 'mma'"):
        routes.force("mma")


def test_a_one_launch_that_cannot_take_the_call_leaves_it_to_the_next_path():
    # Fewer programs the GPU holds at once than a one launch needs: the 16-row programs leave decode to
    # Triton, the 64-row ones leave verify to the prefix kernel and the Triton merge.
    assert routes.choose(mla_call("decode", 1, 16, "fp8", 4, capacity=3)).path == routes.TRITON
    assert routes.choose(mla_call("verify", 8, 16, "bf16", 1, capacity=2)).path == routes.CUDA64
    # An output or draft tail the one launch cannot take (an fp16 output, say).
    call = mla_call("verify", 8, 16, "bf16", 1)
    refused = call._replace(cuda=call.cuda._replace(one_launch=False))
    assert summary(routes.choose(refused)) == ("cuda64", 66, 256, "merge")
    # A fixed split count past the slots a row block may have.
    assert routes.choose(call, routes.TABLE._replace(splits=300)).path == routes.CUDA64
    assert routes.choose(call, routes.TABLE._replace(splits=33)).splits == 33


def test_values_read_apart_from_the_keys_keep_the_triton_kernels():
    call = mla_call("verify", 8, 16, "bf16", 1, v_from_k=False)
    route = routes.choose(call)
    assert (route.path, route.pair, route.v_from_k) == (routes.TRITON, False, False)


def test_gqa_verify_takes_the_triton_kernels_by_its_tiles():
    call = routes.Call(False, 2, 8, 32, 4, 128, 128, "bfloat16", True, 188, False, None)
    route = routes.choose(call)
    assert route.tiles == routes.pick_tiles(128, 128, 8, 8) == routes.TileConfig(4, 8, 64, 4, 3)
    assert (route.path, route.pair, route.tail) == (routes.TRITON, False, "own pass")  # 256 rows a request
    assert route.splits == routes.num_splits_for(2 * 2 * 4, 188, 2) and route.merge == (64, 128, 4)


def test_using_puts_a_table_in_place_for_a_block():
    call = mla_call("verify", 8, 16, "bf16", 1)
    with routes.using(routes.force(routes.TRITON)):
        assert routes.choose(call).path == routes.TRITON
    assert routes.choose(call).path == routes.CUDA64_ONE_LAUNCH
    with pytest.raises(KeyError):
        with routes.using(routes.force(routes.CUDA64)):
            raise KeyError("a failure inside the block")
    assert routes.TABLE == routes.Table()


def test_each_threshold_names_a_heading_of_the_benchmarks_doc():
    """One line a threshold of the table, naming a heading of docs/benchmarks.md that exists."""
    source = (REPO_ROOT / "kernels" / "sm120_attention" / "sm120_mla_route.py").read_text(encoding="utf-8")
    body = source.split("class Table(NamedTuple):", 1)[1].split("\n\n\n", 1)[0]
    headings = {
        line.lstrip("#").strip()
        for line in (REPO_ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }
    fields = {}
    for line in body.splitlines():
        match = re.match(r"    (\w+): .+ = (.+?)  # (.+)$", line)
        if match:
            fields[match.group(1)] = (match.group(2), match.group(3))
    assert set(fields) == set(routes.Table._fields)
    for name, (default, comment) in fields.items():
        if default == "None":  # a benchmark's fixed choice, not a threshold
            continue
        named = re.findall(r'"(Route: [^"]+)"', comment)
        assert named and named[0] in headings, (name, comment)


def test_fp8_mma_path_follows_the_setting_then_the_table():
    """The fp8-mma path: fp8 KV on a CUDA path, where SGLANG_SM120_MLA_FP8_MMA (Call.fp8_mma) asks for it, or,
    unset, where the table does (Table.fp8_mma, off by default: docs/benchmarks.md "Route: fp8-mma path")."""
    assert routes.TABLE.fp8_mma is False
    on = routes.TABLE._replace(fp8_mma=True)
    for key, path in (
        (("decode", 1, 16, "fp8", 1), routes.CUDA16_ONE_LAUNCH),
        (("decode", 1, 8, "fp8", 1), routes.CUDA16_ONE_LAUNCH),
        (("verify", 8, 8, "fp8", 1), routes.CUDA64_ONE_LAUNCH),
        (("verify", 1, 16, "fp8", 1), routes.CUDA16_ONE_LAUNCH),
    ):
        call = mla_call(*key)
        assert (routes.choose(call).path, routes.choose(call).fp8_mma) == (path, False), key  # the default: exact
        assert routes.choose(call._replace(fp8_mma=True)).fp8_mma is True, key
        assert routes.choose(call, on).fp8_mma is True, key  # unset: the table decides
        assert routes.choose(call._replace(fp8_mma=False), on).fp8_mma is False, key  # the setting wins
        assert routes.choose(call._replace(fp8_mma=True)).path == path, key  # the same programs, e4m3 scores
    # The 64-row prefix programs (no one launch) take it too; bf16 KV and the Triton kernels never do.
    prefix_only = mla_call("verify", 8, 16, "fp8", 1, capacity=2, fp8_mma=True)
    assert (routes.choose(prefix_only).path, routes.choose(prefix_only).fp8_mma) == (routes.CUDA64, True)
    assert routes.choose(mla_call("verify", 8, 16, "bf16", 1, fp8_mma=True)).fp8_mma is False
    assert routes.choose(mla_call("decode", 1, 16, "fp8", 1, cuda=False, fp8_mma=True)).fp8_mma is False
    assert (
        routes.choose(mla_call("decode", 1, 16, "fp8", 1, fp8_mma=True), routes.force(routes.TRITON)).fp8_mma is False
    )


@pytest.mark.parametrize(
    "value, setting",
    [(None, None), ("1", True), ("on", True), ("TRUE", True), ("0", False), ("off", False), ("", None), ("x", None)],
)
def test_fp8_mma_setting_reads_the_environment(monkeypatch, value, setting):
    from sm120_attention import sm120_mla_mma as mma

    if value is None:
        monkeypatch.delenv(mma.FP8_MMA_ENV, raising=False)
    else:
        monkeypatch.setenv(mma.FP8_MMA_ENV, value)
    assert mma.FP8_MMA_ENV == "SGLANG_SM120_MLA_FP8_MMA"
    assert mma.fp8_mma_setting() is setting


class _TritonRan(Exception):
    """Raised by the stand-in for the Triton prefix kernels: the launcher chose the Triton path."""


class _TritonStandIn:
    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise _TritonRan(grid)

        return launch


@pytest.fixture()
def launcher(monkeypatch):
    """sm120_mla with stand-ins for what needs a GPU: the CUDA kernels report a 132-SM GPU and record the one
    launch; the Triton prefix kernels raise when launched. The route and the launcher are their own code."""
    from sm120_attention import sm120_mla as mla

    mma = mla.cuda_prefix
    calls = []

    def fused_pass(
        q,
        kv,
        q_indptr,
        kv_indptr,
        kv_indices,
        tail,
        o_part,
        l_part,
        o,
        qk_scale,
        v_scale,
        tail_scale,
        batch,
        max_tokens,
        num_splits,
        min_split,
        rows,
        lse,
        fp8_mma=False,
    ):
        calls.append(
            dict(
                q_indptr=q_indptr.tolist(),
                tail=tail is not None,
                slots=o_part.shape[2],
                part_dtype=o_part.dtype,
                batch=batch,
                splits=num_splits,
                min_split=min_split,
                rows=rows,
                lse=lse,
                fp8_mma=fp8_mma,
            )
        )
        return True

    monkeypatch.setattr(mma, "serves", lambda *a: True)
    monkeypatch.setattr(mma, "kernel", lambda device: object())
    monkeypatch.setattr(mma, "fused_capacity", lambda q, kv, idx, rows=mma.ROWS: 132)
    monkeypatch.setattr(mma, "fused_pass", fused_pass)
    monkeypatch.setattr(mla, "_prefix_kernel", _TritonStandIn())
    monkeypatch.setattr(mla, "_prefix_pair_kernel", _TritonStandIn())
    return mla, calls


def test_launcher_hands_the_one_launch_what_the_route_says(launcher, monkeypatch):
    """What `_run_split_attention` hands the CUDA kernels for MLA decode and verify (CPU tensors; the stand-ins
    of the fixture): the split count, the decode's query pointers and log-sum-exp view, the slots."""
    import torch

    mla, calls = launcher
    table = routes.TABLE

    def decode(heads, batch, kv_dtype, lse=False, route=None):
        calls.clear()
        pool = torch.zeros(4096, 1, 576, dtype=kv_dtype)
        q = torch.zeros(batch, heads, 576, dtype=torch.bfloat16)
        o = torch.zeros(batch, heads, 512, dtype=torch.bfloat16)
        lse_buf = torch.zeros(batch, heads, 8) if lse else None
        mla._run_split_attention(
            q,
            pool,
            pool[:, :, :512],
            o,
            None,
            torch.arange(batch + 1, dtype=torch.int32) * 100,
            torch.arange(batch * 100, dtype=torch.int32),
            batch,
            1,
            0.04,
            1.0,
            1.0,
            lse_out=lse_buf[:, :, 0] if lse else None,
            route=route,
        )
        return calls[-1]

    def verify(drafts, heads, kv_dtype=torch.bfloat16):
        calls.clear()
        pool = torch.zeros(4096, 1, 576, dtype=kv_dtype)
        q = torch.zeros(drafts, heads, 576, dtype=torch.bfloat16)
        k_ext = torch.zeros(drafts, 1, 576, dtype=torch.bfloat16)
        tail = (
            k_ext,
            k_ext[:, :, :512],
            torch.ones(drafts * (300 + drafts), dtype=torch.int8),
            torch.zeros(2, dtype=torch.int64),
        )
        o = torch.zeros(drafts, heads, 512, dtype=torch.bfloat16)
        mla._run_split_attention(
            q,
            pool,
            pool[:, :, :512],
            o,
            torch.tensor([0, drafts], dtype=torch.int32),
            torch.tensor([0, 300], dtype=torch.int32),
            torch.arange(300, dtype=torch.int32),
            1,
            drafts,
            0.04,
            1.0,
            1.0,
            tail=tail,
        )
        return calls[-1]

    fp8 = torch.float8_e4m3fn
    # Decode: fp8 at batch 1 and bf16 at batches 2-4 take the 16-row programs in one launch, no draft tail,
    # one query token a request, the log-sum-exp passed through; bf16 at batch 1 keeps the Triton kernels.
    one = decode(16, 1, fp8, lse=True)
    assert (one["rows"], one["tail"], one["q_indptr"], one["splits"], one["slots"]) == (16, False, [0, 1], 132, 132)
    assert one["min_split"] == table.min_chunk_one and one["lse"].shape == (1, 16)
    assert one["part_dtype"] == torch.bfloat16
    four = decode(16, 4, torch.bfloat16)
    assert (four["rows"], four["q_indptr"], four["splits"], four["min_split"]) == (
        16,
        [0, 1, 2, 3, 4],
        33,
        table.min_chunk,
    )
    with pytest.raises(_TritonRan):
        decode(16, 1, torch.bfloat16)
    with pytest.raises(_TritonRan):
        decode(16, 8, torch.bfloat16)  # eight programs a split: more than rows16_max_programs
    # 128 heads: two 64-row programs a split in one launch.
    wide = decode(128, 1, torch.bfloat16)
    assert (wide["rows"], wide["splits"]) == (64, 66)
    # Verify: 2 drafts x 16 heads (two 16-row programs) and 1 draft with bf16 or fp8 KV take the 16-row
    # programs with the draft tail in its own slot (one program a split: the shorter splits); 8 x 16 heads the
    # 64-row one launch.
    two = verify(2, 16)
    assert (two["rows"], two["tail"], two["splits"], two["slots"]) == (16, True, 65, 66)
    assert verify(1, 16, fp8)["rows"] == 16
    one_draft = verify(1, 16)
    assert (one_draft["rows"], one_draft["tail"], one_draft["splits"]) == (16, True, 131)
    assert one_draft["min_split"] == table.min_chunk_one
    with routes.using(table._replace(rows16_min_programs_bf16_verify=2)):
        with pytest.raises(_TritonRan):
            verify(1, 16)
    eight = verify(8, 16)
    assert (eight["rows"], eight["tail"], eight["splits"]) == (64, True, 65)
    # The fp8-mma setting, read by the launcher at each call (call_of), reaches the kernels through the route;
    # bf16 KV is never on it.
    monkeypatch.delenv("SGLANG_SM120_MLA_FP8_MMA", raising=False)
    assert decode(16, 1, fp8)["fp8_mma"] is False and verify(8, 8, fp8)["fp8_mma"] is False
    monkeypatch.setenv("SGLANG_SM120_MLA_FP8_MMA", "1")
    assert decode(16, 1, fp8)["fp8_mma"] is True and verify(8, 8, fp8)["fp8_mma"] is True
    assert decode(16, 4, torch.bfloat16)["fp8_mma"] is False
    with routes.using(table._replace(fp8_mma=True)):
        monkeypatch.setenv("SGLANG_SM120_MLA_FP8_MMA", "0")
        assert decode(16, 1, fp8)["fp8_mma"] is False  # the setting wins over the table
        monkeypatch.delenv("SGLANG_SM120_MLA_FP8_MMA")
        assert decode(16, 1, fp8)["fp8_mma"] is True
    # A route handed to the launcher is what it runs: the Triton path for a call the CUDA kernels would take.
    triton = routes.choose(mla_call("decode", 1, 16, "fp8", 1), routes.force(routes.TRITON))
    with pytest.raises(_TritonRan):
        decode(16, 1, fp8, route=triton)
    # 128 heads at batch 8: sixteen programs a split, so the 64-row prefix kernel (its query pointers made by the
    # launcher, one token a request), then the Triton merge.
    prefix_calls = []
    monkeypatch.setattr(
        mla.cuda_prefix, "prefix_pass", lambda q, kv, q_indptr, *rest: prefix_calls.append(q_indptr.tolist())
    )
    monkeypatch.setattr(mla, "_merge_kernel", _TritonStandIn())
    calls.clear()
    with pytest.raises(_TritonRan):
        decode(128, 8, torch.bfloat16)
    assert prefix_calls == [list(range(9))]
    with routes.using(table._replace(rows16_max_programs=0)):
        with pytest.raises(_TritonRan):
            decode(16, 4, torch.bfloat16)


def test_launcher_refuses_a_route_the_one_launch_declines(launcher, monkeypatch):
    import torch

    mla, _ = launcher
    monkeypatch.setattr(mla.cuda_prefix, "fused_pass", lambda *args: False)
    pool = torch.zeros(4096, 1, 576, dtype=torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="declined the route it was given"):
        mla._run_split_attention(
            torch.zeros(1, 16, 576, dtype=torch.bfloat16),
            pool,
            pool[:, :, :512],
            torch.zeros(1, 16, 512, dtype=torch.bfloat16),
            None,
            torch.tensor([0, 100], dtype=torch.int32),
            torch.arange(100, dtype=torch.int32),
            1,
            1,
            0.04,
            1.0,
            1.0,
        )


def test_split_length_is_the_kernels_cut_and_gives_the_documented_splits():
    """``split_length`` cuts a prefix as the kernels' ``split_range`` does (equal chunks of whole tiles, at least the
    fewest tokens a split), and on 132 SMs the route's 16-head fp8 decode splits come out at the lengths
    docs/benchmarks.md ("2026-12-05, night") gives for its split limit: 132 splits at batch 1, 33 at batch 4."""
    assert routes.split_length(1000, 4, 64, 32) == 256  # 250 tokens, rounded up to whole tiles
    assert routes.split_length(1000, 100, 64, 32) == 64  # 10 tokens a split, raised to the fewest
    assert routes.split_length(4096, 4, 0, 32) == 1024  # an exact cut stays as it is
    documented = {
        (8192, 1): 64,
        (32768, 1): 256,
        (131072, 1): 1024,
        (185000, 1): 1408,
        (8192, 4): 256,
        (32768, 4): 1024,
        (131072, 4): 4000,
        (185000, 4): 5632,
    }
    from sm120_attention import sm120_mla_mma as mma

    for (prefix, batch), tokens in documented.items():
        route = routes.choose(mla_call("decode", 1, 16, "fp8", batch))
        assert route.path == routes.CUDA16_ONE_LAUNCH
        assert routes.split_length(prefix, route.splits, route.min_chunk, mma.BLOCK_N) == tokens, (prefix, batch)
        # the splits cover the prefix (those past its end are empty: 128 of 132 walk the 32k prefix at batch 1)
        assert -(-prefix // tokens) <= route.splits, (prefix, batch)
