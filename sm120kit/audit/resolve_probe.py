"""Run SGLang's own server-argument resolution under a faked GPU; print what it chose.

This module is a program: ``python -m sm120kit.audit.resolve_probe REQUEST.json RESULT.jsonl``, started
by :mod:`sm120kit.audit.backends` through :func:`sm120kit.runner.run` with ``PYTHONPATH`` set to
the folder holding the SGLang tree's ``sglang/`` package, so the tree's own code is imported. It never
imports sglang in the calling process.

One interpreter serves one (tree, flashinfer, deep_gemm) combination and one or more capabilities. SGLang
reads the device and the installed kernel libraries once, at import, so each capability imports SGLang in a
process of its own, forked after the imports that do not depend on the device (torch, transformers, Triton:
:data:`SHARED_IMPORTS`) are loaded once; each model (and each set of extra arguments) is then resolved in a
child of that process made by ``os.fork`` so that module-level state one resolution writes (environment
flags, global server arguments, caches) never reaches the next, nor another capability.

What stands in for what this machine lacks, and only that:

* the GPU: :func:`sm120kit.hardware.fake_device.faked_cuda` (torch reports the faked device), and
  ``nvidia-smi`` queries for total memory, compute capability and the GPU list, answered from the same
  faked device;
* ``sgl_kernel`` and ``torchvision`` when they cannot be imported here (their compiled libraries need
  CUDA); ``flashinfer`` and ``deep_gemm`` likewise when the request says the library is installed. The
  stand-ins are :func:`sm120kit.hardware.fake_device.stand_in_packages`: every attribute exists, calling one
  raises; each one used is named in the result.
  A request that says a library is absent makes it unimportable (``import`` fails, ``find_spec`` is None).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

# Libraries whose compiled parts need CUDA: stood in for when they cannot be imported here.
ALWAYS_STAND_IN = ("sgl_kernel", "torchvision")  # sm120kit.hardware.fake_device.STAND_IN_PACKAGES
# Libraries whose presence changes SGLang's choices: the request says whether they are installed.
OPTIONAL_LIBRARIES = ("flashinfer", "deep_gemm")

CHILD_TIMEOUT_S = 180

# Server-argument fields read after resolution (absent ones are skipped: they vary by release).
RAW_FIELDS = (
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "mm_attention_backend",
    "sampling_backend",
    "moe_runner_backend",
    "moe_a2a_backend",
    "fp8_gemm_runner_backend",
    "fp4_gemm_runner_backend",
    "linear_attn_backend",
    "linear_attn_decode_backend",
    "linear_attn_prefill_backend",
    "mamba_backend",
    "quantization",
    "kv_cache_dtype",
    "dtype",
    "speculative_algorithm",
    "enable_flashinfer_mla",
    "enable_flashmla",
    "enable_ep_moe",
    "enable_deepep_moe",
    "enable_flashinfer_cutlass_moe",
    "enable_flashinfer_trtllm_moe",
    "enable_flashinfer_mxfp4_moe",
    "enable_triton_kernel_moe",
    "disable_cuda_graph",
    "page_size",
    "chunked_prefill_size",
    "triton_attention_num_kv_splits",
)

# Imported by resolution in every release that has them; preloaded in the parent (missing ones skipped).
PRELOAD = (
    "sglang.srt.configs.model_config",
    "sglang.srt.arg_groups.pipeline",
    "sglang.srt.layers.quantization",
    "sglang.srt.layers.deep_gemm_wrapper.configurer",
    "sglang.srt.layers.quantization.deep_gemm_wrapper.configurer",
)

# Where the DeepGEMM switch lives, by release (module, attribute).
DEEP_GEMM_SWITCHES = (
    ("sglang.srt.layers.deep_gemm_wrapper.configurer", "ENABLE_JIT_DEEPGEMM"),
    ("sglang.srt.layers.quantization.deep_gemm_wrapper.configurer", "ENABLE_JIT_DEEPGEMM"),
    ("sglang.srt.layers.quantization.deep_gemm", "_ENABLE_JIT_DEEPGEMM"),
)


# -- libraries this machine cannot import ----------------------------------------------------------------------


def install_libraries(flashinfer: bool, deep_gemm: bool, stack: contextlib.ExitStack) -> tuple[list[str], dict]:
    """Decide, per library, real / stand-in / absent; returns (stand-in notes, library states).

    Stand-ins come from :func:`sm120kit.hardware.fake_device.stand_in_packages` (placeholders that import and
    subclass but raise when called). A library the request says is absent becomes unimportable
    (``sys.modules[name] = None``: ``import`` fails and ``importlib.util.find_spec`` returns None)."""
    from sm120kit.hardware.fake_device import stand_in_packages

    wanted = {"flashinfer": flashinfer, "deep_gemm": deep_gemm}
    states: dict[str, str] = {}
    for name, present in wanted.items():
        if not present:
            for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                del sys.modules[key]
            sys.modules[name] = None  # type: ignore[assignment]
            states[name] = "absent"
    names = ALWAYS_STAND_IN + tuple(n for n in OPTIONAL_LIBRARIES if wanted[n])
    stood_in = stack.enter_context(stand_in_packages(names))
    notes = []
    for name in names:
        states[name] = "stand-in" if name in stood_in else "installed"
        if name in stood_in:
            notes.append(f"{name} (stand-in: not importable here)")
    return notes, states


# -- nvidia-smi answered from the faked device ----------------------------------------------------------------


def _fake_nvidia_smi(device, argv: list[str]) -> str | None:
    args = " ".join(argv[1:])
    if "memory.total" in args:
        return f"{device.total_memory // (1024 * 1024)}\n"
    if "compute_cap" in args:
        return f"{device.capability[0]}.{device.capability[1]}\n"
    if "--list-gpus" in args or args.strip() == "-L":
        return f"GPU 0: {device.name} (UUID: GPU-00000000-0000-0000-0000-000000000000)\n"
    return None


@contextlib.contextmanager
def faked_nvidia_smi(device):
    """``subprocess.run``/``check_output`` of ``nvidia-smi`` answer the faked device's figures for the
    queries SGLang makes while resolving arguments; any other nvidia-smi call behaves as if absent."""
    real_run, real_check_output = subprocess.run, subprocess.check_output

    def is_smi(argv) -> bool:
        first = argv[0] if isinstance(argv, (list, tuple)) and argv else argv
        return isinstance(first, str) and first.split()[0].endswith("nvidia-smi")

    def as_list(argv) -> list[str]:
        return list(argv) if isinstance(argv, (list, tuple)) else str(argv).split()

    def run(argv, *args, **kwargs):
        if is_smi(argv):
            out = _fake_nvidia_smi(device, as_list(argv))
            if out is None:
                raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")
            text = kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding")
            return subprocess.CompletedProcess(argv, 0, out if text else out.encode(), "" if text else b"")
        return real_run(argv, *args, **kwargs)

    def check_output(argv, *args, **kwargs):
        if is_smi(argv):
            out = _fake_nvidia_smi(device, as_list(argv))
            if out is None:
                raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")
            text = kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding")
            return out if text else out.encode()
        return real_check_output(argv, *args, **kwargs)

    subprocess.run, subprocess.check_output = run, check_output
    try:
        yield
    finally:
        subprocess.run, subprocess.check_output = real_run, real_check_output


# -- resolution -------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    inner = getattr(value, "value", None)  # enums
    if isinstance(inner, (str, int)):
        return inner
    return str(value)


def _deep_gemm_switch() -> bool | None:
    for module_name, attr in DEEP_GEMM_SWITCHES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # this release keeps it elsewhere
            raise
        if hasattr(module, attr):
            return bool(getattr(module, attr))
    return None


def _classify(exc: BaseException, sglang_dir: str) -> str:
    """ "rejected" when SGLang itself refused the arguments; "not-run" when the environment failed."""
    if isinstance(exc, (ImportError, MemoryError)):
        return "not-run"
    if isinstance(exc, SystemExit):  # argparse: bad or unknown argument
        return "rejected"
    frames = traceback.extract_tb(exc.__traceback__)
    if (
        frames
        and frames[-1].filename.startswith(sglang_dir)
        and isinstance(exc, (AssertionError, ValueError, NotImplementedError, RuntimeError, KeyError, TypeError))
    ):
        # TypeError/KeyError raised inside sglang are usually the environment's fault (a dependency's
        # API changed), so only count them as a rejection when raised by an explicit check.
        if isinstance(exc, (TypeError, KeyError)):
            return "not-run"
        return "rejected"
    return "not-run"


def _read_fields(obj: Any) -> dict:
    raw = {}
    for name in RAW_FIELDS:
        try:
            raw[name] = _plain(getattr(obj, name))
        except Exception:  # noqa: BLE001 - absent in this release, or unreadable mid-resolution
            continue
    return raw


def _partial_server_args(exc: BaseException) -> Any:
    """The ServerArgs record SGLang was resolving when it raised (the innermost frame holding one)."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if type(value).__name__ == "ServerArgs":
                found = value
        tb = tb.tb_next
    return found


