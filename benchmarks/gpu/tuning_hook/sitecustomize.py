"""Imported at start-up by every Python process of an infermux server that a device step starts
with this directory first on ``PYTHONPATH`` (``issue24_steps.sh variants``): sets a tuning
constant from the environment, so that one device call can measure several values on one tree
without carrying a copy of ``src/`` per value (the working tree that travels is capped). A
benchmark aid only: the server has no such settings, and with none of the variables set this
changes nothing.

- ``INFERMUX_BENCH_HOLD=N``: the front ends' micro-batch hold,
  :data:`infermux.transport.grouping.HOLD_WHILE_IN_FLIGHT`.
- ``INFERMUX_BENCH_HOLD_US=N``: the longest a held micro-batch waits,
  :data:`infermux.transport.grouping.HOLD_SECONDS` (2,000 µs by default; a uvloop timer, so
  whole milliseconds: 1000 is the shorter value worth trying).
- ``INFERMUX_BENCH_PAD_STEP=N``: CUDA graph buckets also every ``N`` rows from 8 to 64, beside
  :func:`infermux.runtime.graphs.padding_sizes` (every 2 rows there by default since the
  ``variants-14666b2`` call, so only a step of 1 or an odd one adds buckets now).
- ``INFERMUX_BENCH_EXECUTOR_NICE=N``: the executor process runs at nice ``N`` (negative: ahead
  of the front ends and perf_analyzer's threads on a saturated host; needs root). Asks whether
  the executor's loop, the one serial stage, waits for a core at c=256.
- ``INFERMUX_BENCH_FRONTEND_NICE=N``: every front end at nice ``N`` (positive needs no
  privilege: the executor ahead of the front ends, not of the client).
- ``INFERMUX_BENCH_FRONTEND_SHM=0``: front ends pass system shared-memory references on and the
  executor reads the regions (:meth:`infermux.transport.regions.RegionCopies.resolve` finds
  nothing), for ``benchmarks/frontends/shm_read.py``.
- ``INFERMUX_BENCH_URGENT=big:N`` or ``small:N``: a graph-launched batch of at least ``N`` rows
  (``big``) or of fewer (``small``) runs on a second stream of its instance at the device's
  most urgent CUDA priority; the others on the instance's own stream (normal, the least urgent
  on today's GPUs). Asks whether the block scheduler's priority by batch size changes the batch
  mix at c=256: every batch holds its instance 8-13 ms because four graphs interleave kernel
  by kernel (``docs/benchmarks.md``, *The GPU's own trace*). An instance runs one batch at a
  time and the next launches only after the host saw the last complete, so switching streams
  between batches keeps their order.
- ``INFERMUX_BENCH_FE_TIMING=DIR``: every front end times, per gRPC ``ModelInfer``, the handler
  (decode, the executor, the response's encoding), its call to the executor
  (``RemoteDataPlane.infer``: the micro-batch hold, the hops, the executor, the answer's
  wake-up) and the micro-batch leaders' hold (``MicroBatcher._gather``), and writes the sums to
  ``DIR/fe-<pid>.json`` every 2,000 calls. Set beside perf_analyzer's split, it says where a
  request's time outside the executor goes: in grpc.aio and the client (before the handler
  starts and after it returns), in the handler's own work, or in the hold and the hops. The
  executor writes ``DIR/ex-<pid>.json`` beside them: per request, the time from its frame's
  dispatch (read from the ring) to its answer's send (``ChannelServer._infer``), and how long
  the dispatched task waited to start. Every process also probes its event loop every 5 ms
  (a callback's wait for the loop's next iteration: how long ready work waits there), so the
  hops' time can be set against the loops' iteration lengths.
- ``INFERMUX_BENCH_LAUNCHER=busy`` or ``always``: a graph-launched batch's rows are copied in on
  the executor's loop as on main, and its graph replay, copies out and completion watch are
  queued on one launcher thread of the process (FIFO, so each stream's work keeps its order);
  ``busy`` does so only while another batch of the process is in flight (an idle GPU's batch
  launches on the loop as on main, where the loop's polling of its completion keeps c=1's
  latency), ``always`` for every batch (for the GPU tests). torch replays a graph without the
  GIL (``wrap_pybind_function_no_gil``), so the replay's ~570 µs per batch at c=256
  (``docs/benchmarks.md``, *The executor's loop at c=256, profiled on main*) leave the loop,
  the stage that saturates first; the price is a thread hand-off per batch and the thread's
  wait for the GIL after the replay. Asks whether that buys throughput at c=256.
- ``INFERMUX_BENCH_SWITCH_US=N``: the executor process's GIL switch interval
  (``sys.setswitchinterval``, 5,000 µs by default): how long a thread that wants the GIL back
  (the completion thread after its ``sem_wait``, a launcher thread after its replay) waits at
  most before the busy loop is made to yield it.
"""

