"""Which channel should carry request headers between front-end processes and the executor?

Measures, between two processes on this machine, for a ~150-byte request header (the tensors
themselves stay in the shared-memory arena):

- ``socketpair``: asyncio streams on both ends, 4-byte length-prefixed frames;
- ``mp_pipe``: ``multiprocessing.Pipe`` (send_bytes/recv_bytes), the reading end watched by the
  event loop (``add_reader``);
- ``shm_ring``: infermux's own :class:`infermux.ipc.FrameRing`, one per direction, with a
  :class:`infermux.ipc.Doorbell` (eventfd) rung for every frame (the consumer drains everything
  available per wake-up).

and, in-process, the header codecs: msgspec (msgpack, typed Struct), orjson (dict), pickle
(dict, for reference only: infermux never unpickles what a client sent).

For each channel: round-trip latency with one frame in flight (p50/p99 over N frames), and
throughput with 64 frames in flight (frames/s, both directions counted once). Run:

    .venv/bin/python benchmarks/ipc/channel.py [--frames 20000] [--out benchmarks/results/ipc_channel.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import pickle
import platform
import socket
import statistics
import struct
import sys
import time
from multiprocessing import connection
from pathlib import Path
from typing import Any

import msgspec
import orjson

from infermux.ipc import Doorbell, FrameRing

HEADER = {
    "id": "req-000123",
    "model": "resnet50",
    "version": "",
    "inputs": [
        {
            "name": "INPUT__0",
            "datatype": "UINT8",
            "shape": [1, 224, 224, 3],
            "offset": 1_048_576,
            "size": 150_528,
        }
    ],
    "outputs": [{"name": "OUTPUT__0"}],
    "parameters": {"priority": 0},
}


class Input(msgspec.Struct, array_like=True):
    name: str
    datatype: str
    shape: list[int]
    offset: int
    size: int


class Output(msgspec.Struct, array_like=True):
    name: str


class Header(msgspec.Struct, array_like=True):
    id: str
    model: str
    version: str
    inputs: list[Input]
    outputs: list[Output]
    parameters: dict[str, Any]


def typed_header() -> Header:
    (item,) = HEADER["inputs"]  # type: ignore[misc]
    return Header(
        id=str(HEADER["id"]),
        model=str(HEADER["model"]),
        version=str(HEADER["version"]),
        inputs=[Input(**item)],
        outputs=[Output(name="OUTPUT__0")],
        parameters=dict(HEADER["parameters"]),  # type: ignore[call-overload]
    )


# --------------------------------------------------------------------------- codecs (in-process)
def codecs(n: int) -> dict[str, dict[str, float]]:
    header = typed_header()
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(Header)
    cases = {
        "msgspec_msgpack_struct": (lambda: encoder.encode(header), decoder.decode),
        "orjson_dict": (lambda: orjson.dumps(HEADER), orjson.loads),
        "pickle_dict": (lambda: pickle.dumps(HEADER, protocol=5), pickle.loads),
    }
    out = {}
    for name, (encode, decode) in cases.items():
        data = encode()
        start = time.perf_counter()
        for _ in range(n):
            encode()
        enc = (time.perf_counter() - start) / n
        start = time.perf_counter()
        for _ in range(n):
            decode(data)
        dec = (time.perf_counter() - start) / n
        out[name] = {"bytes": len(data), "encode_us": enc * 1e6, "decode_us": dec * 1e6}
    return out


# --------------------------------------------------------------------------- echo servers
def echo_socketpair(sock: socket.socket) -> None:
    async def main() -> None:
        reader, writer = await asyncio.open_connection(sock=sock)
        while True:
            try:
                size = struct.unpack("<I", await reader.readexactly(4))[0]
            except asyncio.IncompleteReadError:
                return
            frame = await reader.readexactly(size)
            writer.write(struct.pack("<I", len(frame)) + frame)

    asyncio.run(main())


def echo_pipe(conn: connection.Connection) -> None:
    while True:
        try:
            conn.send_bytes(conn.recv_bytes())
        except EOFError:
            return


def echo_ring(rings: tuple[FrameRing, FrameRing], bells: tuple[Doorbell, Doorbell]) -> None:
    # A forked child: the rings' mappings and the doorbells' eventfds are inherited. It never
    # closes the rings, whose segments the parent owns and unlinks.
    inbound, outbound = rings
    wake_in, wake_out = bells

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = loop.create_future()

        def ready() -> None:
            wake_in.clear()
            for frame in inbound.take():
                if frame == b"":
                    stop.set_result(None)
                    return
                while not outbound.put(frame):
                    pass
                wake_out.ring()

        loop.add_reader(wake_in.fileno(), ready)
        await stop

    asyncio.run(main())


# --------------------------------------------------------------------------- clients
async def drive(
    send: Any, receive: Any, frames: int, in_flight: int, payload: bytes
) -> dict[str, float]:
    """``send(bytes)``; ``await receive()`` -> one echoed frame. Latency with 1 in flight, rate with many."""
    latencies = []
    for _ in range(min(frames, 5000)):
        start = time.perf_counter()
        send(payload)
        await receive()
        latencies.append(time.perf_counter() - start)
    latencies.sort()
    start = time.perf_counter()
    sent = 0
    for _ in range(in_flight):
        send(payload)
        sent += 1
    for _ in range(frames):
        await receive()
        if sent < frames + in_flight:
            send(payload)
            sent += 1
    rate = frames / (time.perf_counter() - start)
    for _ in range(sent - frames):
        await receive()
    return {
        "rtt_p50_us": statistics.median(latencies) * 1e6,
        "rtt_p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
        "frames_per_s": rate,
    }


def run_socketpair(frames: int, in_flight: int, payload: bytes) -> dict[str, float]:
    # Fork before any event loop exists in this process: a child forked from inside a running
    # loop inherits its state.
    mine, theirs = socket.socketpair()
    # daemon, and terminated below: the forked child inherits this end too, so it never sees EOF.
    process = multiprocessing.get_context("fork").Process(
        target=echo_socketpair, args=(theirs,), daemon=True
    )
    process.start()
    theirs.close()
    import uvloop

    result = uvloop.run(_client_socketpair(mine, frames, in_flight, payload))
    process.terminate()
    process.join(10)
    return result


async def _client_socketpair(
    mine: socket.socket, frames: int, in_flight: int, payload: bytes
) -> dict[str, float]:
    reader, writer = await asyncio.open_connection(sock=mine)

    def send(data: bytes) -> None:
        writer.write(struct.pack("<I", len(data)) + data)

    async def receive() -> bytes:
        size = struct.unpack("<I", await reader.readexactly(4))[0]
        return await reader.readexactly(size)

    result = await drive(send, receive, frames, in_flight, payload)
    writer.close()
    return result


def run_pipe(frames: int, in_flight: int, payload: bytes) -> dict[str, float]:
    mine, theirs = multiprocessing.Pipe()
    process = multiprocessing.get_context("fork").Process(
        target=echo_pipe, args=(theirs,), daemon=True
    )
    process.start()
    theirs.close()
    import uvloop

    result = uvloop.run(_client_pipe(mine, frames, in_flight, payload))
    mine.close()
    process.terminate()
    process.join(10)
    return result


async def _client_pipe(
    mine: connection.Connection, frames: int, in_flight: int, payload: bytes
) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    def readable() -> None:
        while mine.poll():
            queue.put_nowait(mine.recv_bytes())

    loop.add_reader(mine.fileno(), readable)
    result = await drive(mine.send_bytes, queue.get, frames, in_flight, payload)
    loop.remove_reader(mine.fileno())
    return result


def run_ring(frames: int, in_flight: int, payload: bytes) -> dict[str, float]:
    rings = (FrameRing.create(1 << 20), FrameRing.create(1 << 20))  # to the echo, back
    bells = (Doorbell(), Doorbell())
    process = multiprocessing.get_context("fork").Process(
        target=echo_ring, args=(rings, bells), daemon=True
    )
    process.start()
    import uvloop

    result = uvloop.run(_client_ring(rings, bells, frames, in_flight, payload))
    process.join(10)
    for ring in rings:
        ring.close()
    for bell in bells:
        bell.close()
    return result


async def _client_ring(
    rings: tuple[FrameRing, FrameRing],
    bells: tuple[Doorbell, Doorbell],
    frames: int,
    in_flight: int,
    payload: bytes,
) -> dict[str, float]:
    out_ring, in_ring = rings
    wake_echo, wake_me = bells
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    def readable() -> None:
        wake_me.clear()
        for frame in in_ring.take():
            queue.put_nowait(frame)

    loop.add_reader(wake_me.fileno(), readable)

    def send(data: bytes) -> None:
        while not out_ring.put(data):
            pass
        wake_echo.ring()

    result = await drive(send, queue.get, frames, in_flight, payload)
    send(b"")
    loop.remove_reader(wake_me.fileno())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ipc_channel.json"))
    args = parser.parse_args()

    payload = msgspec.msgpack.encode(typed_header())
    results: dict[str, Any] = {
        "benchmark": "ipc_channel",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "platform": platform.platform(),
            "nproc": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "payload_bytes": len(payload),
        "codecs": codecs(50000),
        "channels": {},
    }
    runners = {"socketpair": run_socketpair, "mp_pipe": run_pipe, "shm_ring": run_ring}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    for _ in range(args.rounds):  # interleaved, so drift in machine load hits every channel
        for name, runner in runners.items():
            rounds[name].append(runner(args.frames, 64, payload))
    for name, runs in rounds.items():
        results["channels"][name] = {
            key: statistics.median(r[key] for r in runs) for key in runs[0]
        }
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# IPC channel for request headers (2 processes, this machine)",
        "",
        f"Header: {len(payload)} bytes of msgpack; median of {args.rounds} interleaved rounds, "
        f"{args.frames} frames each; 64 in flight for the rate.",
        "",
        "| channel | RTT p50 µs | RTT p99 µs | frames/s (64 in flight) |",
        "|---|---:|---:|---:|",
    ]
    for name, r in results["channels"].items():
        lines.append(
            f"| {name} | {r['rtt_p50_us']:.1f} | {r['rtt_p99_us']:.1f} | {r['frames_per_s']:,.0f} |"
        )
    lines += ["", "| header codec | bytes | encode µs | decode µs |", "|---|---:|---:|---:|"]
    for name, r in results["codecs"].items():
        lines.append(f"| {name} | {r['bytes']} | {r['encode_us']:.2f} | {r['decode_us']:.2f} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
