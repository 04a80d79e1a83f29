"""CUDA compiler launcher that keeps only the requested GPU targets on every nvcc command line.

CMake runs ``<launcher...> <nvcc> <args>`` for each CUDA object when ``CMAKE_CUDA_COMPILER_LAUNCHER`` is
set. This script rewrites ``<args>``: every ``-gencode``/``--generate-code``, ``-arch``/
``--gpu-architecture`` and ``-code``/``--gpu-code`` is removed, then

* a translation unit meant to run on 12.x (it names an sm_12x target, a PTX target that a 12.x driver can
  JIT, or no target at all) gets exactly the requested targets, e.g. ``-gencode=arch=compute_120a,
  code=sm_120a``;
* a translation unit whose targets are all for other GPUs (FA3's sm_90a/sm_80 kernels, FlashMLA's
  sm_90a/sm_100f ones: their code has no 12.x path and may not even assemble for sm_120a) is compiled to
  PTX of its first target only (``code=compute_90a``): a valid object that links, at the cost of the
  front end alone (no ptxas), and that SGLang never loads on 12.x.

It then replaces itself (``os.execv``) with ``ccache nvcc ...`` or ``nvcc ...``, so ccache hashes the
filtered command. It is a stand-alone file (standard library only) because it runs once per object inside
the build; sm120kit hands CMake ``[python, this file, --sass=..., --]``. Each decision is appended to the
file named by ``--log`` (one line per object) for the build report.

Usage: ``python nvcc_launcher.py --sass=sm_120a[,sm_121a] [--ccache=PATH] [--log=FILE] -- nvcc ARGS...``
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

_GENCODE = ("-gencode", "--generate-code")
_ARCH = ("-arch", "--gpu-architecture")
_CODE = ("-code", "--gpu-code")
_TARGET_RE = re.compile(r"^(sm|compute|lto)_(\d+)([af]?)$")


@dataclass(frozen=True)
class Decision:
    action: str  # "replaced" | "added" | "foreign-ptx"
    original: tuple[str, ...]  # targets found: "sm_90", "compute_90a", "arch=native" ...
    kept: tuple[str, ...]  # the gencode values now on the command line


def _split_values(text: str) -> list[str]:
    return [v for v in re.split(r"[\s,\[\]]+", text) if v]


def _targets_of_gencode(value: str) -> list[str]:
    """``arch=compute_90a,code=[sm_90a,compute_90a]`` -> ``["sm_90a", "compute_90a"]``."""
    arch = re.search(r"arch=([A-Za-z0-9_-]+)", value)
    code = re.search(r"code=(\[[^\]]*\]|[A-Za-z0-9_,-]+)", value)
    if code:
        return _split_values(code.group(1))
    return [arch.group(1)] if arch else [value]


def _targets_of_arch(value: str) -> list[str]:
    """nvcc's ``-arch=sm_90a`` means ``code=[sm_90a,compute_90a]``; ``compute_X`` means PTX of X."""
    out = []
    for item in _split_values(value):
        m = _TARGET_RE.match(item)
        if m and m.group(1) == "sm":
            out += [item, f"compute_{m.group(2)}{m.group(3)}"]
        elif m:
            out.append(item)
        else:
            out.append(f"arch={item}")  # native / all / all-major
    return out


def _first_virtual(original: list[tuple[str, str]]) -> str | None:
    for flag, value in original:
        if flag in _GENCODE:
            m = re.search(r"arch=(compute_\d+[af]?)", value)
            if m:
                return m.group(1)
        if flag in _ARCH:
            for item in _split_values(value):
                m = _TARGET_RE.match(item)
                if m:
                    return f"compute_{m.group(2)}{m.group(3)}"
    return None


def _runs_on_12x(targets: list[str], min_sm: int) -> bool:
    for target in targets:
        if target.startswith("arch="):
            return True  # native / all: cannot tell; give it the requested targets
        m = _TARGET_RE.match(target)
        if not m:
            continue
        kind, number, variant = m.group(1), int(m.group(2)), m.group(3)
        if number // 10 == 12:
            return True
        if kind == "compute" and not variant and number <= min_sm:
            return True  # plain PTX is JIT-compiled by a 12.x driver
    return False