from __future__ import annotations

import os
from types import ModuleType

_HOLD = os.environ.get("INFERMUX_BENCH_HOLD", "")
_HOLD_US = os.environ.get("INFERMUX_BENCH_HOLD_US", "")
_PAD_STEP = os.environ.get("INFERMUX_BENCH_PAD_STEP", "")
_NICE = os.environ.get("INFERMUX_BENCH_EXECUTOR_NICE", "")
_FRONTEND_NICE = os.environ.get("INFERMUX_BENCH_FRONTEND_NICE", "")
_FRONTEND_SHM = os.environ.get("INFERMUX_BENCH_FRONTEND_SHM", "")
_URGENT = os.environ.get("INFERMUX_BENCH_URGENT", "")
_FE_TIMING = os.environ.get("INFERMUX_BENCH_FE_TIMING", "")
_LAUNCHER = os.environ.get("INFERMUX_BENCH_LAUNCHER", "")
_SWITCH_US = os.environ.get("INFERMUX_BENCH_SWITCH_US", "")
_GRAPH_EXEC = os.environ.get("INFERMUX_BENCH_GRAPH_EXEC", "")

if _HOLD or _HOLD_US:
    from infermux.transport import grouping, micro_batcher

    # micro_batcher reads its own copies of the names (``from .grouping import ...``) at each hold.
    if _HOLD:
        grouping.HOLD_WHILE_IN_FLIGHT = micro_batcher.HOLD_WHILE_IN_FLIGHT = int(_HOLD)
    if _HOLD_US:
        grouping.HOLD_SECONDS = micro_batcher.HOLD_SECONDS = int(_HOLD_US) / 1e6

if _PAD_STEP:
    from infermux.runtime import graphs

    _default = graphs.padding_sizes
    _step = int(_PAD_STEP)

    def _finer(top: int) -> list[int]:
        return sorted({*_default(top), *range(8, min(64, top) + 1, _step)})

    graphs.padding_sizes = _finer


def _before_main(module: ModuleType, first: object) -> None:
    """Have ``module.main`` (a process entry point the supervisor spawns) call ``first()`` as it
    starts."""
    main = module.main

    def wrapped_main(*args: object, **kwargs: object) -> None:
        first()  # type: ignore[operator]
        main(*args, **kwargs)

    # The supervisor's spawn pickles the entry point by module and name: the child looks the
    # name up after this hook ran, so it starts here.
    wrapped_main.__qualname__ = wrapped_main.__name__ = "main"
    wrapped_main.__module__ = module.__name__
    module.main = wrapped_main


def _niced(module: ModuleType, nice: str) -> None:
    """Have ``module.main`` start at ``nice``."""
    _before_main(module, lambda: os.nice(int(nice)))


if _SWITCH_US:
    import sys

    from infermux.processes import executor as _executor

    _before_main(_executor, lambda: sys.setswitchinterval(int(_SWITCH_US) / 1e6))

if _NICE:
    from infermux.processes import executor

    _niced(executor, _NICE)

