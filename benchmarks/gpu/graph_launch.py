"""What launching ResNet-50's captured CUDA graph costs the launching thread, and why.

At c=256 the executor's loop spends ~570 µs per batch in ``CUDAGraph.replay`` (282 µs at c=1,
``docs/benchmarks.md``, *The executor's loop at c=256, profiled on main*): ~1-2 µs per node of a
~285-kernel graph, where CUDA 12.6+ launches a straight-line graph of kernels in a few µs
whatever its length. This captures the benchmark's ResNet-50 (fp16, channels_last, random
weights) at one batch size as infermux does (``torch.cuda.graph`` on a side stream, one pool per
instance), lists the graph's nodes by type, and times the CPU cost of one launch:

- ``torch``: ``CUDAGraph.replay()``, as the executor launches;
- ``driver``: ``cuGraphLaunch`` on torch's own executable graph, through ``ctypes`` (torch's
  wrapper left out);
- ``uploaded``: torch's replay after ``cuGraphUpload`` of its executable graph to the stream;
- ``reinstantiated``: the same graph instantiated again with no flags (torch passes
  ``AutoFreeOnLaunch``), uploaded, launched with ``cuGraphLaunch``; its outputs are checked
  against torch's replay.

Each way is timed with the GPU idle (synchronised before each launch) and busy (four graphs on
four streams, a round queued behind the last, as four instances at c=256).

    python3 benchmarks/gpu/graph_launch.py --out $OUT/graph_launch.json
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

NODE_TYPES = {
    0: "kernel",
    1: "memcpy",
    2: "memset",
    3: "host",
    4: "child graph",
    5: "empty",
    6: "wait event",
    7: "event record",
    8: "semaphore signal",
    9: "semaphore wait",
    10: "mem alloc",
    11: "mem free",
    12: "batch mem op",
    13: "conditional",
}


class Cuda:
    """The few driver calls this needs, by ``ctypes`` (as ``infermux.runtime.driver``)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        p = ctypes.c_void_p
        for name, args in (
            ("cuGraphLaunch", (p, p)),
            ("cuGraphUpload", (p, p)),
            ("cuGraphInstantiateWithFlags", (p, p, ctypes.c_ulonglong)),
            ("cuGraphGetNodes", (p, p, p)),
            ("cuGraphNodeGetType", (p, p)),
            ("cuGraphExecDestroy", (p,)),
            ("cuDriverGetVersion", (p,)),
        ):
            function = getattr(lib, name)
            function.restype, function.argtypes = ctypes.c_int, args
        self.lib = lib

    def check(self, name: str, result: int) -> None:
        if result != 0:
            raise RuntimeError(f"{name} failed with CUDA error {result}")

    def version(self) -> int:
        value = ctypes.c_int()
        self.check("cuDriverGetVersion", self.lib.cuDriverGetVersion(ctypes.byref(value)))
        return value.value

    def node_types(self, graph: int) -> dict[str, int]:
        count = ctypes.c_size_t(0)
        self.check("cuGraphGetNodes", self.lib.cuGraphGetNodes(graph, None, ctypes.byref(count)))
        nodes = (ctypes.c_void_p * count.value)()
        self.check("cuGraphGetNodes", self.lib.cuGraphGetNodes(graph, nodes, ctypes.byref(count)))
        kinds: Counter[str] = Counter()
        for node in nodes:
            kind = ctypes.c_int()
            self.check("cuGraphNodeGetType", self.lib.cuGraphNodeGetType(node, ctypes.byref(kind)))
            kinds[NODE_TYPES.get(kind.value, str(kind.value))] += 1
        return dict(kinds)

    def instantiate(self, graph: int) -> int:
        exec_ = ctypes.c_void_p()
        result = self.lib.cuGraphInstantiateWithFlags(ctypes.byref(exec_), graph, 0)
        self.check("cuGraphInstantiateWithFlags", result)
        return exec_.value or 0


def build(batch: int) -> tuple[torch.nn.Module, torch.Tensor]:
    import torchvision
    from models import ImageClassifier  # benchmarks/gpu on sys.path (run from there or below)

    torch.manual_seed(0)
    net = torchvision.models.resnet50().to(memory_format=torch.channels_last)
    model = ImageClassifier(net, torch.float16).eval().cuda()
    image = torch.randint(0, 256, (batch, 224, 224, 3), dtype=torch.uint8, device="cuda")
    return model, image


