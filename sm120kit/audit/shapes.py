"""The shape matrix of the shared-memory audit: which models' shapes each launcher is compiled for.

The matrix is data (``audit_matrix.toml`` beside this module); a user adds models with ``--matrix FILE``.
:func:`load_matrix` reads and checks it and :func:`expand` turns it into :class:`ProbeCase` items, one per
launcher call the probe makes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120kit.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_MATRIX = Path(__file__).with_name("audit_matrix.toml")

ATTENTION_LAUNCHERS = ("extend", "decode", "prefill", "ds-extend", "tree-verify", "mla-decode", "lightning")
GROUPED_MOE_LAUNCHERS = ("inkling-moe",)
GROUPED_MOE_DTYPES = ("bfloat16", "float32")
BATCHED_LAUNCHERS = ("decode", "mla-decode")  # cases per entry of decode_batch_sizes
DTYPES = ("bfloat16", "float16", "float32")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
QUANTIZATIONS = ("bf16", "fp8_block", "fp8", "fp8_channel")  # fp8: per tensor; fp8_channel: per channel
DEFAULT_QUANTIZATIONS = ("bf16", "fp8_block")
FP8_BLOCK = (128, 128)


@dataclass(frozen=True)
class AttentionModel:
    name: str
    description: str
    qk_head_dim: int
    v_head_dim: int
    num_heads: int
    num_kv_heads: int
    launchers: tuple[str, ...]
    dtypes: tuple[str, ...] = ("bfloat16", "float16")
    kv_cache_dtypes: tuple[str, ...] = ("auto",)
    decode_batch_sizes: tuple[int, ...] = (4,)
    source: str = ""

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


@dataclass(frozen=True)
class MoeModel:
    name: str
    description: str
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    bias: bool = False
    quantizations: tuple[str, ...] = DEFAULT_QUANTIZATIONS
    tokens: tuple[int, ...] = (16, 4096)
    source: str = ""


@dataclass(frozen=True)
class GroupedMoeModel:
    """A MoE whose experts run through a grouped GEMM launcher of its own (Inkling's), not fused MoE."""

    name: str
    description: str
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    launchers: tuple[str, ...] = GROUPED_MOE_LAUNCHERS
    dtypes: tuple[str, ...] = ("bfloat16",)
    tokens: tuple[int, ...] = (16, 4096)
    source: str = ""


@dataclass(frozen=True)
class ShapeMatrix:
    """The audit's shape matrix: the model shapes (attention, MoE, grouped MoE) the launchers are probed with,
    and the files they came from."""

    attention: tuple[AttentionModel, ...]
    moe: tuple[MoeModel, ...]
    files: tuple[str, ...]
    grouped_moe: tuple[GroupedMoeModel, ...] = ()

    def names(self) -> list[str]:
        return [m.name for m in self.attention] + [m.name for m in self.moe] + [m.name for m in self.grouped_moe]

    def launchers_of(self, name: str) -> tuple[str, ...]:
        """The launchers the entry ``name`` runs (empty for an unknown name)."""
        for model in self.attention + self.grouped_moe:
            if model.name == name:
                return model.launchers
        return ("moe",) if any(m.name == name for m in self.moe) else ()


@dataclass(frozen=True)
class ProbeCase:
    """One launcher call: ``launcher`` with ``params`` (JSON-friendly) for model ``model``."""

    launcher: str  # extend | decode | prefill | moe
    model: str
    params: dict[str, Any] = field(hash=False)

    @property
    def id(self) -> str:
        p = self.params
        if self.launcher == "moe":
            text = f"moe/{self.model}/{p['quantization']}/M={p['tokens']}"
            if p.get("device_name"):
                text += f"/device={p['device_name'].replace(' ', '_')}"
            return text
        if self.launcher in GROUPED_MOE_LAUNCHERS:
            return f"{self.launcher}/{self.model}/{p['dtype']}/M={p['tokens']}"
        text = f"{self.launcher}/{self.model}/{p['dtype']}"
        if p.get("kv_cache_dtype", "auto") != "auto":
            text += f"/kv={p['kv_cache_dtype']}"
        if self.launcher in BATCHED_LAUNCHERS:
            text += f"/bs={p['batch_size']}"
        return text

    @property
    def shape(self) -> str:
        """A short human description of the shape."""
        p = self.params
        if self.launcher == "moe":
            text = (
                f"E={p['num_experts']} top{p['top_k']} H={p['hidden_size']} I={p['intermediate_size']} "
                f"M={p['tokens']} {p['quantization']}"
            )
            if p.get("device_name"):
                text += f" as {p['device_name'].removeprefix('NVIDIA ')}"
            return text
        if self.launcher in GROUPED_MOE_LAUNCHERS:
            return (
                f"E={p['num_experts']} top{p['top_k']} H={p['hidden_size']} I={p['intermediate_size']} "
                f"M={p['tokens']} {_short(p['dtype'])}"
            )
        dims = str(p["qk_head_dim"]) if p["qk_head_dim"] == p["v_head_dim"] else f"{p['qk_head_dim']}/{p['v_head_dim']}"
        text = f"hd {dims} h {p['num_heads']}/{p['num_kv_heads']} {_short(p['dtype'])}"
        if p.get("kv_cache_dtype", "auto") != "auto":
            text += f" kv {p['kv_cache_dtype']}"
        if self.launcher in BATCHED_LAUNCHERS:
            text += f" bs {p['batch_size']}"
        return text

    def to_json(self) -> dict:
        return {"id": self.id, "launcher": self.launcher, "model": self.model, "params": self.params}

    def key_text(self) -> str:
        return json.dumps({"launcher": self.launcher, "params": self.params}, sort_keys=True)


def _short(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)


# -- reading ---------------------------------------------------------------------------------------------


class _Entry:
    """Typed access to one table of the matrix, with errors naming the file, entry and field."""

    def __init__(self, data: dict, where: str) -> None:
        self.data = data
        self.where = where
        self.used: set[str] = set()

    def fail(self, text: str) -> UsageError:
        return UsageError(
            f"{self.where}: {text}",
            hint="Fix the entry (field reference at the top of sm120kit/audit/audit_matrix.toml).",
        )

    def get(self, name: str, kind: type, default: Any = ..., choices: Iterable | None = None) -> Any:
        self.used.add(name)
        if name not in self.data:
            if default is ...:
                raise self.fail(f"the field '{name}' is missing.")
            return default
        value = self.data[name]
        if kind is tuple:
            if not isinstance(value, list) or not value:
                raise self.fail(f"'{name}' must be a non-empty list, not {value!r}.")
            for item in value:
                if choices is not None and item not in choices:
                    raise self.fail(f"'{name}' holds {item!r}; expected one of {', '.join(map(str, choices))}.")
            return tuple(value)
        if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise self.fail(f"'{name}' must be a positive integer, not {value!r}.")
        if kind is bool and not isinstance(value, bool):
            raise self.fail(f"'{name}' must be true or false, not {value!r}.")
        if kind is str and not isinstance(value, str):
            raise self.fail(f"'{name}' must be a string, not {value!r}.")
        return value

    def check_unknown(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self.fail(f"unknown field(s) {', '.join(unknown)}.")


def _attention(entry: _Entry, source: str) -> AttentionModel:
    qk = entry.get("qk_head_dim", int)
    model = AttentionModel(
        name=entry.get("name", str),
        description=entry.get("description", str, ""),
        qk_head_dim=qk,
        v_head_dim=entry.get("v_head_dim", int, qk),
        num_heads=entry.get("num_heads", int),
        num_kv_heads=entry.get("num_kv_heads", int),
        launchers=entry.get("launchers", tuple, choices=ATTENTION_LAUNCHERS),
        dtypes=entry.get("dtypes", tuple, ("bfloat16", "float16"), choices=DTYPES),
        kv_cache_dtypes=entry.get("kv_cache_dtypes", tuple, ("auto",), choices=KV_CACHE_DTYPES),
        decode_batch_sizes=entry.get("decode_batch_sizes", tuple, (4,)),
        source=source,
    )
    entry.check_unknown()
    if model.num_heads % model.num_kv_heads:
        raise entry.fail(f"num_heads ({model.num_heads}) must be a multiple of num_kv_heads ({model.num_kv_heads}).")
    if any(not isinstance(b, int) or b <= 0 for b in model.decode_batch_sizes):
        raise entry.fail("'decode_batch_sizes' must hold positive integers.")
    return model


def _moe_shape(entry: _Entry) -> dict:
    """The fields [[moe]] and [[grouped_moe]] entries share, read in their order."""
    return dict(
        name=entry.get("name", str),
        description=entry.get("description", str, ""),
        num_experts=entry.get("num_experts", int),
        top_k=entry.get("top_k", int),
        hidden_size=entry.get("hidden_size", int),
        intermediate_size=entry.get("intermediate_size", int),
    )


def _checked_moe(entry: _Entry, model):
    """``model`` (a MoeModel or GroupedMoeModel) once the entry has no unknown field and its numbers agree."""
    entry.check_unknown()
    if model.top_k > model.num_experts:
        raise entry.fail(f"top_k ({model.top_k}) is larger than num_experts ({model.num_experts}).")
    if any(not isinstance(t, int) or t <= 0 for t in model.tokens):
        raise entry.fail("'tokens' must hold positive integers.")
    return model


def _moe(entry: _Entry, source: str) -> MoeModel:
    model = MoeModel(
        **_moe_shape(entry),
        bias=entry.get("bias", bool, False),
        quantizations=entry.get("quantizations", tuple, DEFAULT_QUANTIZATIONS, choices=QUANTIZATIONS),
        tokens=entry.get("tokens", tuple, (16, 4096)),
        source=source,
    )
    return _checked_moe(entry, model)


def _grouped_moe(entry: _Entry, source: str) -> GroupedMoeModel:
    model = GroupedMoeModel(
        **_moe_shape(entry),
        launchers=entry.get("launchers", tuple, GROUPED_MOE_LAUNCHERS, choices=GROUPED_MOE_LAUNCHERS),
        dtypes=entry.get("dtypes", tuple, ("bfloat16",), choices=GROUPED_MOE_DTYPES),
        tokens=entry.get("tokens", tuple, (16, 4096)),
        source=source,
    )
    return _checked_moe(entry, model)


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"The matrix file {path} does not exist.") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}.") from None


