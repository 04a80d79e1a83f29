"""Time the CUDA MLA kernels' builds on this machine's GPU; the child program of ``sm120kit tune-mla``.

This module is a program, started by :mod:`sm120kit.tune.mla` through :func:`sm120kit.runner.run` in the Python
that will serve (``PYTHONPATH`` reaching this file's package and the kernels' package ``sm120_attention``):

    python -m sm120kit.tune.mla_worker SPEC.json RESULT.json

It imports nothing of sm120kit and nothing outside the standard library but torch, Triton (its CUDA-graph timer),
the kernels' package and, for the error of SGLang's own fp8 kernels on the same inputs, SGLang. For each
candidate of SPEC (a set of the kernels' build flags, ``TUNABLES``, and whether fp8 KV takes the fp8-mma path) it
builds the kernels with those flags (``sm120_mla_mma.install``), then for each case (prefix tokens, batch, heads,
KV dtype, draft tokens; page size 1, every token at a random slot, KV scale 0.5 for fp8) runs MLA decode
(``sm120_mla_decode_fwd``) or target verify under a tree mask (``sm120_tree_verify_fwd``) as the patched SGLang
does, takes the largest absolute difference to the float32 reference, and times the call replayed from a CUDA
graph (``triton.testing.do_bench_cudagraph``). A line ``done <candidate>`` on standard output marks each
candidate's end.

:func:`time_candidates` is that loop, with the device, the build's install and the timer as arguments (a test runs
it on a CPU through the kernels' Triton path in Triton's interpreter).

On a GPU that is not 12.x (``--any-gpu``) it first sets ``DISABLE_MMA_V3=1`` (:func:`enter_sm120_mode`), as
``scripts/bench_mla.py`` does. RESULT.json gets the GPU, whether it did so, the versions, the kernels' folder,
SGLang's error per fp8 case (or why it was not measured) and, per candidate, its times and errors or the error that
stopped it. The exit status is 0 whenever RESULT.json was written.
"""

import json
import math
import os
import sys
import traceback

LK, LV = 576, 512
DONE_MARK = "done "
SM120_MODE_ENV = "DISABLE_MMA_V3"


def _versions(torch):
    info = {"python": sys.executable, "torch": torch.__version__, "cuda": torch.version.cuda}
    from importlib.metadata import version as dist_version

    for name, dist in (("triton", "triton"), ("sglang", "sglang")):
        try:
            info[name] = dist_version(dist)
        except Exception:
            info[name] = None
    return info


def enter_sm120_mode(environ=os.environ):
    """For a GPU outside SPEC's ``capabilities`` (the 12.x cards) that ``--any-gpu`` let in: have Triton emit
    ``mma.sync`` as it does for sm_120 instead of Hopper's wgmma (``DISABLE_MMA_V3=1``, read when a kernel is
    compiled and part of Triton's cache key), so the Triton path is timed the way an SM120 card runs it."""
    environ[SM120_MODE_ENV] = "1"


def case_key(prefix, batch, heads, kv, drafts=0):
    """A case's name in SPEC's order: ``<prefix>x<batch>x<heads>:<kv>`` for decode, ``...d<drafts>:<kv>`` for verify."""
    return f"{prefix}x{batch}x{heads}" + (f"d{drafts}" if drafts else "") + f":{kv}"


def _case(torch, ref, prefix, batch, heads, kv, drafts, kv_scale, device, dtype):
    """A decode step (``drafts`` 0) or a target verify of ``drafts`` tokens a request (a tree mask over them) of
    ``batch`` requests of ``prefix`` tokens on ``device``, queries (and 16-bit KV) in ``dtype``, every prefix token
    at a random slot of the pool; fp8 KV holds the values over ``kv_scale``, so the reference multiplies them back."""
    if drafts:
        c = ref.make_verify_case(
            [prefix] * batch,
            [drafts] * batch,
            heads=heads,
            lk=LK,
            lv=LV,
            dtype=dtype,
            tree="tree",
            seed=prefix + drafts,
        )
    else:
        c = ref.make_decode_case([prefix] * batch, heads=heads, lk=LK, lv=LV, dtype=dtype, seed=prefix + batch)
    c = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    if kv == "fp8":
        c["k_pool"] = (c["k_pool"].float() / kv_scale).to(torch.float8_e4m3fn)
    # MLA's values are the first LV dims of the keys' rows, a view, as SGLang's pool holds them (the copy to the
    # device made them a tensor of their own, which the CUDA kernels do not take)
    c["v_pool"] = c["k_pool"][:, :, :LV]
    return c