class Captured:
    """One instance's graph: its stream, static input and output, torch's CUDAGraph."""

    def __init__(self, model: torch.nn.Module, image: torch.Tensor) -> None:
        self.stream = torch.cuda.Stream()
        self.input = image.clone()
        cuda: Any = torch.cuda
        try:
            self.graph = cuda.CUDAGraph(keep_graph=True)
        except TypeError:  # an older torch keeps the graph anyway
            self.graph = cuda.CUDAGraph()
        with torch.inference_mode():
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                for _ in range(3):  # warm-up: cuDNN picks its kernels outside the capture
                    model(self.input)
            self.stream.synchronize()
            pool = torch.cuda.graph_pool_handle()
            with cuda.graph(
                self.graph, pool=pool, stream=self.stream, capture_error_mode="thread_local"
            ):
                self.output = model(self.input)
        if hasattr(self.graph, "instantiate"):  # kept graphs are instantiated on demand
            with contextlib.suppress(RuntimeError):  # already instantiated
                self.graph.instantiate()
        self.handle = self.stream.cuda_stream

    def raw_graph(self) -> int:
        return int(self.graph.raw_cuda_graph())

    def raw_exec(self) -> int:
        return int(self.graph.raw_cuda_graph_exec())


def _launcher(cuda: Cuda) -> Callable[[int, int], Callable[[], None]]:
    """``launch(exec, stream)``: a function that launches that executable graph there."""

    def make(exec_: int, stream: int) -> Callable[[], None]:
        return lambda: cuda.check("cuGraphLaunch", cuda.lib.cuGraphLaunch(exec_, stream))

    return make


def timed(launch: Callable[[], None]) -> float:
    start = time.perf_counter_ns()
    launch()
    return (time.perf_counter_ns() - start) / 1000.0


def idle(captured: Captured, launch: Callable[[], None], rounds: int) -> dict[str, float]:
    times = []
    with torch.cuda.stream(captured.stream):
        for _ in range(rounds):
            captured.stream.synchronize()
            times.append(timed(launch))
        captured.stream.synchronize()
    return summary(times)


def busy(
    instances: list[Captured], launches: list[Callable[[], None]], rounds: int
) -> dict[str, float]:
    times = []
    events: list[torch.cuda.Event] = []
    for _ in range(rounds):
        round_events = []
        for captured, launch in zip(instances, launches, strict=True):
            with torch.cuda.stream(captured.stream):
                times.append(timed(launch))
                event = torch.cuda.Event()
                event.record(captured.stream)
                round_events.append(event)
        for event in events:  # one round queued behind the last: the GPU never idles
            event.synchronize()
        events = round_events
    torch.cuda.synchronize()
    return summary(times)


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "launches": len(times),
        "p50_us": round(statistics.median(times), 1),
        "mean_us": round(statistics.fmean(times), 1),
        "p90_us": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cuda = Cuda()
    model, image = build(args.batch)
    instances = [Captured(model, image) for _ in range(4)]
    first = instances[0]
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "driver": cuda.version(),
        "device": torch.cuda.get_device_name(),
        "batch": args.batch,
    }
    try:
        report["nodes"] = cuda.node_types(first.raw_graph())
    except Exception as exc:  # an older torch without raw_cuda_graph
        report["nodes"] = f"unavailable: {exc}"
    ways: dict[str, Callable[[Captured], Callable[[], None]]] = {
        "torch": lambda c: c.graph.replay,
    }
    try:
        first.raw_exec()
        ways["driver"] = lambda c: _launcher(cuda)(c.raw_exec(), c.handle)
    except Exception as exc:
        report["driver"] = f"unavailable: {exc}"
    results: dict[str, Any] = {}
    for name, make in ways.items():
        results[name] = {
            "idle": idle(first, make(first), args.rounds),
            "busy": busy(instances, [make(c) for c in instances], args.rounds // 4),
        }
    if "driver" in ways:
        for c in instances:
            cuda.check("cuGraphUpload", cuda.lib.cuGraphUpload(c.raw_exec(), c.handle))
        results["uploaded"] = {
            "idle": idle(first, first.graph.replay, args.rounds),
            "busy": busy(instances, [c.graph.replay for c in instances], args.rounds // 4),
        }
    try:
        execs = [cuda.instantiate(c.raw_graph()) for c in instances]
        for c, e in zip(instances, execs, strict=True):
            cuda.check("cuGraphUpload", cuda.lib.cuGraphUpload(e, c.handle))

        own = _launcher(cuda)

        # Same memory, same kernels: the outputs must match torch's replay bit for bit.
        first.graph.replay()
        first.stream.synchronize()
        with torch.inference_mode():  # the output is an inference tensor
            expected = first.output.clone()
            first.output.zero_()
        torch.cuda.synchronize()
        own(execs[0], first.handle)()
        first.stream.synchronize()
        report["reinstantiated_outputs_equal"] = bool(torch.equal(first.output, expected))
        results["reinstantiated"] = {
            "idle": idle(first, own(execs[0], first.handle), args.rounds),
            "busy": busy(
                instances,
                [own(e, c.handle) for c, e in zip(instances, execs, strict=True)],
                args.rounds // 4,
            ),
        }
        for e in execs:
            cuda.lib.cuGraphExecDestroy(e)
    except Exception as exc:
        report["reinstantiated"] = f"unavailable: {exc}"
    report["launch_cpu"] = results
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