def load_matrix(extra: Iterable[str | Path] = (), *, include_default: bool = True) -> ShapeMatrix:
    """The packaged matrix plus ``extra`` files (an entry named like an earlier one replaces it)."""
    paths = ([DEFAULT_MATRIX] if include_default else []) + [Path(p) for p in extra]
    attention: dict[str, AttentionModel] = {}
    moe: dict[str, MoeModel] = {}
    grouped: dict[str, GroupedMoeModel] = {}
    for path in paths:
        data = _read(path)
        unknown = sorted(set(data) - {"attention", "moe", "grouped_moe"})
        if unknown:
            raise UsageError(
                f"{path}: unknown table(s) {', '.join(unknown)}; expected [[attention]], [[moe]] and [[grouped_moe]]."
            )
        for index, table in enumerate(data.get("grouped_moe", [])):
            model = _grouped_moe(_Entry(table, f"{path} [[grouped_moe]] #{index + 1}"), str(path))
            grouped[model.name] = model
        for index, table in enumerate(data.get("attention", [])):
            model = _attention(_Entry(table, f"{path} [[attention]] #{index + 1}"), str(path))
            attention[model.name] = model
        for index, table in enumerate(data.get("moe", [])):
            model = _moe(_Entry(table, f"{path} [[moe]] #{index + 1}"), str(path))
            moe[model.name] = model
    return ShapeMatrix(
        tuple(attention.values()), tuple(moe.values()), tuple(str(p) for p in paths), tuple(grouped.values())
    )