if _FRONTEND_NICE:
    from infermux.processes import frontend

    _niced(frontend, _FRONTEND_NICE)

if _FRONTEND_SHM == "0":
    from infermux.transport import regions

    def _executor_reads(self: regions.RegionCopies, request: object) -> None:
        return None

    regions.RegionCopies.resolve = _executor_reads  # type: ignore[assignment]


if _URGENT:
    from infermux.backends import torch_gpu

    _side, _, _rows = _URGENT.partition(":")
    if _side not in ("big", "small") or not _rows.isdigit():
        raise SystemExit(f"INFERMUX_BENCH_URGENT must be big:N or small:N, got {_URGENT!r}")
    _threshold = int(_rows)
    _launch = torch_gpu.GpuPath.launch

    def _by_size(
        self: torch_gpu.GpuPath, graph: object, requests: list[object], done: object
    ) -> object:
        rows = sum(getattr(r, "batch_size", 1) for r in requests)
        if (rows >= _threshold) != (_side == "big"):
            return _launch(self, graph, requests, done)  # type: ignore[arg-type]
        import torch

        own = self.stream
        # Kept on the instance's own stream object: it lives and dies with the instance (a map
        # by id() could hand a replaced instance's stream to a new one).
        urgent = getattr(own, "bench_urgent", None)
        if urgent is None:
            cuda: object = torch.cuda
            _least, greatest = cuda.Stream.priority_range()  # type: ignore[attr-defined]
            with torch.cuda.device(own.device):
                urgent = cuda.Stream(device=own.device, priority=greatest)  # type: ignore[attr-defined]
            urgent.wait_stream(own.stream)  # type: ignore[attr-defined]
            own.bench_urgent = urgent  # type: ignore[attr-defined]
        normal = own.stream
        own.stream = urgent  # type: ignore[assignment]
        try:
            return _launch(self, graph, requests, done)  # type: ignore[arg-type]
        finally:
            own.stream = normal

    torch_gpu.GpuPath.launch = _by_size  # type: ignore[assignment]


if _LAUNCHER:
    import contextlib
    import queue
    import threading

    from infermux.backends import torch_gpu as _torch_gpu
    from infermux.runtime.completions import COMPLETIONS

    if _LAUNCHER not in ("busy", "always"):
        raise SystemExit(f"INFERMUX_BENCH_LAUNCHER must be busy or always, got {_LAUNCHER!r}")
    _on_loop = _torch_gpu.GpuPath.launch
    _jobs: queue.SimpleQueue[object] = queue.SimpleQueue()
    _launcher: list[threading.Thread] = []

    def _serve_jobs() -> None:
        import torch

        # inference_mode is thread-local: the replay's output views are inference tensors.
        with torch.inference_mode():
            while True:
                _jobs.get()()  # type: ignore[operator]

    def _threaded(
        self: _torch_gpu.GpuPath, graph: object, requests: list[object], done: object
    ) -> object:
        if _LAUNCHER == "busy" and COMPLETIONS.watching == 0:
            return _on_loop(self, graph, requests, done)  # type: ignore[arg-type]
        import torch

        if not _launcher:
            thread = threading.Thread(target=_serve_jobs, name="gpu-launcher", daemon=True)
            thread.start()
            _launcher.append(thread)
        own = self.stream
        stream = own.stream
        handle = stream.cuda_stream
        device_id = own.device.index or 0
        start, end = own._start, own._done
        with torch.cuda.device(own.device), torch.cuda.stream(stream):
            start.record(stream)
            try:
                self.copy_in(graph, requests, handle, device_id)  # type: ignore[arg-type]
            except BaseException:
                end.record(stream)
                end.synchronize()
                own.finished()
                raise
        box: dict[str, object] = {}

        def job() -> None:
            try:
                with torch.cuda.device(own.device), torch.cuda.stream(stream):
                    box["staged"] = self.replay(graph, requests, handle, device_id)  # type: ignore[arg-type]
                    end.record(stream)
                    COMPLETIONS.watch(handle, end, done)  # type: ignore[arg-type]
            except BaseException as exc:
                box["error"] = exc
                with contextlib.suppress(Exception):
                    end.record(stream)
                    end.synchronize()
                done()  # type: ignore[operator]

        _jobs.put(job)

        def collect() -> object:
            error = box.get("error")
            if error is not None:
                own.finished()
                raise error  # type: ignore[misc]
            return self._collect(box["staged"], launched=True)  # type: ignore[arg-type]

        return collect

    _torch_gpu.GpuPath.launch = _threaded  # type: ignore[assignment]