def _reference(ref, c, kv, drafts, kv_scale):
    scale = kv_scale if kv == "fp8" else 1.0
    if drafts:
        return ref.reference_verify(c, k_scale=scale, v_scale=scale)
    return ref.reference_decode(c, k_scale=scale, v_scale=scale)


def _call(torch, ref, fn, c, heads, kv, drafts, kv_scale, device, **kwargs):
    """The decode or verify call as the patched SGLang makes it (``fn``: ``sm120_mla_decode_fwd`` or
    ``sm120_tree_verify_fwd``, or SGLang's ``decode_attention_fwd`` or ``extend_attention_fwd``, ``kwargs`` its
    keyword arguments), as a function of no arguments, and its output."""
    scale = kv_scale if kv == "fp8" else 1.0
    rows = c["q"].shape[0]
    o = torch.zeros(rows, heads, LV, dtype=c["q"].dtype, device=device)
    if drafts:
        args = ref.verify_args(c, o, scale, scale)
    else:
        splits = 64
        logits = torch.empty(rows, heads, splits, LV, dtype=torch.float32, device=device)
        lse = torch.empty(rows, heads, splits, dtype=torch.float32, device=device)
        nsplit = torch.full((rows,), splits, dtype=torch.int32, device=device)
        args = (c["q"], c["k_pool"], c["v_pool"], o, c["kv_indptr"], c["kv_indices"], logits, lse, nsplit, splits)
        args += (1.0 / LK**0.5, scale, scale)

    def run():
        if fn(*args, **kwargs) is False:
            raise RuntimeError("the SM120 MLA kernels declined the call")

    return run, o


def _sglang_kernel(name):
    """SGLang's own Triton kernel ``name`` (``decode_attention_fwd`` or ``extend_attention_fwd``; its module moved
    between releases) and its keyword arguments for MLA (``has_mla`` where the release takes it), or None."""
    import importlib
    import inspect

    module = name.replace("_fwd", "")
    for package in ("sglang.kernels.ops.attention", "sglang.srt.layers.attention.triton_ops"):
        try:
            fn = getattr(importlib.import_module(f"{package}.{module}"), name)
        except Exception:
            continue
        params = inspect.signature(fn).parameters
        return fn, ({"has_mla": True} if name == "decode_attention_fwd" and "has_mla" in params else {})
    return None


