"""The coordinator: asks the server what the model takes, starts the worker processes, runs each
level (warm-up, then windows until stable), reads the server's statistics around the measured
windows, and hands the levels to the reports. It sends no requests itself."""

from __future__ import annotations

import math
import multiprocessing
import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.table import Table

from . import report, worker
from .inputs import make_inputs
from .measure import Level, Window, server_breakdown, server_totals, stable, summarize
from .options import BenchOptions

GRACE_S = 0.25  # a window is cut this long after its end, once every worker has flushed


class BenchError(Exception):
    """Why a benchmark could not run (server unreachable, model unknown, bad input data)."""


class _Server:
    """Synchronous V2 calls the coordinator makes (metadata, config, statistics)."""

    def __init__(self, options: BenchOptions) -> None:
        self._options = options
        if options.protocol == "grpc":
            import tritonclient.grpc as module
        else:
            import tritonclient.http as module
        self._grpc = options.protocol == "grpc"
        self._client: Any = module.InferenceServerClient(options.address)

    def _json(self, method: str, *args: Any) -> dict[str, Any]:
        call = getattr(self._client, method)
        result: dict[str, Any] = call(*args, as_json=True) if self._grpc else call(*args)
        return result

    def metadata(self) -> dict[str, Any]:
        return self._json("get_model_metadata", self._options.model, self._options.model_version)

    def batched(self, metadata: dict[str, Any]) -> bool:
        """Whether the model takes a batch dimension: its config says (max_batch_size > 0), or,
        on a server without the model configuration extension (MLServer), every input's first
        dimension is variable."""
        try:
            config = self._json(
                "get_model_config", self._options.model, self._options.model_version
            )
        except Exception:
            inputs = metadata.get("inputs", [])
            return bool(inputs) and all(int(i["shape"][0]) == -1 for i in inputs if i["shape"])
        config = config.get("config", config)
        return int(config.get("max_batch_size", config.get("maxBatchSize", 0)) or 0) > 0

    def statistics(self) -> dict[str, tuple[int, int]] | None:
        try:
            document = self._json(
                "get_inference_statistics", self._options.model, self._options.model_version
            )
        except Exception:  # a server without the statistics extension
            return None
        return server_totals(document, self._options.model_version)

    def close(self) -> None:
        self._client.close()


def run(options: BenchOptions, console: Console | None = None) -> list[Level]:
    """Every level of ``options``; raises :class:`BenchError` when the benchmark cannot run."""
    console = console or Console(stderr=True)
    try:
        server = _Server(options)
        metadata = server.metadata()
        batched = server.batched(metadata)
    except Exception as exc:
        raise BenchError(
            f"cannot reach model '{options.model}' at {options.address}: {exc}"
        ) from None
    if not batched and options.batch_size > 1:
        raise BenchError(f"model '{options.model}' does not batch: use -b 1")
    try:
        inputs = make_inputs(
            metadata, batched, options.batch_size, options.input_data, options.shapes
        )
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    outputs = [
        (o["name"], o["datatype"], _request_shape(o["shape"], batched, options.batch_size))
        for o in metadata.get("outputs", [])
    ]
    if options.shared_memory != "none" and options.open_loop:
        raise BenchError("--shared-memory needs a closed loop (--concurrency-range)")
    levels = []
    with _workers(options, inputs, outputs) as (commands, results):
        for index, value in enumerate(options.levels):
            levels.append(
                _level(
                    options, server, commands, results, value=value, index=index, console=console
                )
            )
            _show(console, options, levels[-1])
    server.close()
    Console().print(summary_table(options, levels))
    report.write(options, levels)
    return levels


def _request_shape(shape: list[Any], batched: bool, batch: int) -> tuple[int, ...]:
    dims = [int(d) for d in shape]
    if batched:
        dims[0] = batch
    return tuple(dims)


@contextmanager
def _workers(
    options: BenchOptions,
    inputs: dict[str, Any],
    outputs: list[tuple[str, str, tuple[int, ...]]],
) -> Iterator[tuple[list[Any], Any]]:
    context = multiprocessing.get_context("spawn")
    results: Any = context.Queue()
    commands: list[Any] = [context.Queue() for _ in range(options.processes)]
    processes = [
        context.Process(
            target=worker.main,
            args=(worker.Job(i, options, inputs, outputs), commands[i], results),
            name=f"infermux-bench-{i}",
            daemon=True,
        )
        for i in range(options.processes)
    ]
    for process in processes:
        process.start()
    try:
        ready = 0
        while ready < len(processes):
            message = _get(results, 60)
            if message[0] == "error":
                raise BenchError(f"load generator {message[1]}: {message[2]}")
            ready += message[0] == "ready"
        yield commands, results
    finally:
        for command in commands:
            command.put(("stop",))
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()