if _FE_TIMING:
    import functools
    import json
    import time

    from infermux.frontends.grpc import servicer
    from infermux.transport import micro_batcher, remote_plane

    _sums = {"calls": 0, "handler_ns": 0, "executor_ns": 0, "holds": 0, "hold_ns": 0}
    _sums |= {"lag_probes": 0, "lag_ns": 0, "lag_max_ns": 0}
    _probing: list[object] = []

    def _probe_loop() -> None:
        """Every 5 ms, how long a callback waits for the running loop's next iteration."""
        if _probing:
            return
        import asyncio

        loop = asyncio.get_running_loop()
        _probing.append(loop)

        def tock(start: int) -> None:
            lag = time.perf_counter_ns() - start
            _sums["lag_probes"] += 1
            _sums["lag_ns"] += lag
            _sums["lag_max_ns"] = max(_sums["lag_max_ns"], lag)
            loop.call_later(0.005, tick)

        def tick() -> None:
            loop.call_soon(tock, time.perf_counter_ns())

        loop.call_soon(tick)

    def _flush() -> None:
        os.makedirs(_FE_TIMING, exist_ok=True)
        role = "ex" if _sums["frames"] else "fe"  # the executor answers the rings' frames
        path = os.path.join(_FE_TIMING, f"{role}-{os.getpid()}.json")
        with open(path + ".tmp", "w") as out:
            json.dump(_sums, out)
        os.replace(path + ".tmp", path)

    def _timed(method: object, key: str, count: str = "") -> object:
        @functools.wraps(method)  # type: ignore[arg-type]
        async def timed(*args: object, **kwargs: object) -> object:
            _probe_loop()
            start = time.perf_counter_ns()
            try:
                return await method(*args, **kwargs)  # type: ignore[operator]
            finally:
                _sums[key] += time.perf_counter_ns() - start
                if count:
                    _sums[count] += 1
                    if count == "calls" and _sums["calls"] % 2000 == 0:
                        _flush()

        return timed

    servicer.InferenceServicer.ModelInfer = _timed(  # type: ignore[method-assign]
        servicer.InferenceServicer.ModelInfer, "handler_ns", "calls"
    )
    remote_plane.RemoteDataPlane.infer = _timed(  # type: ignore[method-assign]
        remote_plane.RemoteDataPlane.infer, "executor_ns"
    )
    micro_batcher.MicroBatcher._gather = _timed(  # type: ignore[method-assign]
        micro_batcher.MicroBatcher._gather, "hold_ns", "holds"
    )

    from infermux.transport import channel_server

    _sums |= {"frames": 0, "requests": 0, "start_wait_ns": 0, "residence_ns": 0}
    _answer = channel_server.ChannelServer._infer

    def _resident(self: object, client: object, message: object) -> object:
        """``_infer``'s coroutine, made when the frame is dispatched: times the request from
        there (the task's wait to start, then the executor's whole work) to its answer's send."""
        dispatched = time.perf_counter_ns()
        rows = len(getattr(message, "rows", ())) or 1

        async def run() -> None:
            _probe_loop()
            started = time.perf_counter_ns()
            try:
                await _answer(self, client, message)  # type: ignore[arg-type]
            finally:
                _sums["frames"] += 1
                _sums["requests"] += rows
                _sums["start_wait_ns"] += (started - dispatched) * rows
                _sums["residence_ns"] += (time.perf_counter_ns() - dispatched) * rows
                if _sums["frames"] % 2000 == 0:
                    _flush()

        return run()

    channel_server.ChannelServer._infer = _resident  # type: ignore[assignment,method-assign]


