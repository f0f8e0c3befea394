"""The streaming benchmark's load: ``c`` concurrent gRPC ``ModelStreamInfer`` calls, each sending
one request at a time (the next once the previous one's final response came), spread over one or
more client processes; every response's arrival time recorded, then the figures.

Raw ``grpc.aio`` with the protobuf messages tritonclient ships (``tritonclient.grpc.service_pb2``),
not tritonclient's ``InferResult`` wrappers: a response costs the client a parse, a ``struct``
unpack and two list appends. Times are ``time.monotonic_ns()`` (the host's CLOCK_MONOTONIC), the
clock the model stamps its responses with, so the client can compare its arrival times with the
model's send times.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import struct
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

MODEL = "stream_tokens"
FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"
META = struct.Struct("<3q")  # [index, exec_ns, sent_ns]


@dataclass(frozen=True)
class Plan:
    """What one client process does for one point."""

    url: str  # host:port of the gRPC endpoint
    first_stream: int
    streams: int
    tokens: int
    delay_us: int
    payload: int  # FP32 elements in PROMPT (echoed in each response)
    start_ns: int  # streams begin (monotonic)
    stop_ns: int  # no request starts after this
    give_up_ns: int  # requests still running are abandoned
    streams_per_channel: int = 64
    marks_ns: tuple[int, ...] = ()  # when to sample this process's CPU time (window edges)


@dataclass
class Record:
    """What one client process saw: per request and per response, as flat lists."""

    req_stream: list[int] = field(default_factory=list)
    req_send: list[int] = field(default_factory=list)
    req_exec: list[int] = field(default_factory=list)
    req_first: list[int] = field(default_factory=list)  # index of its first response
    req_count: list[int] = field(default_factory=list)  # -1: unfinished or failed
    arrival: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cpu_marks: list[float] = field(default_factory=list)

    def arrays(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            key: np.asarray(getattr(self, key), np.int64)
            for key in ("req_stream", "req_send", "req_exec", "req_first", "req_count")
        }
        out["arrival"] = np.asarray(self.arrival, np.int64)
        out["sent"] = np.asarray(self.sent, np.int64)
        out["errors"] = self.errors[:20]
        out["error_count"] = len(self.errors)
        out["cpu_marks"] = self.cpu_marks
        return out


def base_request(plan: Plan) -> Any:
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=MODEL)
    for name, datatype, shape in (
        ("PROMPT", "FP32", [plan.payload]),
        ("N", "INT32", [1]),
        ("DELAY_US", "INT32", [1]),
    ):
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(np.arange(plan.payload, dtype=np.float32).tobytes())
    request.raw_input_contents.append(np.array([plan.tokens], np.int32).tobytes())
    request.raw_input_contents.append(np.array([plan.delay_us], np.int32).tobytes())
    request.parameters[EMPTY_FINAL].bool_param = True
    return request


async def drive(stub: Any, template: Any, stream: int, plan: Plan, rec: Record) -> None:
    """One stream: requests one after another until ``stop_ns``."""
    import grpc

    call = stub.ModelStreamInfer()
    clock = time.monotonic_ns
    arrival, sent = rec.arrival, rec.sent
    unpack = META.unpack_from
    k = 0
    # A request's responses are gathered apart and appended together once it ends, so that they
    # lie side by side in the process's record although the streams interleave.
    arrivals: list[int] = []
    sends: list[int] = []

    def flush(slot: int) -> None:
        rec.req_first[slot] = len(arrival)
        arrival.extend(arrivals)
        sent.extend(sends)
        arrivals.clear()
        sends.clear()

    slot = -1
    try:
        while clock() < plan.stop_ns:
            request = type(template)()
            request.CopyFrom(template)
            request.id = f"{stream}-{k}"
            k += 1
            slot = len(rec.req_send)
            rec.req_stream.append(stream)
            rec.req_first.append(0)
            rec.req_exec.append(0)
            rec.req_count.append(-1)
            rec.req_send.append(clock())
            await call.write(request)
            while True:
                message = await call.read()
                now = clock()
                if message is grpc.aio.EOF:
                    rec.errors.append(f"stream {stream}: ended by the server")
                    return
                if message.error_message:
                    rec.errors.append(f"stream {stream}: {message.error_message}")
                    return
                response = message.infer_response
                outputs = response.outputs
                if outputs:
                    position = 0 if outputs[0].name == "META" else 1
                    _, exec_ns, sent_ns = unpack(response.raw_output_contents[position])
                    if not arrivals:
                        rec.req_exec[slot] = exec_ns
                    arrivals.append(now)
                    sends.append(sent_ns)
                flag = response.parameters.get(FINAL)
                if flag.bool_param if flag is not None else len(arrivals) >= plan.tokens:
                    break
            rec.req_count[slot] = len(arrivals)
            flush(slot)
        await call.done_writing()
    except asyncio.CancelledError:
        call.cancel()
        raise
    except grpc.aio.AioRpcError as exc:
        rec.errors.append(f"stream {stream}: {exc.code().name} {exc.details()}")
    finally:
        if arrivals:  # an unfinished request's responses still count towards the rate
            flush(slot)


async def sample_cpu(marks: tuple[int, ...], rec: Record) -> None:
    for mark in marks:
        await asyncio.sleep(max(0.0, (mark - time.monotonic_ns()) / 1e9))
        rec.cpu_marks.append(time.process_time())


async def run_plan(plan: Plan) -> dict[str, Any]:
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    rec = Record()
    template = base_request(plan)
    # One TCP connection per channel (the local pool keeps grpc from sharing one between them).
    channels = [
        grpc.aio.insecure_channel(plan.url, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(max(1, -(-plan.streams // plan.streams_per_channel)))
    ]
    try:
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), timeout=30)
        stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in channels]
        await asyncio.sleep(max(0.0, (plan.start_ns - time.monotonic_ns()) / 1e9))
        cpu0, wall0 = time.process_time(), time.monotonic_ns()
        sampler = asyncio.create_task(sample_cpu(plan.marks_ns, rec))
        tasks = [
            asyncio.create_task(
                drive(stubs[i % len(stubs)], template, plan.first_stream + i, plan, rec)
            )
            for i in range(plan.streams)
        ]
        _, pending = await asyncio.wait(
            tasks, timeout=max(0.1, (plan.give_up_ns - time.monotonic_ns()) / 1e9)
        )
        for task in pending:
            task.cancel()
        if pending:
            rec.errors.append(f"{len(pending)} streams still running at the give-up time")
            await asyncio.gather(*pending, return_exceptions=True)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                rec.errors.append(f"{type(task.exception()).__name__}: {task.exception()}")
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        out = rec.arrays()
        out["cpu_s"] = time.process_time() - cpu0
        out["wall_s"] = (time.monotonic_ns() - wall0) / 1e9
        out["pid"] = os.getpid()
        return out
    finally:
        for channel in channels:
            await channel.close()


def worker(conn: Connection) -> None:
    """A client process: runs each plan it is sent, answers its record; None ends it."""
    while True:
        plan = conn.recv()
        if plan is None:
            return
        try:
            conn.send(asyncio.run(run_plan(plan)))
        except Exception as exc:  # reported by the parent with the point
            conn.send({"fatal": f"{type(exc).__name__}: {exc}"})


class Clients:
    """``processes`` client processes (spawned, so that no grpc state is forked)."""

    def __init__(self, processes: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs = []
        for _ in range(processes):
            parent, child = context.Pipe()
            proc = context.Process(target=worker, args=(child,), daemon=True)
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)

    def split(self, streams: int) -> list[tuple[int, int]]:
        """(first stream, streams) per process used: as even as possible, none empty."""
        used = min(streams, len(self.pipes))
        sizes = [streams // used + (1 if i < streams % used else 0) for i in range(used)]
        return [(sum(sizes[:i]), size) for i, size in enumerate(sizes)]

    def send(self, plans: list[Plan]) -> None:
        for pipe, plan in zip(self.pipes, plans, strict=False):
            pipe.send(plan)

    def receive(self, count: int, timeout: float) -> list[dict[str, Any]]:
        out = []
        for pipe in self.pipes[:count]:
            if not pipe.poll(timeout):
                raise RuntimeError("a client process did not answer")
            out.append(pipe.recv())
        return out

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()


def percentiles(values: np.ndarray[Any, Any], scale: float = 1e-3) -> dict[str, float]:
    """p50/p90/p99/max and the mean of ``values`` (ns), in µs by default."""
    if values.size == 0:
        return {"n": 0}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "n": int(values.size),
        "p50": round(float(p50) * scale, 1),
        "p90": round(float(p90) * scale, 1),
        "p99": round(float(p99) * scale, 1),
        "max": round(float(values.max()) * scale, 1),
        "mean": round(float(values.mean()) * scale, 1),
    }


def figures(records: list[dict[str, Any]], window: tuple[int, int], tokens: int) -> dict[str, Any]:
    """The point's figures from the client processes' records, over requests sent inside
    ``window`` (monotonic ns) and responses arriving inside it (for the rate); times in µs."""
    w0, w1 = window
    span = (w1 - w0) / 1e9
    ttfr, to_model, first_back, gaps, model_gaps, extra, delivery = ([] for _ in range(7))
    responses_in_window = requests = incomplete = 0
    for rec in records:
        arrival, sent = rec["arrival"], rec["sent"]
        responses_in_window += int(((arrival >= w0) & (arrival < w1)).sum())
        inside = (rec["req_send"] >= w0) & (rec["req_send"] < w1)
        for send, exec_ns, first, count in zip(
            rec["req_send"][inside],
            rec["req_exec"][inside],
            rec["req_first"][inside],
            rec["req_count"][inside],
            strict=True,
        ):
            if count != tokens:
                incomplete += 1
                continue
            requests += 1
            a = arrival[first : first + count]
            s = sent[first : first + count]
            ttfr.append(a[0] - send)
            to_model.append(exec_ns - send)
            first_back.append(a[0] - s[0])
            delivery.append(a - s)
            if count > 1:
                gap, model_gap = np.diff(a), np.diff(s)
                gaps.append(gap)
                model_gaps.append(model_gap)
                extra.append(gap - model_gap)

    def cat(parts: list[Any]) -> np.ndarray[Any, Any]:
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    return {
        "requests": requests,
        "incomplete_requests": incomplete,
        "responses_per_s": round(responses_in_window / span, 1),
        "requests_per_s": round(requests / span, 1),
        "ttfr_us": percentiles(np.asarray(ttfr, np.int64)),
        "to_model_us": percentiles(np.asarray(to_model, np.int64)),
        "first_back_us": percentiles(np.asarray(first_back, np.int64)),
        "gap_us": percentiles(cat(gaps)),
        "model_gap_us": percentiles(cat(model_gaps)),
        "gap_minus_model_gap_us": percentiles(cat(extra)),
        "delivery_us": percentiles(cat(delivery)),
        "responses_in_window": responses_in_window,
    }
