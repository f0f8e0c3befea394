"""Exports one model and measures the raw in-process ceiling; run by ``run.py`` as a subprocess, so
that its CUDA context (and the memory it holds) is gone before any server starts.

    python benchmarks/gpu/raw.py --model resnet50 --repo DIR --ref-dir DIR [--device cuda] [--tiny]

On CUDA the exported TorchScript file is loaded back, and a CUDA graph is captured per batch size;
one step is: H2D copy of the request bytes from pinned host memory, graph replay, D2H copy of the
output into pinned memory. Throughput is measured at max_batch_size on one stream and on
``--streams`` streams (each with its own graph and static buffers, all sharing one copy of the
weights); the ceiling is the larger. The process's GPU memory with those streams set up is the
"in-process minimum" that a server holding the same buffers cannot go below. Batch-1 latency is the
median of synchronised single steps. On the CPU the model simply runs eagerly.

Prints one JSON document on its last line of stdout and writes the reference input and output
(``<ref-dir>/<model>.npz``) that the load generators check the servers' answers against.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
from nvml import MIB, Nvml
from specs import ModelSpec, model_spec, reference_inputs, reference_path


class Slot:
    """Pinned host input/output, static device buffers and (on CUDA) a captured graph for one
    batch size on one stream."""

    def __init__(
        self, model: Any, spec: ModelSpec, *, batch: int, device: str, stream: Any, graph: bool
    ) -> None:
        import torch

        self.batch = batch
        self._model = model
        self._stream = stream
        cuda = device == "cuda"
        ref = reference_inputs(spec)
        self.host_in = [
            torch.from_numpy(np.repeat(ref[t.name], batch, axis=0).copy()) for t in spec.inputs
        ]
        if cuda:
            self.host_in = [t.pin_memory() for t in self.host_in]
        self.dev_in = [t.to(device) for t in self.host_in]
        self._graph: Any = None
        with torch.inference_mode(), torch.cuda.stream(stream) if cuda else nullcontext():
            # TorchScript's profiling executor specialises during its first calls: warm up before
            # capture, or the graph records the profiling run.
            for _ in range(4):
                out = model(*self.dev_in)
            if cuda:
                stream.synchronize()
            if graph:
                self._graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self._graph, stream=stream):
                    out = model(*self.dev_in)
        self.dev_out = out
        self.host_out = torch.empty(out.shape, dtype=out.dtype, pin_memory=cuda)

    def enqueue(self) -> None:
        """One step, queued on this slot's stream (returns before the GPU is done)."""
        import torch

        with torch.inference_mode():
            if self._stream is None:
                self.host_out.copy_(self._model(*self.host_in))
                return
            with torch.cuda.stream(self._stream):
                for dev, host in zip(self.dev_in, self.host_in, strict=True):
                    dev.copy_(host, non_blocking=True)
                if self._graph is not None:
                    self._graph.replay()
                else:
                    self.dev_out = self._model(*self.dev_in)
                self.host_out.copy_(self.dev_out, non_blocking=True)

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()


def items_per_s(slots: list[Slot], seconds: float, synchronize: Callable[[], None]) -> float:
    """Round-robin steps over ``slots`` for ``seconds``; the GPU is waited for every few rounds
    (a server waits for each batch too, but its other instances keep the GPU busy meanwhile)."""
    for _ in range(3):
        for slot in slots:
            slot.enqueue()
    synchronize()
    rounds, start = 0, time.perf_counter()
    while True:
        for _ in range(4):
            for slot in slots:
                slot.enqueue()
        synchronize()
        rounds += 4
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    return round(rounds * sum(s.batch for s in slots) / elapsed, 1)


def latency_ms(slot: Slot, seconds: float, max_reps: int = 2000) -> dict[str, float]:
    for _ in range(5):
        slot.enqueue()
        slot.synchronize()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < max_reps and (len(times) < 20 or time.perf_counter() < deadline):
        start = time.perf_counter()
        slot.enqueue()
        slot.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    return {
        "p50_ms": round(1e3 * statistics.median(times), 4),
        "p99_ms": round(1e3 * times[int(0.99 * (len(times) - 1))], 4),
        "reps": len(times),
    }