def time_candidates(torch, ref, mla, spec, result, write, *, device, install, timer, sync):
    """Build the spec's cases on ``device``, take SGLang's fp8 error on each fp8 one, then for each candidate
    ``install(defines)`` its build and check and time (``timer(run, rep_ms)``, ms) every case; ``sync`` waits for
    the device. :func:`measure` passes the GPU, ``sm120_mla_mma.install`` and Triton's CUDA-graph timer."""
    kv_scale = float(spec.get("kv_scale", 0.5))
    rep_ms = int(spec.get("rep_ms", 200))
    # bfloat16, as SGLang runs MLA; float16 where the loop is checked on a CPU (Triton's interpreter computes no
    # bfloat16)
    dtype = getattr(torch, spec.get("dtype", "bfloat16"))
    cases = [tuple(case) + (0,) * (5 - len(case)) for case in spec["cases"]]  # drafts: 0 (decode) where left out
    inputs, refs = {}, {}
    try:
        for prefix, batch, heads, kv, drafts in cases:
            key = case_key(prefix, batch, heads, kv, drafts)
            inputs[key] = _case(torch, ref, prefix, batch, heads, kv, drafts, kv_scale, device, dtype)
            refs[key] = _reference(ref, inputs[key], kv, drafts, kv_scale)
    except Exception as exc:  # noqa: BLE001 - out of GPU memory, most likely: the run stops and says so
        result["error"] = f"the cases' inputs and references could not be built: {type(exc).__name__}: {exc}"
        result["error_kind"] = "cases"
        write()
        return

    theirs = {name: _sglang_kernel(name) for name in ("decode_attention_fwd", "extend_attention_fwd")}
    for (prefix, batch, heads, kv, drafts), key in zip(cases, inputs):
        if kv != "fp8":
            continue
        name = "extend_attention_fwd" if drafts else "decode_attention_fwd"
        if theirs[name] is None:
            result["sglang"][key] = {"error": f"SGLang's {name} could not be imported"}
            continue
        try:
            fn, kwargs = theirs[name]
            run, o = _call(torch, ref, fn, inputs[key], heads, kv, drafts, kv_scale, device, **kwargs)
            run()
            sync()
            result["sglang"][key] = {"max_abs_err": (o.float() - refs[key]).abs().max().item()}
        except Exception as exc:  # noqa: BLE001 - SGLang's kernel failing here is reported, not fatal
            result["sglang"][key] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}

    for cand in spec["candidates"]:
        entry = {"name": cand["name"], "error": None, "cases": []}
        result["candidates"].append(entry)
        os.environ[mla.cuda_prefix.FP8_MMA_ENV] = "1" if cand.get("fp8_mma") else "0"
        try:
            install(tuple(cand.get("defines", ())))
            for (prefix, batch, heads, kv, drafts), key in zip(cases, inputs):
                fn = mla.sm120_tree_verify_fwd if drafts else mla.sm120_mla_decode_fwd
                run, o = _call(torch, ref, fn, inputs[key], heads, kv, drafts, kv_scale, device)
                run()
                sync()
                err = (o.float() - refs[key]).abs().max().item()
                ms = timer(run, rep_ms)
                entry["cases"].append({"case": key, "ms": ms, "max_abs_err": err if math.isfinite(err) else None})
        except Exception as exc:  # noqa: BLE001 - one candidate failing is its result, not the run's end
            entry["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-1000:]
        write()
        print(DONE_MARK + cand["name"], flush=True)


def measure(spec_path, out_path):
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    result = {
        "error": None,
        "error_kind": None,  # "environment" (no GPU, not 12.x, a package missing) or "cases"
        "device": None,
        "capability": None,
        "sm120_mode": False,  # Triton held to mma.sync on a GPU that is not 12.x (enter_sm120_mode)
        "versions": None,
        "kernels": None,
        "sglang": {},
        "candidates": [],
    }

    def write():
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)

    try:
        import torch
        from triton.testing import do_bench_cudagraph

        import sm120_attention
        from sm120_attention import reference as ref
        from sm120_attention import sm120_mla as mla

        result["versions"] = _versions(torch)
        result["kernels"] = os.path.dirname(os.path.abspath(sm120_attention.__file__))
        if not torch.cuda.is_available():
            result["error"], result["error_kind"] = "torch sees no CUDA GPU", "environment"
            write()
            return
        index = torch.cuda.current_device()
        result["device"] = torch.cuda.get_device_name(index)
        result["capability"] = list(torch.cuda.get_device_capability(index))
        on_card = result["capability"] in spec.get("capabilities", [])
        if not on_card and not spec.get("any_gpu"):
            result["error"] = (
                f"the GPU is {result['device']} (compute capability {'.'.join(map(str, result['capability']))}), "
                "not a 12.x card"
            )
            result["error_kind"] = "environment"
            write()
            return
        if not on_card:
            enter_sm120_mode()
            result["sm120_mode"] = True
    except Exception as exc:  # noqa: BLE001 - what the serving Python lacks is the finding
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["error_kind"] = "environment"
        write()
        return

    device = torch.device("cuda", index)
    time_candidates(
        torch,
        ref,
        mla,
        spec,
        result,
        write,
        device=device,
        install=lambda defines: mla.cuda_prefix.install(device, defines),
        timer=lambda run, rep_ms: do_bench_cudagraph(run, rep=rep_ms),
        sync=torch.cuda.synchronize,
    )
    write()


def main(argv):
    if len(argv) == 2:
        measure(argv[0], argv[1])
        return 0
    print("usage: python -m sm120kit.tune.mla_worker SPEC.json RESULT.json", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