def gencode_for(sass: str) -> str:
    """``sm_120a`` -> ``-gencode=arch=compute_120a,code=sm_120a``."""
    m = _TARGET_RE.match(sass)
    if not m or m.group(1) != "sm":
        raise ValueError(f"not an SASS target: {sass!r}")
    return f"-gencode=arch=compute_{m.group(2)}{m.group(3)},code={sass}"


def filter_args(args: list[str], sass: list[str]) -> tuple[list[str], Decision]:
    """Return ``args`` with every target flag replaced (see the module docstring) and what was done."""
    kept_args: list[str] = []
    original: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        flag, value = arg, None
        if "=" in arg and arg.split("=", 1)[0] in _GENCODE + _ARCH + _CODE:
            flag, value = arg.split("=", 1)
        if flag in _GENCODE + _ARCH + _CODE:
            if value is None:
                if i + 1 >= len(args):
                    kept_args.append(arg)
                    break
                value = args[i + 1]
                i += 1
            original.append((flag, value))
        else:
            kept_args.append(arg)
        i += 1
    targets: list[str] = []
    for flag, value in original:
        if flag in _GENCODE:
            targets += _targets_of_gencode(value)
        elif flag in _ARCH:
            targets += _targets_of_arch(value)
        else:
            targets += _split_values(value)
    targets = list(dict.fromkeys(targets))
    min_sm = min(int(_TARGET_RE.match(s).group(2)) for s in sass)  # type: ignore[union-attr]
    if not original:
        new = [gencode_for(s) for s in sass]
        action = "added"
    elif _runs_on_12x(targets, min_sm):
        new = [gencode_for(s) for s in sass]
        action = "replaced"
    else:
        virtual = _first_virtual(original) or "compute_" + targets[0].split("_", 1)[-1]
        new = [f"-gencode=arch={virtual},code={virtual}"]
        action = "foreign-ptx"
    insert_at = _insert_position(kept_args)
    out = kept_args[:insert_at] + new + kept_args[insert_at:]
    return out, Decision(action, tuple(targets), tuple(v.split("=", 1)[1] for v in new))


def _insert_position(args: list[str]) -> int:
    """Before ``-c``/``-x``/the source, so the output stays readable; the end otherwise."""
    for i, arg in enumerate(args):
        if arg in ("-c", "--compile", "-x"):
            return i
    return len(args)


def _output_of(args: list[str]) -> str:
    for i, arg in enumerate(args):
        if arg in ("-o", "--output-file") and i + 1 < len(args):
            return args[i + 1]
    return "?"


def main(argv: list[str]) -> int:
    sass: list[str] = []
    ccache = None
    log = None
    i = 0
    while i < len(argv) and argv[i] != "--":
        opt = argv[i]
        if opt.startswith("--sass="):
            sass = [s for s in opt.split("=", 1)[1].split(",") if s]
        elif opt.startswith("--ccache="):
            ccache = opt.split("=", 1)[1] or None
        elif opt.startswith("--log="):
            log = opt.split("=", 1)[1] or None
        else:
            print(f"nvcc_launcher: unknown option {opt}", file=sys.stderr)
            return 2
        i += 1
    command = argv[i + 1 :]
    if not command or not sass:
        print("usage: nvcc_launcher.py --sass=sm_120a [--ccache=PATH] [--log=FILE] -- nvcc ARGS...", file=sys.stderr)
        return 2
    for s in sass:
        gencode_for(s)  # validates
    compiler, args = command[0], command[1:]
    new_args, decision = filter_args(args, sass)
    if log:
        line = (
            f"{decision.action}\t{','.join(decision.original) or '-'}\t{','.join(decision.kept)}\t{_output_of(args)}\n"
        )
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(line)
    final = ([ccache, compiler] if ccache else [compiler]) + new_args
    os.execvp(final[0], final)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