def _runner_stage(args: Any) -> str | None:
    """Releases up to 0.5.6 pick the default attention backend in ``ModelRunner.model_specific_adjustment``
    (which runs when a GPU worker starts), not in ServerArgs. Run that method of SGLang's own ModelRunner
    on the resolved arguments, with the attributes it reads computed the way ModelRunner computes them."""
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.model_executor.model_runner import ModelRunner

    if not hasattr(ModelRunner, "model_specific_adjustment"):
        return None
    model_config = ModelConfig.from_server_args(args)
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        spec = SpeculativeAlgorithm.from_string(args.speculative_algorithm)
    except Exception:  # noqa: BLE001 - only some releases read it
        spec = None
    runner = types.SimpleNamespace(
        server_args=args,
        model_config=model_config,
        use_mla_backend=model_config.attention_arch == AttentionArch.MLA,
        is_multimodal=getattr(model_config, "is_multimodal", False),
        is_multimodal_chunked_prefill_supported=getattr(model_config, "is_multimodal_chunked_prefill_supported", False),
        tp_size=getattr(args, "tp_size", 1),
        dp_size=getattr(args, "dp_size", 1),
        moe_ep_size=getattr(args, "ep_size", 1),
        mem_fraction_static=getattr(args, "mem_fraction_static", 0.9),
        spec_algorithm=spec,
    )
    ModelRunner.model_specific_adjustment(runner)
    return "ModelRunner.model_specific_adjustment"


