"""Time all-reduces on this machine's GPUs, one process per GPU; the child program of ``bench-allreduce``.

This module is a program, started by :mod:`sm120kit.tune.allreduce` through :func:`sm120kit.runner.run` in
the Python that will serve (``PYTHONPATH`` reaching this file's package):

    python -m sm120kit.tune.allreduce_worker probe RESULT.json
    python -m sm120kit.tune.allreduce_worker measure SPEC.json RESULT.json

It imports nothing of sm120kit and nothing outside the standard library but torch (and, for the variants
that time them, SGLang's custom all-reduce and FlashInfer's PCIe-IPC all-reduce), so that it runs in any
interpreter that can run SGLang. ``probe`` writes what the interpreter sees: torch, CUDA, NCCL, the GPUs
and peer access between them, and whether SGLang and FlashInfer offer their all-reduces. ``measure`` runs
one variant: it starts ``world`` processes (``torch.multiprocessing.spawn``: fresh interpreters that
inherit the environment this program was started with, so every NCCL variable of the variant is read
fresh), joins them in a ``torch.distributed`` group (NCCL on GPUs; gloo on CPUs, for tests), checks the
sum once per size, then times the all-reduce of each size:

* on a GPU, ``inner`` all-reduces are captured in one CUDA graph; each sample replays it between two CUDA
  events, after one untimed all-reduce that lines the GPUs up, and is the elapsed time over ``inner``;
  without a graph (where capture fails) the same with the launches in the open;
* on a CPU, wall-clock time of ``inner`` all-reduces after a barrier;
* every rank takes the same samples; a sample's time is the slowest rank's;
* with ``quick``, ``quick_samples`` samples come first, and when the median of each size is over the
  threshold given for it (the best seen so far, times a factor) the variant stops there: dropped.

RESULT.json gets the per-size median (p50), p99, mean and bus bandwidth (NCCL-tests' definition:
bytes / time x 2 (n - 1) / n), or the error that stopped the variant. The exit status is 0 whenever
RESULT.json was written.
"""

import json
import math
import os
import socket
import sys
import time
import traceback

DTYPES = ("bfloat16", "float16", "float32")


def _versions():
    import torch

    info = {"python": sys.executable, "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": None}
    try:
        version = torch.cuda.nccl.version()
        info["nccl"] = ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    except Exception:
        pass
    for name, dist in (("sglang", "sglang"), ("flashinfer", "flashinfer-python")):
        try:
            from importlib.metadata import version as dist_version

            info[name] = dist_version(dist)
        except Exception:
            info[name] = None
    return info


def _sglang_custom_ar():
    """(chooser, None) when SGLang's custom all-reduce can be imported here, else (None, why). The chooser takes
    (group, device) and returns the class SGLang's GroupCoordinator would build (``dispatch_custom_allreduce``
    where the release has it: the JIT v2 implementation on CUDA from 0.5.2x; else ``CustomAllreduce``)."""
    try:
        from sglang.srt.distributed.device_communicators import custom_all_reduce as module
    except Exception as exc:
        return None, f"SGLang's custom all-reduce cannot be imported ({type(exc).__name__}: {str(exc)[:200]})"
    dispatch = getattr(module, "dispatch_custom_allreduce", None)
    if dispatch is not None:
        return (lambda group, device: dispatch(group=group, device=device)), None
    return (lambda group, device: module.CustomAllreduce), None


def _pcie_ipc():
    """(class, None) when FlashInfer's PCIe-IPC all-reduce can be imported here, else (None, why)."""
    try:
        from flashinfer.comm import PcieIpcAllReduceWorkspace
    except Exception as exc:
        return None, (
            f"FlashInfer's PCIe-IPC all-reduce (flashinfer.comm.PcieIpcAllReduceWorkspace, FlashInfer "
            f"0.7.0 and later) cannot be imported ({type(exc).__name__}: {str(exc)[:200]})"
        )
    return PcieIpcAllReduceWorkspace, None


