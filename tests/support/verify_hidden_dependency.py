"""Run ``sm120kit verify``'s SGLang checks against a real SGLang tree with some of SGLang's import
dependencies hidden, as on a machine where they are not installed.

Usage: python verify_hidden_dependency.py TREE_ROOT HIDDEN[,HIDDEN...] MODE  -> one JSON object on stdout.

TREE_ROOT is the folder holding ``sglang/`` (put first on ``sys.path``). HIDDEN packages cannot be imported:
an import finder refuses them exactly as Python does for a package that is not installed
(ModuleNotFoundError naming it), so SGLang's real import chain fails where it would. Run in its own
interpreter so nothing it imports reaches other tests.

The GPU is stood in for (this machine has none): ``sm120kit.verify.checks.gpu_context`` answers a CPU device
labelled as a 12.0 GPU, so every check goes past "no GPU" to its imports; a check that got further would
need a real GPU, but with the dependency hidden every SGLang check stops at its import.

MODE ``checks``: each SGLang check through ``checks.run_check``: its status, skip cause, missing packages and
reason. MODE ``cli``: ``sm120kit verify --sglang TREE --backend triton --backend torch_native --no-audits
--json`` through the real command line (report included), its JSON and exit code; and the verdict of the
same result with the report's findings left out (this machine's CPU-only torch is an error finding of its
own, which would hide what the verdict says about the checks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import io
import json
import sys


class _NotInstalled(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def main() -> int:
    root, hidden, mode = sys.argv[1], set(filter(None, sys.argv[2].split(","))), sys.argv[3]
    for name in list(sys.modules):
        if name.split(".")[0] in hidden:
            del sys.modules[name]
    sys.meta_path.insert(0, _NotInstalled(hidden))
    sys.path.insert(0, root)
    import torch

    from sm120kit.verify import check_sglang, checks

    def stand_in_gpu(torch_module):  # the GPU this machine lacks
        return checks.CheckContext(torch_module, torch_module.device("cpu"), (12, 0), "stand-in for a 12.0 GPU"), ""

    checks.gpu_context = stand_in_gpu
    if mode == "checks":
        ctx, _ = stand_in_gpu(torch)
        out = {
            c.name: {"status": r.status, "skip_cause": r.skip_cause, "packages": list(r.packages), "detail": r.detail}
            for c in check_sglang.CHECKS
            for r in [checks.run_check(c, ctx)]
        }
        print(json.dumps(out))
        return 0
    from sm120kit.cli import main as cli_main
    from sm120kit.verify import verifier

    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        try:
            cli_main(
                [
                    "verify",
                    "--sglang",
                    root,
                    "--backend",
                    "triton",
                    "--backend",
                    "torch_native",
                    "--no-audits",
                    "--json",
                ]
            )
            code = 0
        except SystemExit as stop:
            code = stop.code
    result = verifier.run_verify(verifier.VerifyPlan(backends=("triton", "torch_native"), sglang=root, audits=False))
    clean = dataclasses.replace(result, report=dataclasses.replace(result.report, flags=()))
    print(
        json.dumps(
            {
                "exit_code": code,
                "document": json.loads(captured.getvalue()),
                "without_report_findings": {
                    "ok": clean.ok,
                    "verdict": clean.verdict,
                    "exit_code": verifier.exit_code(clean),
                    "reason": clean.nothing_verified_reason(),
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