def given_arguments(argv: list[str]) -> dict | None:
    """The server arguments ``argv`` sets explicitly, read by SGLang's own parser with every default
    suppressed ({destination: value}); None when the parser cannot be built or rejects the line."""
    import argparse

    try:
        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser(prog="sglang", add_help=False, exit_on_error=False)
        ServerArgs.add_cli_args(parser)
        for action in parser._actions:
            action.default = argparse.SUPPRESS
            action.required = False
        with contextlib.redirect_stderr(io.StringIO()):
            namespace, _ = parser.parse_known_args(argv)
    except BaseException:  # noqa: BLE001 - the resolution below reports a bad line
        return None
    return {
        k: _plain(v) if not isinstance(v, list) else [_plain(x) for x in v]
        for k, v in vars(namespace).items()
        if k != "model_path"
    }


def _model_config(args: Any) -> tuple[Any, BaseException | None]:
    """SGLang's own ModelConfig of the model (tensor parallel size 1), or (None, why it could not be built).
    Built once per resolution: the attention kind and the Triton decode's split cap both read it."""
    try:
        from sglang.srt.configs.model_config import ModelConfig

        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return ModelConfig.from_server_args(args), None
    except BaseException as exc:  # noqa: BLE001 - the callers fall back (attention kind) or report it (splits)
        return None, exc


