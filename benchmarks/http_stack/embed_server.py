"""Run the benchmark ASGI app *inside our own event loop*, next to a grpc.aio server.

This is the shape infermux needs: one asyncio (uvloop) loop that hosts the HTTP
front end, a grpc.aio server and the data plane.

  python embed_server.py --mode uvicorn --port 8000 --grpc-port 8001
  python embed_server.py --mode granian --port 8000 --grpc-port 8001
  python embed_server.py --mode uvicorn --check   # self-test: HTTP + gRPC in one loop, then exit

The app records which thread / loop served each request so --check can prove that
HTTP handlers run on the same loop as the grpc.aio servicer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import sys
import threading
import time

import app as bench_app
import grpc
import uvloop

SEEN = {"http": set(), "grpc": set()}


async def tracing_app(scope, receive, send):
    if scope["type"] == "http" and scope["path"] == "/_whoami":
        SEEN["http"].add((threading.get_ident(), id(asyncio.get_running_loop())))
        body = b"ok"
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": body})
        return
    await bench_app.app(scope, receive, send)


# ----------------------------------------------------------------- grpc.aio side
async def _echo(request: bytes, context) -> bytes:
    SEEN["grpc"].add((threading.get_ident(), id(asyncio.get_running_loop())))
    return request


def _grpc_handler():
    ident = lambda b: b  # noqa: E731  raw bytes in/out, no protobuf needed
    return grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(
                _echo, request_deserializer=ident, response_serializer=ident
            )
        },
    )


async def start_grpc(port: int):
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_grpc_handler(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


# ----------------------------------------------------------------- HTTP side
class UvicornFront:
    def __init__(self, port: int):
        import uvicorn

        cfg = uvicorn.Config(
            tracing_app,
            host="127.0.0.1",
            port=port,
            http="httptools",
            loop="none",  # we own the loop
            lifespan="on",
            log_level="warning",
            access_log=False,
        )
        self.server = uvicorn.Server(cfg)
        # PITFALL: uvicorn>=0.29 Server.serve() wraps itself in capture_signals(), which
        # signal.signal()s SIGINT/SIGTERM for the whole process while serving, restores the
        # previous handlers afterwards and then *re-raises* the captured signal.  The host
        # process (which also runs grpc.aio + data plane) must own signals, so disable it.
        self.server.capture_signals = contextlib.nullcontext
        self.task = None

    async def start(self):
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.01)

    async def stop(self):
        self.server.should_exit = True
        await self.task


class GranianFront:
    def __init__(self, port: int):
        from granian.constants import Interfaces
        from granian.server.embed import Server

        self.server = Server(
            tracing_app,
            address="127.0.0.1",
            port=port,
            interface=Interfaces.ASGI,
            runtime_threads=1,
            websockets=False,
            log_level="warning",
        )
        self.port = port
        self.task = None

    async def start(self):
        self.task = asyncio.create_task(self.server.serve())
        # embed.Server has no "started" flag: poll the port
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.task.done():
                self.task.result()
            try:
                _r, w = await asyncio.open_connection("127.0.0.1", self.port)
                w.close()
                return
            except OSError:
                await asyncio.sleep(0.02)
        raise RuntimeError("granian embed did not start")

    async def stop(self):
        self.server.stop()
        await asyncio.wait_for(self.task, 10)


FRONTS = {"uvicorn": UvicornFront, "granian": GranianFront}


async def _http_get(port: int, path: str) -> tuple[int, bytes]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await r.read()
    w.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def _http_post(port: int, path: str, body: bytes, extra: str = "") -> tuple[int, bytes]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
        + body
    )
    data = await r.read()
    w.close()
    head, _, rbody = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rbody


async def check(mode: str, port: int, grpc_port: int) -> dict:
    res: dict = {"mode": mode}
    t0 = time.perf_counter()
    gsrv = await start_grpc(grpc_port)
    front = FRONTS[mode](port)
    await front.start()
    res["startup_s"] = round(time.perf_counter() - t0, 3)

    # concurrent HTTP + gRPC traffic from the same loop
    chan = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
    echo = chan.unary_unary("/bench.Echo/Echo")
    simple = bench_app.make_simple_body()
    ident_body, hlen = bench_app.make_identity_body()
    coros = []
    for _ in range(20):
        coros.append(_http_get(port, "/_whoami"))
        coros.append(echo(b"ping"))
        coros.append(
            _http_post(
                port, "/v2/models/simple/infer", simple, "Content-Type: application/json\r\n"
            )
        )
        coros.append(
            _http_post(
                port,
                "/v2/models/identity/infer",
                ident_body,
                f"Inference-Header-Content-Length: {hlen}\r\n",
            )
        )
    out = await asyncio.gather(*coros)
    res["http_ok"] = all(o[0] == 200 for o in out if isinstance(o, tuple))
    res["grpc_ok"] = all(o == b"ping" for o in out if isinstance(o, bytes))
    simple_resp = json.loads(out[2][1])
    res["simple_output0"] = simple_resp["outputs"][0]["data"][:4]
    await chan.close()

    here = (threading.get_ident(), id(asyncio.get_running_loop()))
    res["http_handler_threads_loops"] = len(SEEN["http"])
    res["http_on_main_loop"] = SEEN["http"] == {here}
    res["grpc_on_main_loop"] = SEEN["grpc"] == {here}
    res["loop_class"] = (
        type(asyncio.get_running_loop()).__module__
        + "."
        + type(asyncio.get_running_loop()).__name__
    )

    t1 = time.perf_counter()
    await front.stop()
    await gsrv.stop(grace=1)
    res["shutdown_s"] = round(time.perf_counter() - t1, 3)
    res["ok"] = (
        res["http_ok"] and res["grpc_ok"] and res["http_on_main_loop"] and res["grpc_on_main_loop"]
    )
    return res


async def serve_forever(mode: str, port: int, grpc_port: int):
    gsrv = await start_grpc(grpc_port)
    front = FRONTS[mode](port)
    await front.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    print(f"embed-{mode} ready", flush=True)
    await stop.wait()
    await front.stop()
    await gsrv.stop(grace=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=list(FRONTS), required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--grpc-port", type=int, default=0)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    port = a.port or _free_port()
    gport = a.grpc_port or _free_port()
    if a.check:
        try:
            res = uvloop.run(check(a.mode, port, gport))
        except Exception as e:  # report, don't crash the bench
            res = {"mode": a.mode, "ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(res))
        sys.exit(0 if res.get("ok") else 1)
    uvloop.run(serve_forever(a.mode, port, gport))


if __name__ == "__main__":
    main()