def measure(
    model: Any,
    spec: ModelSpec,
    *,
    device: str,
    streams: int,
    seconds: float,
    nvml: Nvml,
    base: float | None,
    batch_curve: tuple[int, ...] = (),
) -> dict[str, Any]:
    import torch

    top = spec.max_batch_size
    cuda = device == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    out: dict[str, Any] = {"max_batch": top}

    def stream() -> Any:
        return torch.cuda.Stream() if cuda else None

    eager_b1 = Slot(model, spec, batch=1, device=device, stream=stream(), graph=False)
    out["eager"] = {"b1": latency_ms(eager_b1, seconds / 2)}
    eager_top = Slot(model, spec, batch=top, device=device, stream=stream(), graph=False)
    out["eager"]["max_batch_items_per_s"] = items_per_s([eager_top], seconds, sync)
    del eager_b1, eager_top
    if cuda:
        # Hand the eager runs' cached blocks back, so the memory read below is the graphs' own.
        gc.collect()
        torch.cuda.empty_cache()
    ceiling = [out["eager"]["max_batch_items_per_s"]]
    b1_ms = out["eager"]["b1"]["p50_ms"]
    if cuda:
        graph: dict[str, Any] = {"streams": streams}
        out["graph"] = graph
        try:
            slots = [
                Slot(model, spec, batch=top, device=device, stream=stream(), graph=True)
                for _ in range(streams)
            ]
            sync()
            # What this process holds with `streams` graphs + buffers and one copy of the weights.
            used = nvml.device_used_mib()
            out["memory"] = {
                "process_mib": nvml.process_mib({os.getpid()}),
                "device_delta_mib": (
                    round(used - base, 1) if used is not None and base is not None else None
                ),
                "torch_reserved_mib": round(torch.cuda.memory_reserved() / MIB, 1),
                "torch_allocated_mib": round(torch.cuda.memory_allocated() / MIB, 1),
                "what": f"{streams} streams x (CUDA graph + static buffers at batch {top}), "
                "one copy of the weights, CUDA context",
            }
            graph["one_stream_items_per_s"] = items_per_s(slots[:1], seconds, sync)
            graph["multi_stream_items_per_s"] = items_per_s(slots, seconds, sync)
            del slots
            if batch_curve:
                graph["batch_curve"] = _batch_curve(
                    model,
                    spec,
                    device=device,
                    streams=streams,
                    batches=batch_curve,
                    seconds=seconds / 2,
                    sync=sync,
                )
            graph["b1"] = latency_ms(
                Slot(model, spec, batch=1, device=device, stream=stream(), graph=True), seconds / 2
            )
            ceiling += [graph["one_stream_items_per_s"], graph["multi_stream_items_per_s"]]
            b1_ms = graph["b1"]["p50_ms"]
        except Exception as exc:  # capture can fail on ops that synchronise; eager still counts
            graph["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    out["ceiling_items_per_s"] = max(ceiling)
    out["b1_latency_ms"] = b1_ms
    return out


def _batch_curve(
    model: Any,
    spec: ModelSpec,
    *,
    device: str,
    streams: int,
    batches: tuple[int, ...],
    seconds: float,
    sync: Callable[[], None],
) -> dict[str, float]:
    """Graph throughput on ``streams`` streams at each batch size: what the GPU can give a server
    whose batches have that size (a server's batches are far smaller than max_batch_size)."""
    import torch

    curve: dict[str, float] = {}
    for batch in batches:
        if not 1 <= batch <= spec.max_batch_size:
            continue
        slots = [
            Slot(model, spec, batch=batch, device=device, stream=torch.cuda.Stream(), graph=True)
            for _ in range(streams)
        ]
        curve[str(batch)] = items_per_s(slots, seconds, sync)
        del slots
        gc.collect()
        torch.cuda.empty_cache()
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--ref-dir", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--gpus", default="", help="instance_group gpus, e.g. 0,1")
    parser.add_argument("--queue-delay-us", type=int, default=500)
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=2.0, help="per throughput measurement")
    parser.add_argument(
        "--graph-batch-sizes", default="", help="graph_spec batch sizes for the config, e.g. 1,2,4"
    )
    parser.add_argument(
        "--batch-curve", default="", help="batch sizes to measure graph throughput at, e.g. 16,32"
    )
    args = parser.parse_args()

    nvml = Nvml()
    base = nvml.device_used_mib()  # before this process has a CUDA context
    import torch
    from models import compute_dtype, export, reference_output

    spec = model_spec(args.model, args.tiny)
    started = time.perf_counter()
    exported = export(
        spec,
        args.repo,
        tiny=args.tiny,
        device=args.device,
        instances=args.instances,
        gpus=args.gpus,
        queue_delay_us=args.queue_delay_us,
        cuda_graphs=args.cuda_graphs,
        graph_batch_sizes=_ints(args.graph_batch_sizes),
    )
    export_s = time.perf_counter() - started
    # The very file the servers load, not the module it was traced from.
    model = torch.jit.load(str(exported.model_file), map_location=args.device).eval()
    args.ref_dir.mkdir(parents=True, exist_ok=True)
    np.savez(reference_path(args.ref_dir, spec.name), **reference_output(model, spec, args.device))
    result: dict[str, Any] = {
        "model": spec.name,
        "description": spec.description,
        "device": args.device,
        "torch": torch.__version__,
        "compute_dtype": str(compute_dtype(args.device)).removeprefix("torch."),
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "export_s": round(export_s, 2),
        "trace_check_error": exported.trace_check_error,
        "config_pbtxt": exported.config_file.read_text(),
    }
    result.update(
        measure(
            model,
            spec,
            device=args.device,
            streams=args.streams,
            seconds=args.seconds,
            nvml=nvml,
            base=base,
            batch_curve=_ints(args.batch_curve),
        )
    )
    print(json.dumps(result), flush=True)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


if __name__ == "__main__":
    main()
