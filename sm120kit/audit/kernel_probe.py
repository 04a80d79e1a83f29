"""Run SGLang's own Triton launchers under a faked SM12x device and record what Triton compiles.

Started by :mod:`sm120kit.audit.smem` in a fresh interpreter per tree and architecture::

    python -m sm120kit.audit.kernel_probe --root TREE --arch 12.0 --cases cases.json --out results.json

with ``TREE`` (the folder holding ``sglang/``) first on ``PYTHONPATH``. A fresh interpreter matters:
SGLang's kernel modules read the device capability when they are imported. Everything runs on ``meta``
tensors under :func:`sm120kit.hardware.fake_device.faked_device`, so each launch becomes a real Triton
compile for the faked target and nothing executes. The device, ``sgl_kernel`` and ``torchvision`` are
stood in for (this machine has no GPU); SGLang's code and Triton's compiler are the real ones.

Output: one ``@probe done <case id>`` line per case on stdout (the parent's progress) and a JSON file
``{"cases": {id: {"status", "kernels", "error", "note"}}, ...}``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from sm120kit.sglang.launchers import LAUNCHERS, MOE_CONFIG_FUNCTION, resolve

DONE_MARK = "@probe done "
TOKENS_PER_SEQUENCE = 64  # extend / prefill: new tokens per sequence
PREFIX_PER_SEQUENCE = 192  # extend: cached tokens per sequence
BATCH = 2  # extend / prefill sequences
MAX_KV_SPLITS = 8  # SGLang's default --triton-attention-num-kv-splits
DECODE_CONTEXT = 1024  # decode: cached tokens per sequence
TREE_DRAFTS = (8, 64)  # tree verify: draft tokens per request (a typical tree, the longest tail served)
LIGHTNING_TOKENS = 1000  # lightning attention: prefill tokens of one sequence (a partial last 256-token block)


class CaseSkipped(Exception):
    """This release has no code path for the case (e.g. no fp8 KV cache in its launcher)."""


class ImportFailed(Exception):
    def __init__(self, module: str, exc: BaseException) -> None:
        super().__init__(f"{module}: {type(exc).__name__}: {exc}")
        self.module = module
        self.missing = exc.name if isinstance(exc, ModuleNotFoundError) else None


class _ServingDefaults:
    """Answers the server-argument reads of SGLang's MoE config module with SGLang's defaults.

    With no server running, ``get_global_server_args()`` / ``get_exec()`` have nothing published; the
    config module reads only ``enable_deterministic_inference`` (default False), and the double-sparsity
    module reads ``triton_attention_reduce_in_fp32`` (default False) when it is imported. Any other read
    fails loudly instead of inventing a value.
    """

    VALUES = {"enable_deterministic_inference": False, "triton_attention_reduce_in_fp32": False}

    def __init__(self, path: str = "server_args") -> None:
        self._path = path

    def __call__(self) -> _ServingDefaults:
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self.VALUES:
            return self.VALUES[name]
        return _ServingDefaults(f"{self._path}.{name}")

    def __bool__(self) -> bool:
        raise RuntimeError(f"the audit has no default for the server argument {self._path}")


class Probe:
    def __init__(self, root: Path, policy: dict[str, dict[str, Any]]) -> None:
        self.root = root
        self.policy = policy
        self.modules: dict[str, Any] = {}
        self.failures: dict[str, ImportFailed] = {}
        self.arch = ""  # "12.0": the target of the CUDA kernels a launcher compiles with NVRTC
        self.cuda_kernels: list[dict] = []  # those kernels of the current case (Triton's are recorded apart)

    # -- modules ----------------------------------------------------------------------------------------
    def module(self, kind: str):
        if kind in self.failures:
            raise self.failures[kind]
        if kind in self.modules:
            return self.modules[kind]
        resolved = resolve(self.root, kind)
        if not resolved.present:
            raise CaseSkipped(f"this release has no {LAUNCHERS[kind].function}")
        names = [resolved.module] + ([resolved.helper_module] if kind == "moe" else [])
        loaded = []
        for name in names:
            try:
                with self._server_defaults(kind == "ds-extend"):
                    loaded.append(importlib.import_module(name))
            except BaseException as exc:  # noqa: BLE001 - report any import failure per launcher
                self.failures[kind] = ImportFailed(name, exc)
                raise self.failures[kind] from exc
        for global_name, value in self.policy.get(kind, {}).items():
            if not hasattr(loaded[0], global_name):
                raise RuntimeError(f"{resolved.module} has no global {global_name} to set")
            setattr(loaded[0], global_name, tuple(value) if isinstance(value, list) else value)
        if kind == "moe":
            self._prepare_moe(*loaded)
        self.modules[kind] = loaded if kind == "moe" else loaded[0]
        return self.modules[kind]

    @staticmethod
    @contextlib.contextmanager
    def _server_defaults(active: bool):
        """While a module that reads server arguments at import is imported (the double-sparsity
        kernels, from 0.5.3 on), answer ``get_global_server_args()`` with SGLang's defaults."""
        if not active:
            yield
            return
        try:
            server_args = importlib.import_module("sglang.srt.server_args")
        except ImportError:
            server_args = None
        previous = getattr(server_args, "get_global_server_args", None)
        if previous is not None:
            server_args.get_global_server_args = _ServingDefaults()
        try:
            yield
        finally:
            if previous is not None:
                server_args.get_global_server_args = previous

    def _prepare_moe(self, kernels, config) -> None:
        for reader in ("get_global_server_args", "get_exec"):
            if hasattr(config, reader):
                setattr(config, reader, _ServingDefaults())
        if hasattr(kernels, "sglang_per_token_group_quant_fp8"):
            # SGLang quantizes activations with an sgl_kernel CUDA op (no CPU build): this stand-in
            # returns tensors of that op's shapes, dtypes and layout (row-major scales) and runs nothing.
            # It refuses what SGLang's wrapper refuses (every release asserts x.shape[-1] % group_size == 0);
            # shapes SGLang's MoE loader rejects never get here (sm120kit.audit.moe_loader).
            def quant_shapes(x, group_size, *args, **kwargs):
                import torch

                assert x.shape[-1] % group_size == 0, (
                    f"the last dimension of `x` ({x.shape[-1]}) is not divisible by `group_size` ({group_size}) "
                    "(SGLang's sglang_per_token_group_quant_fp8 asserts the same)"
                )
                scales = torch.empty(*x.shape[:-1], x.shape[-1] // group_size, dtype=torch.float32, device=x.device)
                return torch.empty_like(x, dtype=torch.float8_e4m3fn), scales

            kernels.sglang_per_token_group_quant_fp8 = quant_shapes

    # -- launches ---------------------------------------------------------------------------------------
    def run(self, launcher: str, params: dict) -> str | None:
        return getattr(self, "_" + launcher.replace("-", "_"))(params)

    def _extend(self, p: dict) -> str | None:
        import torch

        module = self.module("extend")
        fn = module.extend_attention_fwd
        sig = inspect.signature(fn).parameters
        dtype, kv_dtype = _dtypes(p, sig)
        h, hkv, dq, dv = p["num_heads"], p["num_kv_heads"], p["qk_head_dim"], p["v_head_dim"]
        tokens, prefix = BATCH * TOKENS_PER_SEQUENCE, BATCH * PREFIX_PER_SEQUENCE
        meta = dict(device="meta")
        k_extend = torch.empty(tokens, hkv, dq, dtype=dtype, **meta)
        k_buffer = torch.empty(prefix + tokens, hkv, dq, dtype=kv_dtype, **meta)
        mla = dq != dv and hkv == 1
        args = {
            "q_extend": torch.empty(tokens, h, dq, dtype=dtype, **meta),
            "k_extend": k_extend,
            # MLA keeps V inside the K latent (a view of its first v_head_dim columns), as SGLang does.
            "v_extend": k_extend[..., :dv] if mla else torch.empty(tokens, hkv, dv, dtype=dtype, **meta),
            "o_extend": torch.empty(tokens, h, dv, dtype=dtype, **meta),
            "k_buffer": k_buffer,
            "v_buffer": k_buffer[..., :dv] if mla else torch.empty(prefix + tokens, hkv, dv, dtype=kv_dtype, **meta),
            "qo_indptr": torch.empty(BATCH + 1, dtype=torch.int32, **meta),
            "kv_indptr": torch.empty(BATCH + 1, dtype=torch.int32, **meta),
            "kv_indices": torch.empty(prefix, dtype=torch.int64, **meta),
            "custom_mask": None,
            "is_causal": True,
            "mask_indptr": None,
            "max_len_extend": TOKENS_PER_SEQUENCE,
            "k_scale": 1.0,
            "v_scale": 1.0,
        }
        _call(fn, args)
        return None

    def _decode(self, p: dict) -> str | None:
        import torch

        module = self.module("decode")
        fn = module.decode_attention_fwd
        sig = inspect.signature(fn).parameters
        dtype, kv_dtype = _dtypes(p, sig)
        h, hkv, dq, dv, bs = p["num_heads"], p["num_kv_heads"], p["qk_head_dim"], p["v_head_dim"], p["batch_size"]
        meta = dict(device="meta")
        slots = bs * DECODE_CONTEXT
        k_buffer = torch.empty(slots, hkv, dq, dtype=kv_dtype, **meta)
        mla = dq != dv and hkv == 1
        args = {
            "q": torch.empty(bs, h, dq, dtype=dtype, **meta),
            "k_buffer": k_buffer,
            "v_buffer": k_buffer[..., :dv] if mla else torch.empty(slots, hkv, dv, dtype=kv_dtype, **meta),
            "o": torch.empty(bs, h, dv, dtype=dtype, **meta),
            "kv_indptr": torch.empty(bs + 1, dtype=torch.int32, **meta),
            "kv_indices": torch.empty(slots, dtype=torch.int64, **meta),
            "attn_logits": torch.empty(bs, h, MAX_KV_SPLITS, dv, dtype=torch.float32, **meta),
            "attn_lse": torch.empty(bs, h, MAX_KV_SPLITS, dtype=torch.float32, **meta),
            "num_kv_splits": torch.empty(bs, dtype=torch.int32, **meta),
            "max_kv_splits": MAX_KV_SPLITS,
            "sm_scale": 1.0 / dq**0.5,
            "k_scale": 1.0,
            "v_scale": 1.0,
            "has_mla": mla,
        }
        _call(fn, args)
        return None

    def _tree_verify(self, p: dict) -> str | None:
        """sm120_tree_verify_fwd (sm120-mla-attention) at the shortest and the longest draft tail it serves."""
        import torch

        module = self.module("tree-verify")
        dtype, kv_dtype = _dtypes(p, inspect.signature(module.sm120_tree_verify_fwd).parameters)
        h, hkv, dq, dv = p["num_heads"], p["num_kv_heads"], p["qk_head_dim"], p["v_head_dim"]
        meta = dict(device="meta")
        mla = dq != dv and hkv == 1
        prefix = BATCH * DECODE_CONTEXT
        k_buffer = torch.empty(prefix, hkv, dq, dtype=kv_dtype, **meta)
        v_buffer = k_buffer[..., :dv] if mla else torch.empty(prefix, hkv, dv, dtype=kv_dtype, **meta)
        for drafts in TREE_DRAFTS:
            tokens = BATCH * drafts
            k_extend = torch.empty(tokens, hkv, dq, dtype=dtype, **meta)
            args = {
                "q_extend": torch.empty(tokens, h, dq, dtype=dtype, **meta),
                "k_extend": k_extend,
                "v_extend": k_extend[..., :dv] if mla else torch.empty(tokens, hkv, dv, dtype=dtype, **meta),
                "o_extend": torch.empty(tokens, h, dv, dtype=dtype, **meta),
                "k_buffer": k_buffer,
                "v_buffer": v_buffer,
                "qo_indptr": torch.empty(BATCH + 1, dtype=torch.int32, **meta),
                "kv_indptr": torch.empty(BATCH + 1, dtype=torch.int32, **meta),
                "kv_indices": torch.empty(prefix, dtype=torch.int64, **meta),
                "custom_mask": torch.empty(tokens * (DECODE_CONTEXT + drafts), dtype=torch.bool, **meta),
                "is_causal": False,
                "mask_indptr": torch.empty(BATCH + 1, dtype=torch.int64, **meta),
                "max_len_extend": drafts,
                "k_scale": 1.0,
                "v_scale": 1.0,
            }
            if not _call(module.sm120_tree_verify_fwd, args):
                raise CaseSkipped(f"sm120_tree_verify_fwd declines this shape ({drafts} draft tokens)")
        return self._mma_prefix(module, args, hkv)

    def _mma_prefix(self, module, args: dict, kv_heads: int) -> str | None:
        """The CUDA kernels the patch adds beside the Triton ones (sm120_mla_mma.py) for MLA verify and decode,
        for the shapes they take on a GPU: compiled with NVRTC for the target, as at first use on the card, with
        the build flags SGLANG_SM120_MLA_DEFINES gives the server where the tree's module reads it. The case's note
        names those flags, or why the server would ignore the variable."""
        mma = getattr(module, "cuda_prefix", None)
        if mma is None or not mma.fits(
            args["q_extend"], args["k_buffer"], args["qo_indptr"], args["kv_indptr"], args["kv_indices"], kv_heads
        ):
            return None
        import hashlib

        major, minor = self.arch.split(".")
        target = f"sm_{major}{minor}a"
        setting = getattr(mma, "defines_setting", None)  # releases of the patch before it have no such variable
        defines, problem = setting() if setting is not None else ((), None)
        try:
            binary = mma.compile_cubin(target, defines=defines) if defines else mma.compile_cubin(target)
        except mma.CompileError as exc:
            return f"CUDA MLA kernels not compiled: {exc}"
        usage = _resource_usage(binary) or {}
        kv_dtype, idx_dtype = args["k_buffer"].dtype, args["kv_indices"].dtype
        # The prefix kernel, the one-launch verify and decode (prefix, draft tail, merge) the launcher may pick
        # instead, and their 16-row programs (ENTRY_NAMES; releases of the patch before it name two tables).
        entries = getattr(mma, "ENTRY_NAMES", None) or {
            "prefix": mma.KERNEL_NAMES,
            "fused": getattr(mma, "FUSED_NAMES", {}),
        }
        # Keys (KV dtype, slot dtype), and from the fp8-mma entry points on (KV dtype, slot dtype, fp8-mma): for
        # fp8 KV both the exact and the fp8-mma build of each entry point.
        for name in (
            name for names in entries.values() for key, name in names.items() if key[:2] == (kv_dtype, idx_dtype)
        ):
            res = usage.get(name)
            self.cuda_kernels.append(
                {
                    "name": name,
                    "module": mma.__name__,
                    "constexprs": {"ROWS": mma.ROWS, "BLOCK_N": mma.BLOCK_N},
                    "num_warps": mma.THREADS // 32,
                    "num_stages": 2,
                    # dynamic shared memory the launcher asks for, plus what the cubin reserves itself
                    "shared": mma.SMEM_BYTES[kv_dtype] + (res.shared if res else 0),
                    "target": f"cuda:{major}{minor}",
                    "hash": hashlib.sha256(binary).hexdigest()[:16],
                    "registers": res.registers if res else None,
                }
            )
        if problem is not None:
            return problem
        return f"CUDA MLA kernels built with {mma.DEFINES_ENV}={','.join(defines)}" if defines else None

    def _mla_decode(self, p: dict) -> str | None:
        """sm120_mla_decode_fwd (sm120-mla-attention): MLA decode with SM-count KV splits."""
        import torch

        module = self.module("mla-decode")
        dtype, kv_dtype = _dtypes(p, inspect.signature(module.sm120_mla_decode_fwd).parameters)
        h, hkv, dq, dv, bs = p["num_heads"], p["num_kv_heads"], p["qk_head_dim"], p["v_head_dim"], p["batch_size"]
        if not (dq > dv and hkv == 1):
            raise CaseSkipped("sm120_mla_decode_fwd serves MLA shapes only (one latent KV head, qk dim > v dim)")
        meta = dict(device="meta")
        slots = bs * DECODE_CONTEXT
        k_buffer = torch.empty(slots, hkv, dq, dtype=kv_dtype, **meta)
        args = {
            "q": torch.empty(bs, h, dq, dtype=dtype, **meta),
            "k_buffer": k_buffer,
            "v_buffer": k_buffer[..., :dv],
            "o": torch.empty(bs, h, dv, dtype=dtype, **meta),
            "kv_indptr": torch.empty(bs + 1, dtype=torch.int32, **meta),
            "kv_indices": torch.empty(slots, dtype=torch.int64, **meta),
            "sm_scale": 1.0 / dq**0.5,
            "k_scale": 1.0,
            "v_scale": 1.0,
            "has_mla": True,
        }
        if not _call(module.sm120_mla_decode_fwd, args):
            raise CaseSkipped("sm120_mla_decode_fwd declines this shape")
        if not hasattr(getattr(module, "cuda_prefix", None), "ENTRY_NAMES"):
            return None  # a patch whose decode takes the Triton kernels only
        # Decode takes the CUDA kernel too (16-row programs, or 64-row ones from 64 heads), its rows
        # from one query token a request.
        return self._mma_prefix(
            module,
            {
                "q_extend": args["q"],
                "k_buffer": k_buffer,
                "qo_indptr": args["kv_indptr"],
                "kv_indptr": args["kv_indptr"],
                "kv_indices": args["kv_indices"],
            },
            hkv,
        )

    def _ds_extend(self, p: dict) -> str | None:
        """The double-sparsity backend's extend_attention_fwd (a request-to-token table, no KV scales)."""
        import torch

        module = self.module("ds-extend")
        dtype = getattr(torch, p["dtype"])
        h, hkv, dq, dv = p["num_heads"], p["num_kv_heads"], p["qk_head_dim"], p["v_head_dim"]
        tokens, slots = BATCH * TOKENS_PER_SEQUENCE, BATCH * (PREFIX_PER_SEQUENCE + TOKENS_PER_SEQUENCE)
        meta = dict(device="meta")
        mla = dq != dv and hkv == 1
        k_extend = torch.empty(tokens, hkv, dq, dtype=dtype, **meta)
        k_buffer = torch.empty(slots, hkv, dq, dtype=dtype, **meta)
        i32 = lambda *shape: torch.empty(*shape, dtype=torch.int32, **meta)  # noqa: E731
        _call(
            module.extend_attention_fwd,
            {
                "q_extend": torch.empty(tokens, h, dq, dtype=dtype, **meta),
                "k_extend": k_extend,
                "v_extend": k_extend[..., :dv] if mla else torch.empty(tokens, hkv, dv, dtype=dtype, **meta),
                "o_extend": torch.empty(tokens, h, dv, dtype=dtype, **meta),
                "k_buffer": k_buffer,
                "v_buffer": k_buffer[..., :dv] if mla else torch.empty(slots, hkv, dv, dtype=dtype, **meta),
                "req_to_tokens": i32(BATCH, PREFIX_PER_SEQUENCE + TOKENS_PER_SEQUENCE),
                "b_req_idx": i32(BATCH),
                "b_seq_len": i32(BATCH),
                "b_seq_len_extend": i32(BATCH),
                "b_start_loc_extend": i32(BATCH),
                "max_len_extend": TOKENS_PER_SEQUENCE,
            },
        )
        return None

    def _inkling_moe(self, p: dict) -> str | None:
        """Inkling's grouped_gemm_triton for the gate/up and the down projection, with the block M its
        MoE forward picks for the routed token count."""
        import torch

        module = self.module("inkling-moe")
        dtype = getattr(torch, p["dtype"])
        E, topk, H, inter, M = p["num_experts"], p["top_k"], p["hidden_size"], p["intermediate_size"], p["tokens"]
        routed = M * topk
        if hasattr(module, "select_grouped_gemm_block_m"):
            block_m = module.select_grouped_gemm_block_m(routed)
        else:
            block_m = module.BLOCK_SIZE_M
        meta = dict(device="meta")
        i32 = lambda *shape: torch.empty(*shape, dtype=torch.int32, **meta)  # noqa: E731
        schedule = i32(-(-routed // block_m) + E)
        for a, b in (
            (torch.empty(routed, H, dtype=dtype, **meta), torch.empty(E, 2 * inter, H, dtype=dtype, **meta)),
            (torch.empty(routed, inter, dtype=dtype, **meta), torch.empty(E, H, inter, dtype=dtype, **meta)),
        ):
            _call(
                module.grouped_gemm_triton,
                {
                    "a": a,
                    "b": b,
                    "num_experts": E,
                    "num_tokens_per_expert": i32(E),
                    "expert_token_offs": i32(E + 1),
                    "expert_block_offs": i32(E + 1),
                    "expert_block_schedule": schedule,
                    "block_size_m": block_m,
                },
            )
        return f"block M {block_m} for {routed} routed tokens"

    def _lightning(self, p: dict) -> str | None:
        """lightning_attention as the lightning backend calls it for one prefill sequence: q, k, v as
        [1, heads, tokens, head dim], per-head decay rates and the fp32 KV history of that sequence."""
        import torch

        module = self.module("lightning")
        dtype = getattr(torch, p["dtype"])
        h, d, e = p["num_heads"], p["qk_head_dim"], p["v_head_dim"]
        meta = dict(device="meta")
        n = LIGHTNING_TOKENS
        _call(
            module.lightning_attention,
            {
                "q": torch.empty(1, h, n, d, dtype=dtype, **meta),
                "k": torch.empty(1, h, n, d, dtype=dtype, **meta),
                "v": torch.empty(1, h, n, e, dtype=dtype, **meta),
                "ed": torch.empty(h, dtype=torch.float32, **meta),
                "block_size": 256,
                "kv_history": torch.empty(1, h, d, e, dtype=torch.float32, **meta),
            },
        )
        return None

    def _prefill(self, p: dict) -> str | None:
        import torch

        module = self.module("prefill")
        fn = module.context_attention_fwd
        dtype = getattr(torch, p["dtype"])
        h, hkv, d = p["num_heads"], p["num_kv_heads"], p["qk_head_dim"]
        tokens = BATCH * TOKENS_PER_SEQUENCE
        meta = dict(device="meta")
        args = {
            "q": torch.empty(tokens, h, d, dtype=dtype, **meta),
            "k": torch.empty(tokens, hkv, d, dtype=dtype, **meta),
            "v": torch.empty(tokens, hkv, d, dtype=dtype, **meta),
            "o": torch.empty(tokens, h, d, dtype=dtype, **meta),
            "b_start_loc": torch.empty(BATCH, dtype=torch.int32, **meta),
            "b_seq_len": torch.empty(BATCH, dtype=torch.int32, **meta),
            "max_input_len": TOKENS_PER_SEQUENCE,
            "is_causal": False,  # vision encoders, the users of this launcher, attend both ways
        }
        _call(fn, args)
        return None

    def _moe(self, p: dict) -> str | None:
        import torch
        import triton.language as tl

        kernels, config_module = self.module("moe")
        quant = p["quantization"]
        fp8 = quant in ("fp8_block", "fp8", "fp8_channel")
        per_channel = quant == "fp8_channel"
        block_shape = p["block_shape"]
        E, topk, H, inter, M = p["num_experts"], p["top_k"], p["hidden_size"], p["intermediate_size"], p["tokens"]
        meta = dict(device="meta")
        wdtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        w1 = torch.empty(E, 2 * inter, H, dtype=wdtype, **meta)
        w2 = torch.empty(E, H, inter, dtype=wdtype, **meta)

        chooser = getattr(config_module, MOE_CONFIG_FUNCTION)
        choose_sig = inspect.signature(chooser).parameters
        kwargs = {"block_shape": block_shape} if "block_shape" in choose_sig else {}
        if per_channel:
            if "per_channel_quant" not in choose_sig:
                raise CaseSkipped("this release's MoE config choice has no per-channel FP8 configs")
            kwargs["per_channel_quant"] = True
        with _device_named(p.get("device_name"), config_module):
            if "return_down_config" in choose_sig:
                config, (down_config, _) = chooser(
                    w1.shape, w2.shape, topk, "fp8_w8a8" if fp8 else None, M, return_down_config=True, **kwargs
                )
            else:
                config = chooser(w1.shape, w2.shape, topk, "fp8_w8a8" if fp8 else None, M, **kwargs)
                down_config = None
        notes = []
        config = dict(config)
        if config.pop("USE_TMA", False):
            notes.append("tuned config asks for TMA on the up projection; audited without")
        if down_config is not None:
            down_config = dict(down_config)
            if down_config.pop("USE_TMA", False):
                notes.append("tuned config asks for TMA on the down projection; audited without")

        invoke = kernels.invoke_fused_moe_kernel
        invoke_sig = inspect.signature(invoke).parameters
        if p["bias"] and "bias" not in invoke_sig:
            notes.append("this release's MoE kernel takes no bias")
        hidden = torch.empty(M, H, dtype=torch.bfloat16, **meta)
        topk_weights = torch.empty(M, topk, dtype=torch.float32, **meta)
        topk_ids = torch.empty(M, topk, dtype=torch.int32, **meta)

        def routing(block_m: int):
            padded = M * topk + E * (block_m - 1)
            return (
                torch.empty(padded, dtype=torch.int32, **meta),
                torch.empty(-(-padded // block_m), dtype=torch.int32, **meta),
                torch.empty(1, dtype=torch.int32, **meta),
            )

        def scales(w):
            if not fp8:
                return None
            if quant == "fp8":
                return torch.empty(E, dtype=torch.float32, **meta)
            if per_channel:
                return torch.empty(E, w.shape[1], 1, dtype=torch.float32, **meta)
            bn, bk = block_shape
            return torch.empty(E, -(-w.shape[1] // bn), -(-w.shape[2] // bk), dtype=torch.float32, **meta)

        if quant in ("fp8", "fp8_channel") and hasattr(kernels, "scaled_fp8_quant"):
            # SGLang quantizes activations per tensor (or per token) with an sgl_kernel CUDA op (no CPU
            # build): this stand-in returns tensors of that op's shapes and dtypes and runs nothing.
            def tensor_quant(A, A_scale=None, *args, use_per_token_if_dynamic=False, **kw):
                rows = A.shape[0] if use_per_token_if_dynamic else 1
                scale = A_scale if A_scale is not None else torch.empty(rows, 1, dtype=torch.float32, device=A.device)
                return torch.empty_like(A, dtype=torch.float8_e4m3fn), scale

            kernels.scaled_fp8_quant = tensor_quant

        common = {
            "compute_type": tl.bfloat16,
            "use_fp8_w8a8": fp8,
            "use_int8_w8a8": False,
            "use_int8_w8a16": False,
            "use_int4_w4a16": False,
            "per_channel_quant": per_channel,
            "block_shape": block_shape,
            "B_zp": None,
            "A_scale": None,
        }
        up_routing = routing(config["BLOCK_SIZE_M"])
        _call(
            invoke,
            dict(
                common,
                A=hidden,
                B=w1,
                bias=torch.empty(E, 2 * inter, dtype=torch.bfloat16, **meta) if p["bias"] else None,
                C=torch.empty(M, topk, 2 * inter, dtype=torch.bfloat16, **meta),
                B_scale=scales(w1),
                topk_weights=topk_weights,
                topk_ids=topk_ids,
                sorted_token_ids=up_routing[0],
                expert_ids=up_routing[1],
                num_tokens_post_padded=up_routing[2],
                mul_routed_weight=False,
                top_k=topk,
                config=config,
            ),
        )
        down = down_config or config
        down_routing = routing(down["BLOCK_SIZE_M"]) if down is not config else up_routing
        _call(
            invoke,
            dict(
                common,
                A=torch.empty(M * topk, inter, dtype=torch.bfloat16, **meta),
                B=w2,
                bias=torch.empty(E, H, dtype=torch.bfloat16, **meta) if p["bias"] else None,
                C=torch.empty(M, topk, H, dtype=torch.bfloat16, **meta),
                B_scale=scales(w2),
                topk_weights=topk_weights,
                topk_ids=topk_ids,
                sorted_token_ids=down_routing[0],
                expert_ids=down_routing[1],
                num_tokens_post_padded=down_routing[2],
                mul_routed_weight=True,
                top_k=1,
                config=down,
            ),
        )
        return "; ".join(notes) or None


@contextlib.contextmanager
def _device_named(name: str | None, config_module):
    """The faked GPU answers ``name`` to ``torch.cuda.get_device_name()`` while SGLang picks a MoE config
    (its config files are named after the device); SGLang's cache of read config files is emptied before
    and after, so every name reads its own files."""
    import torch

    def clear() -> None:
        reader = getattr(config_module, "get_moe_configs", None)
        if hasattr(reader, "cache_clear"):
            reader.cache_clear()

    clear()
    if name is None:
        yield
        return
    previous = torch.cuda.get_device_name
    torch.cuda.get_device_name = lambda device=None: name
    try:
        yield
    finally:
        torch.cuda.get_device_name = previous
        clear()


def _dtypes(p: dict, sig) -> tuple:
    import torch

    dtype = getattr(torch, p["dtype"])
    if p.get("kv_cache_dtype", "auto") == "auto":
        return dtype, dtype
    if "k_scale" not in sig:
        raise CaseSkipped("this release's launcher has no fp8 KV-cache path (no k_scale argument)")
    return dtype, torch.float8_e4m3fn


def _call(fn, available: dict) -> Any:
    """Call ``fn`` with the arguments of ``available`` it declares; fail if it needs one we lack."""
    params = inspect.signature(fn).parameters
    missing = [
        name
        for name, prm in params.items()
        if prm.default is inspect.Parameter.empty
        and name not in available
        and prm.kind not in (prm.VAR_POSITIONAL, prm.VAR_KEYWORD)
    ]
    if missing:
        raise RuntimeError(
            f"{fn.__module__}.{fn.__name__} needs argument(s) {', '.join(missing)} that the "
            "audit does not know how to build for this release"
        )
    return fn(**{name: value for name, value in available.items() if name in params})


def _where(exc: BaseException) -> str:
    """`` (at sglang/.../file.py:123)``: the innermost SGLang frame, for errors with a terse message."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        parts = Path(frame.filename).parts
        if "sglang" in parts:
            index = len(parts) - 1 - parts[::-1].index("sglang")
            return f" (at {'/'.join(parts[index:])}:{frame.lineno})"
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


@functools.cache
def _resource_usage(binary: bytes, tool: str | None = None):
    """:func:`sm120kit.hardware.cubin.resource_usage`, read once per cubin: the cases of a probe launch the
    same kernels many times (one shape, several batch sizes), and each read starts cuobjdump."""
    from sm120kit.hardware import cubin

    return cubin.resource_usage(binary, tool)


def _kernel_json(record, usage) -> dict:
    regs = None
    if usage:
        match = usage.get(record.name) or next(iter(usage.values()), None)
        regs = match.registers if match else None
    return {
        "name": record.name,
        "module": record.module,
        "constexprs": record.constexprs,
        "num_warps": record.num_warps,
        "num_stages": record.num_stages,
        "shared": record.shared,
        "target": record.target,
        "hash": record.hash,
        "registers": regs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120kit.audit.kernel_probe")
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--arch", required=True)
    parser.add_argument("--cases", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--policy", type=Path)
    args = parser.parse_args(argv)

    root = args.root.resolve()
    if str(root) not in sys.path[:1]:
        sys.path.insert(0, str(root))
    from sm120kit.hardware import cubin
    from sm120kit.hardware.fake_device import faked_cuda, faked_triton_target, preset, stand_in_packages

    cases = json.loads(args.cases.read_text())
    policy = json.loads(args.policy.read_text()) if args.policy else {}
    device = preset(args.arch)
    tool = cubin.find_cuobjdump()
    probe = Probe(root, policy)
    probe.arch = args.arch
    results: dict[str, dict] = {}
    started = time.perf_counter()
    with faked_cuda(device), faked_triton_target(device) as recorder, stand_in_packages() as stood_in:
        for case in cases:
            entry: dict[str, Any] = {"status": "ok", "kernels": [], "error": None, "note": None}
            case_start = time.perf_counter()
            try:
                entry["note"] = probe.run(case["launcher"], case["params"])
            except CaseSkipped as exc:
                entry.update(status="skipped", note=str(exc))
            except ImportFailed as exc:
                entry.update(status="import-error", error=str(exc), missing=exc.missing)
            except Exception as exc:  # noqa: BLE001 - a compile error is a finding, not a crash
                lines = [ln for ln in traceback.format_exception_only(type(exc), exc) if ln.strip()]
                entry.update(status="compile-error", error=("".join(lines).strip() + _where(exc))[-2000:])
            seen: set[str] = set()
            for record in recorder.take():
                if record.hash in seen:
                    continue
                seen.add(record.hash)
                entry["kernels"].append(_kernel_json(record, _resource_usage(record.cubin, tool) if tool else None))
            entry["kernels"] += probe.cuda_kernels
            probe.cuda_kernels = []
            entry["seconds"] = round(time.perf_counter() - case_start, 3)
            results[case["id"]] = entry
            print(DONE_MARK + case["id"], flush=True)
    args.out.write_text(
        json.dumps(
            {
                "arch": args.arch,
                "device": device.name,
                "stood_in": list(stood_in),
                "register_reader": tool,
                "seconds": round(time.perf_counter() - started, 3),
                "cases": results,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