if _GRAPH_EXEC:
    import ctypes

    from infermux.runtime import graphs as _graphs

    if _GRAPH_EXEC not in ("reinst", "driver"):
        raise SystemExit(f"INFERMUX_BENCH_GRAPH_EXEC must be reinst or driver, got {_GRAPH_EXEC!r}")
    _capture_one = _graphs._capture_one
    _cuda_lib: list[object] = []

    def _libcuda() -> object:
        if not _cuda_lib:
            lib = ctypes.CDLL("libcuda.so.1")
            p = ctypes.c_void_p
            for name, args in (
                ("cuGraphLaunch", (p, p)),
                ("cuGraphUpload", (p, p)),
                ("cuGraphInstantiateWithFlags", (p, p, ctypes.c_ulonglong)),
            ):
                function = getattr(lib, name)
                function.restype, function.argtypes = ctypes.c_int, args
            _cuda_lib.append(lib)
        return _cuda_lib[0]

    def _checked(name: str, result: int) -> None:
        if result != 0:
            raise RuntimeError(f"{name} failed with CUDA error {result}")

    class _DriverLaunched:
        """Stands in for a ``torch.cuda.CUDAGraph`` in a ``CapturedGraph``: ``replay()`` launches
        an executable graph on the current stream with ``cuGraphLaunch``; torch's graph is kept
        (it owns the graph's memory pool)."""

        def __init__(self, graph: object, stream: object) -> None:
            import torch

            self.torch_graph = graph
            self._lib: object = _libcuda()
            self._current = torch.cuda.current_stream
            if _GRAPH_EXEC == "driver":
                graph.instantiate()  # type: ignore[attr-defined]
                self._exec = int(graph.raw_cuda_graph_exec())  # type: ignore[attr-defined]
            else:
                exec_ = ctypes.c_void_p()
                raw = ctypes.c_void_p(int(graph.raw_cuda_graph()))  # type: ignore[attr-defined]
                _checked(
                    "cuGraphInstantiateWithFlags",
                    self._lib.cuGraphInstantiateWithFlags(ctypes.byref(exec_), raw, 0),  # type: ignore[attr-defined]
                )
                self._exec = exec_.value or 0
            handle = stream.cuda_stream  # type: ignore[attr-defined]
            _checked("cuGraphUpload", self._lib.cuGraphUpload(self._exec, handle))  # type: ignore[attr-defined]

        def replay(self) -> None:
            handle = self._current().cuda_stream
            _checked("cuGraphLaunch", self._lib.cuGraphLaunch(self._exec, handle))  # type: ignore[attr-defined]

    class _KeptGraphs:
        """``torch.cuda`` as ``_capture_one`` uses it, with graphs that keep their cudaGraph_t."""

        def __init__(self) -> None:
            import torch

            self.graph = torch.cuda.graph

        @staticmethod
        def CUDAGraph() -> object:  # torch's name
            import torch

            return torch.cuda.CUDAGraph(keep_graph=True)  # type: ignore[call-arg]

    def _captured_for_driver(
        bucket: object,
        inputs: object,
        forward: object,
        stream: object,
        *,
        pool: object,
        cuda: object,
    ) -> object:
        captured = _capture_one(bucket, inputs, forward, stream, pool=pool, cuda=_KeptGraphs())  # type: ignore[arg-type]
        stream.synchronize()  # type: ignore[attr-defined]
        captured.graph = _DriverLaunched(captured.graph, stream)  # type: ignore[attr-defined, assignment]
        return captured

    _graphs._capture_one = _captured_for_driver  # type: ignore[assignment]