def select(matrix: ShapeMatrix, names: Iterable[str]) -> ShapeMatrix:
    """Only the entries named ``names`` (a UsageError names any unknown one)."""
    wanted = list(names)
    if not wanted:
        return matrix
    unknown = [n for n in wanted if n not in matrix.names()]
    if unknown:
        raise UsageError(
            f"No matrix entry named {', '.join(unknown)}.", hint=f"Known entries: {', '.join(matrix.names())}."
        )
    return ShapeMatrix(
        tuple(m for m in matrix.attention if m.name in wanted),
        tuple(m for m in matrix.moe if m.name in wanted),
        matrix.files,
        tuple(m for m in matrix.grouped_moe if m.name in wanted),
    )


# -- expansion -------------------------------------------------------------------------------------------


def expand(matrix: ShapeMatrix, *, launchers: Iterable[str] | None = None) -> list[ProbeCase]:
    """Every launcher call of the matrix, in a stable order."""
    allowed = set(launchers) if launchers else None
    cases: list[ProbeCase] = []
    for model in matrix.attention:
        base = {
            "qk_head_dim": model.qk_head_dim,
            "v_head_dim": model.v_head_dim,
            "num_heads": model.num_heads,
            "num_kv_heads": model.num_kv_heads,
        }
        for launcher in model.launchers:
            if allowed is not None and launcher not in allowed:
                continue
            for dtype in model.dtypes:
                kv_dtypes = (
                    model.kv_cache_dtypes if launcher not in ("prefill", "ds-extend", "lightning") else ("auto",)
                )
                for kv in kv_dtypes:
                    batches = model.decode_batch_sizes if launcher in BATCHED_LAUNCHERS else (None,)
                    for batch in batches:
                        params = dict(base, dtype=dtype, kv_cache_dtype=kv)
                        if batch is not None:
                            params["batch_size"] = batch
                        cases.append(ProbeCase(launcher, model.name, params))
    if allowed is None or "moe" in allowed:
        for moe in matrix.moe:
            for quant in moe.quantizations:
                for tokens in moe.tokens:
                    cases.append(
                        ProbeCase(
                            "moe",
                            moe.name,
                            {
                                "num_experts": moe.num_experts,
                                "top_k": moe.top_k,
                                "hidden_size": moe.hidden_size,
                                "intermediate_size": moe.intermediate_size,
                                "bias": moe.bias,
                                "quantization": quant,
                                "tokens": tokens,
                                "block_shape": list(FP8_BLOCK) if quant == "fp8_block" else None,
                            },
                        )
                    )
    for model in matrix.grouped_moe:
        for launcher in model.launchers:
            if allowed is not None and launcher not in allowed:
                continue
            for dtype in model.dtypes:
                for tokens in model.tokens:
                    cases.append(
                        ProbeCase(
                            launcher,
                            model.name,
                            {
                                "num_experts": model.num_experts,
                                "top_k": model.top_k,
                                "hidden_size": model.hidden_size,
                                "intermediate_size": model.intermediate_size,
                                "dtype": dtype,
                                "tokens": tokens,
                            },
                        )
                    )
    return cases