def _attention_arch(model_config: Any) -> str | None:
    """SGLang's own reading of the model's attention kind ("MLA", "MHA" ...), where it can be had."""
    if model_config is None:
        return None
    arch = model_config.attention_arch
    return getattr(arch, "name", None) or str(arch)


# -- the Triton decode's maximum KV-split count --------------------------------------------------------------

TRITON_BACKEND_FILE = ("srt", "layers", "attention", "triton_backend.py")
# Module-level code of triton_backend.py that sizes max_kv_splits: the release's MLA cap (sglang #20479,
# 0.5.12 on) and sm120-decode-kv-splits' functions, with the constants they read.
_SPLIT_FUNCTIONS = ("_mla_decode_kv_splits_cap", "_sm120_decode_kv_splits_cap", "_sm120_decode_max_kv_splits")
_SPLIT_CONSTANT_PREFIXES = ("_MLA_DECODE_", "_SM120_DECODE_")


def split_cap_functions(source: str, filename: str = "triton_backend.py") -> dict:
    """The split-cap functions and constants of a ``triton_backend.py`` source, executed from that source
    (with the module-level imports they name) in a namespace of their own; absent ones are missing."""
    import ast

    tree = ast.parse(source)
    keep = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name in _SPLIT_FUNCTIONS)
        or (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id.startswith(_SPLIT_CONSTANT_PREFIXES) for t in node.targets)
        )
    ]
    used = {n.id for node in keep for n in ast.walk(node) if isinstance(n, ast.Name)}
    used |= {
        n.value.id
        for node in keep
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    namespace: dict = {"__name__": "sm120kit_triton_backend_caps"}
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        names = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
        if not names:
            continue
        node = ast.copy_location(type(node)(**{**{f: getattr(node, f) for f in node._fields}, "names": names}), node)
        with contextlib.suppress(Exception):
            exec(
                compile(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[])), filename, "exec"),
                namespace,
            )
    exec(compile(ast.Module(body=keep, type_ignores=[]), filename, "exec"), namespace)
    return namespace


def _sm120_mla_decode_name(source: str, sglang_dir: str) -> str:
    """The name the backend's decode launcher carries: sm120-mla-attention wraps it on 12.x (its own
    ``enabled()`` decides); otherwise the release's ``decode_attention_fwd``."""
    import re

    found = re.search(r"from (sglang\.[\w.]+) import sm120_mla\b", source)
    if not found or "sm120_mla.install(" not in source:
        return "decode_attention_fwd"
    import torch

    module = importlib.import_module(found.group(1) + ".sm120_mla")
    return "decode_attention_fwd_sm120" if module.enabled(torch.device("cuda", 0)) else "decode_attention_fwd"


def _sliding_window(model_config: Any) -> int | None:
    config = getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or window <= 0 or getattr(config, "use_sliding_window", True) is False:
        return None
    return window


