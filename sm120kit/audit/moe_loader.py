"""Which fused-MoE shapes SGLang's own weight loader refuses, read from the tree being audited.

SGLang's FP8 block-quantized MoE method (``Fp8MoEMethod.create_weights`` in
``sglang/srt/layers/quantization/fp8.py``, every release 0.5.2-0.5.23) raises a ValueError when the
intermediate size per partition is not a multiple of the weight block's ``block_n`` ("The output_size of
gate's and up's weight = ... is not divisible by weight quantization block_n = ..."), and, with tensor
parallelism (``tp_size > 1``), when it is not a multiple of ``block_k``. A model with such a shape never
loads, so its fused-MoE kernels are never launched: an audit case of that shape (a tuned config file named
``E=128,N=192,...,block_shape=[128, 128]``, a matrix entry) is not applicable, not a compile error. The
launcher would fail on it anyway (its scale-shape assertion ``cdiv(K, block_k) == A_scale.shape[-1]``
does not hold when K = 192 and block_k = 128).

The rule is SGLang's, read from the tree: the checks are found in the tree's ``fp8.py`` by their text,
with the line they are on. A tree that does not have them (a later release that drops the check) gets no
not-applicable verdict: its cases run, and what the launcher does is the finding. The file is read as
untrusted input: a regular file inside the tree, of bounded size, matched with bounded patterns.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

FP8_METHOD_FILE = "sglang/srt/layers/quantization/fp8.py"
_MAX_BYTES = 8 << 20  # fp8.py is 0.1-0.2 MB in every release; anything far larger is not SGLang's file

_CHECK = (
    r"(?m)^(?P<indent>[ \t]{0,40})if[ \t]+intermediate_size(?:_per_partition)?[ \t]*%[ \t]*NAME"
    r"[ \t]*!=[ \t]*0[ \t]*:"
)
_BLOCK_N = re.compile(_CHECK.replace("NAME", "block_n"))
_BLOCK_K = re.compile(_CHECK.replace("NAME", "block_k"))
_TP_GUARD = re.compile(r"(?m)^(?P<indent>[ \t]{0,40})if[ \t]+tp_size[ \t]*>[ \t]*1[ \t]*:")


@dataclass(frozen=True)
class LoaderRule:
    """SGLang's divisibility checks of the FP8 block-quantized MoE loader, as found in one tree."""

    path: str  # "sglang/srt/layers/quantization/fp8.py"
    block_n_line: int
    block_k_line: int | None  # None: the tree has no block_k check
    block_k_needs_tp: bool  # the block_k check sits under "if tp_size > 1:"

    def rejection(self, intermediate_size: int, block_shape) -> str | None:
        """Why SGLang's loader refuses a MoE layer of this intermediate size per partition and weight block
        (None: it loads it, or the shape is not block-quantized)."""
        if not block_shape:
            return None
        block_n, block_k = int(block_shape[0]), int(block_shape[1])
        if block_n > 0 and intermediate_size % block_n:
            return (
                f"SGLang's FP8 block-quantized MoE loader refuses an intermediate size per "
                f"partition of {intermediate_size}, not a multiple of block_n = {block_n} (it raises "
                f"ValueError at {self.path}:{self.block_n_line}, Fp8MoEMethod.create_weights), so no model "
                "of this shape loads and its MoE kernels are never launched"
            )
        if self.block_k_line is not None and not self.block_k_needs_tp and block_k > 0 and intermediate_size % block_k:
            return (
                f"SGLang's FP8 block-quantized MoE loader refuses an intermediate size per "
                f"partition of {intermediate_size}, not a multiple of block_k = {block_k} (it raises "
                f"ValueError at {self.path}:{self.block_k_line}, Fp8MoEMethod.create_weights)"
            )
        return None

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "block_n_line": self.block_n_line,
            "block_k_line": self.block_k_line,
            "block_k_needs_tp": self.block_k_needs_tp,
        }


def _read(root: Path) -> str | None:
    """The tree's fp8.py, or None when it is absent, not a regular file, a link, or implausibly large."""
    path = Path(root) / FP8_METHOD_FILE
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_BYTES:
        return None
    try:
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(path, flags)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(_MAX_BYTES + 1)
    if len(data) > _MAX_BYTES:
        return None
    return data.decode("utf-8", errors="replace")


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def fp8_block_rule(root: Path) -> LoaderRule | None:
    """The loader rule of the tree whose ``sglang/`` package lies in ``root``; None where the tree's fp8.py
    does not hold SGLang's block_n check (then no case is ruled out)."""
    text = _read(root)
    if text is None:
        return None
    found_n = _BLOCK_N.search(text)
    if found_n is None:
        return None
    found_k = _BLOCK_K.search(text, found_n.end())
    needs_tp = False
    if found_k is not None:
        # The nearest "if tp_size > 1:" above the block_k check, indented less than it, guards it.
        guards = [
            g
            for g in _TP_GUARD.finditer(text, found_n.end(), found_k.start())
            if len(g.group("indent").expandtabs()) < len(found_k.group("indent").expandtabs())
        ]
        needs_tp = bool(guards)
    return LoaderRule(
        FP8_METHOD_FILE,
        _line(text, found_n.start() + len(found_n.group("indent"))),
        None if found_k is None else _line(text, found_k.start() + len(found_k.group("indent"))),
        needs_tp,
    )


__all__ = ["LoaderRule", "fp8_block_rule", "FP8_METHOD_FILE"]
