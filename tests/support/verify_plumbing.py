"""Run sm120kit's SGLang checks against a real SGLang release on a faked GPU, compiling instead of launching.

Usage: python verify_plumbing.py RELEASE_DIR CAPABILITY  -> one JSON object on stdout.

The faked device (sm120kit.hardware.fake_device) stands in for a GPU this machine lacks: tensors live on
torch's ``meta`` device and every Triton launch becomes a real compile for the faked target. Nothing runs,
so there are no numbers to compare: each case is reported as compiled (or as the error SGLang's launcher
raised), together with every kernel Triton compiled. Run in its own interpreter so the imported SGLang
release does not leak into other tests.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    release_dir, capability = sys.argv[1], sys.argv[2]
    sys.path.insert(0, release_dir)
    import torch

    from sm120kit.hardware.fake_device import PRESETS, faked_cuda, faked_triton_target, stand_in_packages
    from sm120kit.verify import check_sglang, checks

    def compiled_only(label, out, ref, **kw):
        # No numbers exist on the meta device: record that the launcher accepted the inputs and that the
        # output has the reference's shape.
        same = tuple(out.shape) == tuple(ref.shape)
        return checks.CaseResult(
            label,
            same,
            None,
            kw.get("tol"),
            "compiled only",
            error=None if same else f"shape {tuple(out.shape)} != {tuple(ref.shape)}",
        )

    def align_shape_only(torch_mod, topk_ids, block_m, num_experts):
        # moe_align needs the routing values, which meta tensors do not have: the worst-case sizes suffice
        # for a compile.
        n = ((topk_ids.numel() + block_m * num_experts) // block_m) * block_m
        dev = topk_ids.device
        return (
            torch_mod.empty(n, device=dev, dtype=torch_mod.int32),
            torch_mod.empty(n // block_m, device=dev, dtype=torch_mod.int32),
            torch_mod.empty(1, device=dev, dtype=torch_mod.int32),
        )

    check_sglang.compare = compiled_only
    check_sglang.moe_align = align_shape_only
    device = PRESETS[capability]
    out = {"checks": {}, "kernels": []}
    with stand_in_packages(), faked_cuda(device), faked_triton_target(device) as recorder:
        ctx = checks.CheckContext(torch, torch.device("meta"), device.capability, device.name)
        for check in check_sglang.CHECKS:
            if check.backend != "triton":
                continue
            try:
                cases = check.run(ctx)
            except checks.Skip as exc:  # e.g. the sm120-mla-attention checks on an unpatched release
                out.setdefault("skipped", {})[check.name] = str(exc)
                continue
            out["checks"][check.name] = [
                {"label": c.label, "ok": c.ok, "error": c.error, "skipped": c.skipped} for c in cases
            ]
        for k in recorder.kernels:
            out["kernels"].append(
                {
                    "name": k.name,
                    "module": k.module,
                    "shared": k.shared,
                    "constexprs": {n: v for n, v in k.constexprs.items() if n.startswith("BLOCK")},
                }
            )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