def triton_decode_splits(
    model_config: Any, raw: dict, sglang_dir: str, config_error: BaseException | None = None
) -> dict | None:
    """The Triton decode's maximum KV-split count this tree's TritonAttnBackend would set on the faked
    device, with the inputs its constructor reads (from SGLang's ModelConfig of the model, tensor
    parallel size 1) and the fp32 attn_logits + attn_lse bytes per decode token that count implies.
    None when decode does not use the Triton backend."""
    decode = raw.get("decode_attention_backend") or raw.get("attention_backend")
    if decode != "triton":
        return None
    import types as _types

    if model_config is None:  # SGLang could not read the model: say why with the resolution
        raise config_error or ValueError("no model config")
    import torch
    from sglang.srt.configs.model_config import AttentionArch

    config = model_config
    mla = config.attention_arch == AttentionArch.MLA
    heads = (
        config.get_max_num_attention_heads()
        if hasattr(config, "get_max_num_attention_heads")
        else config.num_attention_heads
    )
    try:
        kv_heads = config.get_num_kv_heads(1)
    except TypeError:
        kv_heads = config.get_num_kv_heads(1, 1)
    # the value buffer's last dim: the latent rank for MLA, the value head dim otherwise
    v_dim = config.kv_lora_rank if mla else (getattr(config, "v_head_dim", None) or config.head_dim)
    window = _sliding_window(config)
    swa_v = getattr(config, "swa_v_head_dim", None)
    swa_v = swa_v if window is not None and swa_v and swa_v != v_dim else None
    context = int(config.context_len)
    try:
        from sglang.srt.utils import get_device_core_count

        sms = int(get_device_core_count(0))
    except Exception:  # noqa: BLE001 - older trees keep it elsewhere
        sms = int(torch.cuda.get_device_properties(0).multi_processor_count)
    configured = int(raw.get("triton_attention_num_kv_splits") or 8)
    path = Path(sglang_dir).joinpath(*TRITON_BACKEND_FILE)
    source = path.read_text(encoding="utf-8")
    ns = split_cap_functions(source, str(path))
    splits, by = configured, "triton_attention_num_kv_splits"
    note = None
    if mla and "_mla_decode_kv_splits_cap" in ns:
        raised = int(ns["_mla_decode_kv_splits_cap"](splits, sms, context))
        if raised != splits:
            splits, by = raised, "_mla_decode_kv_splits_cap"
    if "_sm120_decode_max_kv_splits" in ns:
        launcher = lambda *a, **k: None  # noqa: E731
        launcher.__name__ = _sm120_mla_decode_name(source, sglang_dir)
        backend = _types.SimpleNamespace(
            max_kv_splits=splits,
            device_core_count=sms,
            max_context_len=context,
            num_head=heads,
            num_kv_head=kv_heads,
            v_head_dim=v_dim,
            decode_attention_fwd=launcher,
            static_kv_splits=os.environ.get("SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS", "false").lower()
            in ("1", "true", "yes", "y"),
        )
        if swa_v is not None:
            backend.swa_v_head_dim = swa_v
        raised = int(ns["_sm120_decode_max_kv_splits"](backend, _types.SimpleNamespace(gpu_id=0, use_mla_backend=mla)))
        if raised != splits:
            splits, by = raised, "_sm120_decode_kv_splits_cap"
        elif mla and launcher.__name__ == "decode_attention_fwd_sm120":
            note = "MLA decode runs sm120-mla-attention's kernel, which sizes its own splits"
    row = 4 * heads * ((v_dim + 1) + ((swa_v + 1) if swa_v else 0))
    return {
        "max_kv_splits": splits,
        "configured": configured,
        "source": by,
        "bytes_per_token": row * splits,
        "sm_count": sms,
        "context_len": context,
        "mla": mla,
        "num_head": heads,
        "num_kv_head": kv_heads,
        "v_head_dim": v_dim,
        "swa_v_head_dim": swa_v,
        "sliding_window": window,
        "note": note,
    }


