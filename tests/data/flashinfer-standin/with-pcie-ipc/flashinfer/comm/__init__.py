"""Stand-in for flashinfer.comm with the PCIe-IPC all-reduce workspace (see ../../../README.md).

The constructor and methods are the ones SGLang's PCIe-IPC wiring calls; the sum is
torch.distributed.all_reduce on the group the workspace is given, so two gloo processes really reduce.
"""

import torch.distributed as dist

CALLS = []


class PcieIpcAllReduceWorkspace:
    def __init__(self, group, max_numel, dtype=None, max_blocks=128, profile=None, tune_batches=None, tune_cache=None):
        CALLS.append(("init", {"max_numel": max_numel, "dtype": str(dtype), "tune_batches": list(tune_batches or ())}))
        self.group = group
        self.max_numel = max_numel
        dist.barrier(group=group)  # construction is collective in FlashInfer too

    def supports(self, inp):
        return inp.is_contiguous() and inp.numel() <= self.max_numel

    def tune(self, hiddens, *, dtype=None, cache=None, tune_group=None, warmup=None, repeat=None):
        CALLS.append(("tune", {"hiddens": list(hiddens), "tune_group": tune_group is not None}))
        return [(h, 1) for h in hiddens]

    def rebind_stream(self):
        CALLS.append(("rebind_stream", {}))

    def all_reduce(self, inp, *, out=None, config=None, enable_pdl=False):
        result = inp.clone()
        dist.all_reduce(result, group=self.group)
        CALLS.append(("all_reduce", {"shape": list(inp.shape)}))
        return result

    def destroy(self):
        CALLS.append(("destroy", {}))