def _get(results: Any, timeout: float) -> tuple[Any, ...]:
    try:
        message: tuple[Any, ...] = results.get(timeout=timeout)
    except queue.Empty:
        raise BenchError("the load generator processes stopped answering") from None
    return message


def _shares(options: BenchOptions, value: float) -> list[float]:
    n = options.processes
    if options.open_loop:
        return [value / n] * n
    whole = int(value)
    return [float(whole // n + (i < whole % n)) for i in range(n)]


def _level(
    options: BenchOptions,
    server: _Server,
    commands: list[Any],
    results: Any,
    *,
    value: float,
    index: int,
    console: Console,
) -> Level:
    for command, share in zip(commands, _shares(options, value), strict=True):
        command.put(("level", share))
    started = time.monotonic()
    warm_until = started + (options.warmup_s if index == 0 else min(options.warmup_s, 1.0))
    windows: list[Window] = []
    pending: list[tuple[float, float, bool]] = []
    before = None
    label = f"{'rate' if options.open_loop else 'concurrency'} {value:g}"
    with console.status(f"{label}: warming up") as status:
        _collect(results, pending, warm_until + GRACE_S)
        pending = [s for s in pending if s[0] >= warm_until]
        before = server.statistics()
        window_start = warm_until
        while True:
            end = window_start + options.window_s
            _collect(results, pending, end + GRACE_S)
            window = Window(window_start, end)
            rest = []
            for sample in pending:
                if sample[0] < end:
                    if sample[2]:
                        window.latencies.append(sample[1])
                    else:
                        window.failures += 1
                else:
                    rest.append(sample)
            pending = rest
            windows.append(window)
            status.update(
                f"{label}: window {len(windows)}: {window.throughput:,.1f} req/s, "
                f"p99 {window.p99 * 1e3:,.2f} ms"
            )
            is_stable = stable(windows, options.stability)
            if is_stable or len(windows) >= options.max_windows:
                break
            window_start = end
    after = server.statistics()
    for command in commands:
        command.put(("next",))
    cpu = 0.0
    done = 0
    while done < len(commands):
        message = _get(results, 60)
        if message[0] == "done":
            cpu += message[2]
            done += 1
        elif message[0] == "error":
            raise BenchError(f"load generator {message[1]}: {message[2]}")
    breakdown = server_breakdown(before, after) if before and after else {}
    return summarize(
        value,
        windows,
        batch_size=options.batch_size,
        cpu_s=cpu,
        wall_s=time.monotonic() - started,
        server=breakdown,
        is_stable=is_stable,
    )


def _collect(results: Any, pending: list[tuple[float, float, bool]], until: float) -> None:
    while (left := until - time.monotonic()) > 0:
        try:
            message = results.get(timeout=left)
        except queue.Empty:
            return
        if message[0] == "samples":
            pending.extend(message[2])
        elif message[0] == "error":
            raise BenchError(f"load generator {message[1]}: {message[2]}")


def _show(console: Console, options: BenchOptions, level: Level) -> None:
    lat = level.latency_us
    console.print(
        f"{'rate' if options.open_loop else 'concurrency'} {level.level:g}: "
        f"{level.inferences_per_s:,.1f} infer/s, p50 {lat.get('p50', math.nan) / 1000:,.2f} ms, "
        f"p99 {lat.get('p99', math.nan) / 1000:,.2f} ms, {level.failures} failed, "
        f"client CPU {level.client_cpu_cores:.2f} cores" + ("" if level.stable else " (not stable)")
    )


def summary_table(options: BenchOptions, levels: list[Level]) -> Table:
    """Every level in one table (printed at the end)."""
    table = Table(title=f"{options.model} over {options.protocol}", box=None)
    first = "rate" if options.open_loop else "conc."
    for column in (first, "infer/s", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "p99.9 ms",
                   "failed", "queue µs", "compute µs", "client CPU"):  # fmt: skip
        table.add_column(column, justify="right")
    for level in levels:
        lat = level.latency_us
        compute = sum(
            level.server.get(f"compute_{k}_us", 0.0) for k in ("input", "infer", "output")
        )
        table.add_row(
            f"{level.level:g}" + ("" if level.stable else "*"),
            f"{level.inferences_per_s:,.1f}",
            *(f"{lat.get(p, math.nan) / 1000:,.2f}" for p in ("p50", "p90", "p95", "p99", "p99.9")),
            str(level.failures),
            f"{level.server.get('queue_us', math.nan):,.0f}",
            f"{compute:,.0f}" if level.server else "-",
            f"{level.client_cpu_cores:.2f}",
        )
    return table