def probe(out):
    result = {"error": None}
    try:
        import torch

        result.update(_versions())
        gpus = []
        if torch.version.cuda is not None and torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                gpus.append(
                    {
                        "index": i,
                        "name": torch.cuda.get_device_name(i),
                        "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                    }
                )
            result["peer"] = [
                [i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(len(gpus))]
                for i in range(len(gpus))
            ]
            result["why_no_gpu"] = None
        else:
            result["peer"] = []
            result["why_no_gpu"] = (
                f"torch {torch.__version__} is not a CUDA build"
                if torch.version.cuda is None
                else "torch.cuda.is_available() is False"
            )
        result["gpus"] = gpus
        result["sglang_custom_ar"] = _sglang_custom_ar()[1]
        result["pcie_ipc"] = _pcie_ipc()[1]
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    with open(out, "w") as handle:
        json.dump(result, handle, indent=1)


# -- measure -------------------------------------------------------------------------------------------------


def percentile(values, q):
    """The ``q``-th percentile (0-100) of ``values``, linear between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100.0
    low = int(math.floor(pos))
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def bus_bandwidth(nbytes, seconds, world):
    """NCCL-tests' bus bandwidth of an all-reduce, GB/s: bytes / time x 2 (n - 1) / n."""
    if seconds <= 0:
        return None
    return nbytes / seconds * 2 * (world - 1) / world / 1e9


class Timer:
    """Times ``inner`` calls of ``op`` on one rank (CUDA graph, CUDA events, or the wall clock)."""

    def __init__(self, torch, dist, device, cpu_group, op, x, inner, use_graph, capture_context):
        self.torch, self.dist, self.device, self.cpu_group = torch, dist, device, cpu_group
        self.op, self.x, self.inner = op, x, inner
        self.graph = None
        self.sync_graph = None
        self.mode = "wall" if device.type == "cpu" else "events"
        if device.type == "cuda" and use_graph:
            try:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(3):
                        op(x)
                torch.cuda.current_stream().wait_stream(stream)
                torch.cuda.synchronize()
                with capture_context():
                    self.graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(self.graph):
                        for _ in range(inner):
                            op(x)
                    self.sync_graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(self.sync_graph):
                        op(x)
                torch.cuda.synchronize()
                self.mode = "cuda-graph"
            except Exception as exc:  # capture unsupported here: time the launches in the open
                self.graph = self.sync_graph = None
                self.capture_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                torch.cuda.synchronize()

    def sample(self):
        torch = self.torch
        self.dist.barrier(group=self.cpu_group)
        if self.device.type == "cpu":
            start = time.perf_counter()
            for _ in range(self.inner):
                self.op(self.x)
            return (time.perf_counter() - start) / self.inner
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        if self.graph is not None:
            self.sync_graph.replay()
            begin.record()
            self.graph.replay()
            end.record()
        else:
            self.op(self.x)
            begin.record()
            for _ in range(self.inner):
                self.op(self.x)
            end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3 / self.inner


def _make_op(spec, torch, dist, device, cpu_group, rank, world):
    """(op, capture_context, serves(x), info) for the variant's implementation."""
    import contextlib

    impl = spec["impl"]
    if impl == "nccl" or impl == "torch":

        def op(x):
            dist.all_reduce(x)
            return x

        return op, contextlib.nullcontext, (lambda x: True), {}
    max_numel = max(spec["tokens"]) * spec["hidden"]
    dtype = getattr(torch, spec["dtype"])
    if impl == "sglang-custom":
        choose, why = _sglang_custom_ar()
        if choose is None:
            raise RuntimeError(why)
        comm = choose(cpu_group, device)(group=cpu_group, device=device)  # sized as SGLang's server sizes it
        info = {"class": type(comm).__name__}
        if getattr(comm, "disabled", True):
            raise RuntimeError(
                "SGLang's custom all-reduce disabled itself on these GPUs (its log says why: e.g. "
                "more than two PCIe-only GPUs, or no peer access)"
            )
        return comm.custom_all_reduce, comm.capture, (lambda x: bool(comm.should_custom_ar(x))), info
    if impl == "pcie-ipc":
        cls, why = _pcie_ipc()
        if cls is None:
            raise RuntimeError(why)
        rows = max(spec["tokens"])
        batches = sorted({1 << i for i in range(rows.bit_length()) if 1 << i <= rows} | {rows})
        workspace = cls(group=dist.group.WORLD, max_numel=max_numel, dtype=dtype, tune_batches=tuple(batches))
        info = {"tuned": None}
        if spec.get("tune", True) and hasattr(workspace, "tune"):
            try:
                tuned = workspace.tune([spec["hidden"]], dtype=dtype, tune_group=cpu_group)
                info["tuned"] = len(tuned or ())
            except Exception as exc:
                info["tuned"] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"

        bound = {"stream": None}

        def op(x):
            if device.type == "cuda":  # one stream at a time: moved with the caller (capture, then replay)
                stream = torch.cuda.current_stream()
                if bound["stream"] is not None and stream != bound["stream"]:
                    workspace.rebind_stream()
                bound["stream"] = stream
            return workspace.all_reduce(x)

        return op, contextlib.nullcontext, (lambda x: bool(workspace.supports(x))), info
    raise RuntimeError(f"unknown implementation {impl!r}")


def _die_with_parent():
    """Linux: this rank is killed when the launcher goes (a timeout in sm120kit kills the launcher only)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _rank(rank, spec, out, port):
    import datetime

    import torch
    import torch.distributed as dist

    _die_with_parent()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    world = spec["world"]
    cuda = spec["device"] == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=float(spec.get("timeout", 120)))
    dist.init_process_group(spec["backend"], rank=rank, world_size=world, timeout=timeout)
    cpu_group = dist.new_group(backend="gloo", timeout=timeout)
    result = {"sizes": [], "error": None, "impl_info": {}, "timing": None}
    dtype = getattr(torch, spec["dtype"])
    try:
        op, capture, serves, info = _make_op(spec, torch, dist, device, cpu_group, rank, world)
        result["impl_info"] = info
        quick = spec.get("quick") or {}
        thresholds = quick.get("thresholds_us") or {}
        timers = {}
        for tokens in spec["tokens"]:
            x = torch.full((tokens, spec["hidden"]), float(rank + 1), dtype=dtype, device=device)
            entry = {"tokens": tokens, "bytes": x.numel() * x.element_size()}
            served = [bool(serves(x))]
            flags = [None] * world
            dist.all_gather_object(flags, served[0], group=cpu_group)
            if not all(flags):
                entry["served"] = False
                result["sizes"].append(entry)
                continue
            check = op(x.clone())
            expected = world * (world + 1) / 2
            got = float(check.float().flatten()[0].item())
            entry["check"] = "ok" if abs(got - expected) <= 1e-2 * expected else f"sum {got}, expected {expected}"
            for _ in range(spec["warmup"]):
                op(x)
            timers[tokens] = Timer(
                torch, dist, device, cpu_group, op, x, spec["inner"], spec.get("graph", True), capture
            )
            entry["timing"] = timers[tokens].mode
            entry["served"] = True
            result["sizes"].append(entry)
        # quick look first: a variant slower than the thresholds at every size stops here
        rounds = [("quick", int(quick.get("samples", 0)))] if thresholds else []
        rounds.append(("full", spec["samples"]))
        for kind, count in rounds:
            medians = {}
            for entry in result["sizes"]:
                if not entry.get("served"):
                    continue
                timer = timers[entry["tokens"]]
                own = [timer.sample() for _ in range(count)]
                gathered = [None] * world
                dist.all_gather_object(gathered, own, group=cpu_group)
                samples = [max(values) for values in zip(*gathered)]  # the slowest rank's time per sample
                p50 = percentile(samples, 50)
                medians[entry["tokens"]] = p50
                entry.update(
                    samples=len(samples),
                    p50_us=p50 * 1e6,
                    p99_us=percentile(samples, 99) * 1e6,
                    mean_us=sum(samples) / len(samples) * 1e6,
                    busbw_gbps=bus_bandwidth(entry["bytes"], p50, world),
                )
            if kind == "quick":
                hopeless = bool(medians) and all(
                    str(t) in thresholds and medians[t] * 1e6 > thresholds[str(t)] for t in medians
                )
                result["dropped"] = hopeless
                if hopeless:
                    break
        torch_timing = {e.get("timing") for e in result["sizes"] if e.get("timing")}
        result["timing"] = ", ".join(sorted(torch_timing)) or None
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        result["traceback"] = traceback.format_exc()[-3000:]
    gathered = [None] * world
    dist.all_gather_object(gathered, (result["error"], os.getpid()), group=cpu_group)
    errors = [e for e, _ in gathered if e]
    if rank == 0:
        if errors and not result["error"]:
            result["error"] = errors[0]
        result["pids"] = [pid for _, pid in gathered]
        result["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "SGLANG_"))}
        result.update(_versions())
        with open(out, "w") as handle:
            json.dump(result, handle, indent=1)
    dist.barrier(group=cpu_group)
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(spec_path, out):
    with open(spec_path) as handle:
        spec = json.load(handle)
    if spec["dtype"] not in DTYPES:
        raise SystemExit(f"dtype {spec['dtype']!r} is not one of {DTYPES}")
    import torch.multiprocessing as mp

    port = spec.get("port") or free_port()
    try:
        mp.spawn(_rank, args=(spec, out, port), nprocs=spec["world"], join=True)
    except Exception as exc:  # a rank died without writing: say so in the result
        if not os.path.exists(out):
            with open(out, "w") as handle:
                json.dump(
                    {"error": f"a rank process failed: {type(exc).__name__}: {str(exc)[-1500:]}", "sizes": []},
                    handle,
                    indent=1,
                )


def main(argv):
    if len(argv) == 2 and argv[0] == "probe":
        probe(argv[1])
        return 0
    if len(argv) == 3 and argv[0] == "measure":
        measure(argv[1], argv[2])
        return 0
    print(
        "usage: python -m sm120kit.tune.allreduce_worker probe OUT.json | measure SPEC.json OUT.json", file=sys.stderr
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