def resolve_job(job: dict, sglang_dir: str) -> dict:
    """Parse and resolve one model's arguments; runs in the forked child."""
    from sglang.srt import server_args as server_args_module

    argv = ["--model-path", job["model"], *job.get("args", [])]
    stage = "parse"
    captured = io.StringIO()
    started = time.perf_counter()
    try:
        with contextlib.redirect_stderr(captured):
            args = server_args_module.prepare_server_args(argv)
        stage = "resolve"
        if hasattr(args, "resolve_once"):
            args.resolve_once()
        method = "ServerArgs.resolve_once" if hasattr(args, "resolve_once") else "ServerArgs.__post_init__"
        view = args
        try:
            from sglang.srt.arg_groups.model_override_base import resolved_view
        except ImportError:
            resolved_view = None
        if resolved_view is not None:
            view = resolved_view(args)
            method += " + resolved_view"
        stage = "model-runner"
        if not any(
            getattr(view, name, None)
            for name in ("attention_backend", "prefill_attention_backend", "decode_attention_backend")
        ):
            extra = _runner_stage(args)
            if extra:
                method += " + " + extra
        stage = "read"
        raw = _read_fields(view)
        deep_gemm = _deep_gemm_switch()
        stage = "read-arguments"
        given = given_arguments(argv)
        model_config, config_error = _model_config(args)
        attention_arch = _attention_arch(model_config)
        stage = "triton-decode-splits"
        try:
            splits = triton_decode_splits(model_config, raw, sglang_dir, config_error)
        except Exception as exc:  # noqa: BLE001 - reported with the resolution, which stands
            splits = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        return {
            "id": job["id"],
            "status": "resolved",
            "raw": raw,
            "deep_gemm": deep_gemm,
            "method": method,
            "given": given,
            "attention_arch": attention_arch,
            "triton_decode": splits,
            "seconds": round(time.perf_counter() - started, 2),
        }
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, none is fatal
        message = str(exc).strip()
        if isinstance(exc, SystemExit):
            usage = captured.getvalue().strip().splitlines()
            message = usage[-1] if usage else f"argument parsing exited with {exc.code}"
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        partial = _partial_server_args(exc)
        result = {
            "id": job["id"],
            "status": _classify(exc, sglang_dir),
            "stage": stage,
            "error_type": type(exc).__name__,
            "error": message[:2000],
            "traceback": tb[-4000:],
            "missing_module": getattr(exc, "name", None) if isinstance(exc, ImportError) else None,
            "seconds": round(time.perf_counter() - started, 2),
        }
        if partial is not None:
            result["partial_raw"] = _read_fields(partial)
        return result


def _run_in_child(job: dict, sglang_dir: str) -> dict:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            import signal

            signal.alarm(CHILD_TIMEOUT_S)
            result = resolve_job(job, sglang_dir)
            data = json.dumps(result, default=str).encode()
        except BaseException as exc:  # noqa: BLE001
            data = json.dumps(
                {
                    "id": job["id"],
                    "status": "not-run",
                    "stage": "probe",
                    "error_type": type(exc).__name__,
                    "error": str(exc),
                }
            ).encode()
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if data:
        return json.loads(data)
    why = (
        f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.WEXITSTATUS(status)}"
    )
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == 14:
        why = f"did not finish within {CHILD_TIMEOUT_S} s"
    return {
        "id": job["id"],
        "status": "not-run",
        "stage": "probe",
        "error_type": "ProbeCrashed",
        "error": f"the resolution process ended without a result ({why})",
    }


# Modules that importing SGLang pulls in and whose import reads neither the device nor the libraries a
# request varies (flashinfer, deep_gemm are settled before): imported once, before the capabilities part, so that
# each capability's SGLang import (in a process of its own) finds them loaded. Missing ones are skipped.
SHARED_IMPORTS = (
    "triton",
    "transformers",
    "transformers.activations",
    "transformers.modeling_layers",
    "transformers.modeling_gguf_pytorch_utils",
    "torch._inductor.compile_fx",
    "torch._dynamo.repro.after_dynamo",
    "compressed_tensors.config",
    "aiohttp",
    "requests",
    "IPython.display",
)


def import_shared() -> list[str]:
    """Import :data:`SHARED_IMPORTS` (those installed); returns the ones that could not be imported."""
    import importlib.util

    failed = []
    for name in SHARED_IMPORTS:
        try:
            if importlib.util.find_spec(name.split(".")[0]) is None:
                continue
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - SGLang's own import reports it where it matters
            failed.append(name)
    return failed


def serve_capability(request: dict, capability: str, jobs: list[dict], notes: list[str], states: dict) -> list[str]:
    """Import the tree's SGLang under the faked ``capability`` device and resolve every job (each in a
    child of its own); returns the JSONL lines of this capability: its header, then one line per job."""
    import torch

    from sm120kit.hardware.fake_device import PRESETS, faked_cuda

    started = time.perf_counter()
    device = PRESETS[capability]
    header = {
        "capability": capability,
        "device": device.name,
        "stand_ins": notes,
        "libraries": states,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
    }

    def lines(results: list[dict]) -> list[str]:
        return [json.dumps({"header": header}, default=str)] + [
            json.dumps({**r, "capability": capability}, default=str) for r in results
        ]

    with faked_cuda(device), faked_nvidia_smi(device):
        try:
            import sglang

            sglang_dir = str(Path(sglang.__file__).resolve().parent)
            header["sglang"] = sglang_dir
            header["sglang_version"] = getattr(sglang, "__version__", None)
            importlib.import_module("sglang.srt.server_args")
            # Modules every resolution imports: loaded once here so that each forked child starts warm.
            for name in PRELOAD:
                with contextlib.suppress(Exception):
                    importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - reported per job
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            failure = {
                "status": "not-run",
                "stage": "import",
                "error_type": type(exc).__name__,
                "error": str(exc)[:2000],
                "traceback": tb[-4000:],
                "missing_module": getattr(exc, "name", None) if isinstance(exc, ImportError) else None,
            }
            header["import_seconds"] = round(time.perf_counter() - started, 2)
            return lines([{"id": job["id"], **failure} for job in jobs])
        header["import_seconds"] = round(time.perf_counter() - started, 2)
        sys.stdout.flush()
        sys.stderr.flush()
        return lines([_run_in_child(job, sglang_dir) for job in jobs])


def _serve_in_child(request: dict, capability: str, notes: list[str], states: dict, out: Path) -> int:
    """Fork a process that serves ``capability`` and writes its lines to ``out``; returns its pid. The
    process importing SGLang under one faked device is thrown away after: nothing it loaded or set reaches
    another capability."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            text = "\n".join(serve_capability(request, capability, request["jobs"], notes, states)) + "\n"
            with open(out, "w", encoding="utf-8") as handle:
                handle.write(text)
        except BaseException:  # noqa: BLE001 - the parent reports the capability as not run
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def main(argv: list[str] | None = None) -> int:
    """``REQUEST.json RESULT.jsonl``. The request names the capabilities (``capabilities``, or one
    ``capability``), the libraries (``flashinfer``, ``deep_gemm``), the jobs and how many capabilities to
    serve at once (``parallel``). The result holds, per capability, a header line and one line per job.
    With several capabilities, each is served in a forked process of its own after :data:`SHARED_IMPORTS`
    are loaded once; a capability whose process ends without a result has no lines (the caller reports it)."""
    args = sys.argv[1:] if argv is None else argv
    request = json.loads(Path(args[0]).read_text())
    out = Path(args[1])
    capabilities = list(request.get("capabilities") or [request["capability"]])

    import torch  # noqa: F401 - loaded before the device is faked, as every capability's import expects

    stack = contextlib.ExitStack()
    notes, states = install_libraries(request.get("flashinfer", True), request.get("deep_gemm", True), stack)
    import_shared()
    if len(capabilities) == 1:
        text = "\n".join(serve_capability(request, capabilities[0], request["jobs"], notes, states)) + "\n"
        out.write_text(text, encoding="utf-8")
        return 0
    parts = [out.with_name(f"{out.name}.{i}") for i in range(len(capabilities))]
    parallel = max(1, int(request.get("parallel") or 1))
    running: dict[int, int] = {}
    for index, capability in enumerate(capabilities):
        while len(running) >= parallel:
            pid, _ = os.wait()
            running.pop(pid, None)
        running[_serve_in_child(request, capability, notes, states, parts[index])] = index
    while running:
        pid, _ = os.wait()
        running.pop(pid, None)
    with open(out, "w", encoding="utf-8") as handle:
        for part in parts:
            if part.is_file():
                handle.write(part.read_text(encoding="utf-8"))
                part.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
