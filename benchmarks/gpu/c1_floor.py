"""The floor of c=1 latency on this host: perf_analyzer against a server that does nothing but wait.

Issue 24's c=1 target is the raw batch-1 latency + 0.4 ms (gRPC + shm) or + 0.6 ms (HTTP). Part
of any server's c=1 latency is not the server's: perf_analyzer's own send and receive, its
thread's wake-up when the answer comes (a thread that slept about a millisecond runs 0.3-0.5 ms
late on the H200 host, ``docs/decisions.md``), and the gRPC stack. This serves a bare KServe V2
gRPC endpoint (grpc.aio on uvloop, as infermux's front ends, or grpcio's thread-pool server,
whose handlers run on C-core's threads) for one model whose "inference" is a wait of
``--work-us`` (spinning, as a server polling its GPU batch does, or sleeping), and drives it with
perf_analyzer at c=1 over plain gRPC: p50 minus the work is what the client and the gRPC stack
cost here, a floor for any Python gRPC server on this host. ``http`` is the same for HTTP: a
bare ASGI app on uvicorn with uvloop and httptools (the stack of infermux's HTTP front end)
answering KServe V2 with binary tensors, driven over ``--protocols pa_http``.
``infermux-f1``/``infermux-f2`` serve the same model with ``infermux serve --frontends 1``/``2``
(a Python model that spins the wait on its instance thread, ``max_queue_delay_microseconds:
0``), over either protocol: what infermux adds over the floor, and the front end <-> executor hop.

    python3 benchmarks/gpu/c1_floor.py --work-us 0,900 --out $OUT/c1_floor.json
    python3 benchmarks/gpu/c1_floor.py --protocols pa_grpc,pa_http --out $OUT/c1_floor.json

The model: ``floor``, one FP32 input and output of ``--elements`` elements (4 by default; the
request's size is not the point here).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # benchmarks/: benchkit

import perfanalyzer  # noqa: E402
from benchkit import free_port, stop_group  # noqa: E402

MODEL = "floor"
SERVERS = ("aio", "sync", "http", "infermux-f1", "infermux-f2")
PROTOCOLS = {"aio": ("pa_grpc",), "sync": ("pa_grpc",), "http": ("pa_http",)}
"""Which protocols a bare server speaks (infermux speaks both)."""
INFERMUX_MODEL = """
import time
from typing import Any

WORK_S = {work_s}


class Model:
    def execute(self, requests: list[Any]) -> list[Any]:
        until = time.perf_counter() + WORK_S
        while time.perf_counter() < until:
            pass
        return [{{"OUTPUT0": r.inputs["INPUT0"]}} for r in requests]
"""
INFERMUX_CONFIG = """name: "floor"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ {elements} ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ {elements} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 0 }}
"""


def _wait(seconds: float, spin: bool) -> None:
    if not spin:
        time.sleep(seconds)
        return
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def _servicer(elements: int, work_s: float, spin: bool, aio: bool) -> Any:
    from tritonclient.grpc import model_config_pb2 as mc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    tensor = {"datatype": "FP32", "shape": [1, elements]}
    metadata = pb.ModelMetadataResponse(
        name=MODEL,
        versions=["1"],
        platform="python",
        inputs=[pb.ModelMetadataResponse.TensorMetadata(name="INPUT0", **tensor)],
        outputs=[pb.ModelMetadataResponse.TensorMetadata(name="OUTPUT0", **tensor)],
    )
    config = pb.ModelConfigResponse(
        config=mc.ModelConfig(
            name=MODEL,
            backend="python",
            max_batch_size=8,
            input=[mc.ModelInput(name="INPUT0", data_type=mc.TYPE_FP32, dims=[elements])],
            output=[mc.ModelOutput(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[elements])],
        )
    )

    def answer(request: Any) -> Any:
        _wait(work_s, spin)
        response = pb.ModelInferResponse(model_name=MODEL, model_version="1", id=request.id)
        out = response.outputs.add(name="OUTPUT0", datatype="FP32")
        out.shape.extend(request.inputs[0].shape)
        response.raw_output_contents.append(request.raw_input_contents[0])
        return response

    replies = {
        "ServerLive": pb.ServerLiveResponse(live=True),
        "ServerReady": pb.ServerReadyResponse(ready=True),
        "ModelReady": pb.ModelReadyResponse(ready=True),
        "ServerMetadata": pb.ServerMetadataResponse(name="floor", version="0", extensions=[]),
        "ModelMetadata": metadata,
        "ModelConfig": config,
    }

    def handler(reply: Callable[[Any], Any]) -> Any:
        """A servicer method answering ``reply(request)``: a coroutine for grpc.aio (it blocks
        the loop: at c=1 nothing else waits for it), a plain function for the thread pool."""
        if aio:

            async def call(self: Any, request: Any, context: Any) -> Any:
                return reply(request)

            return call

        def plain(self: Any, request: Any, context: Any) -> Any:
            return reply(request)

        return plain

    methods = {name: handler(lambda _, fixed=fixed: fixed) for name, fixed in replies.items()}
    methods["ModelInfer"] = handler(answer)
    base = service_pb2_grpc.GRPCInferenceServiceServicer
    return type("Floor", (base,), methods)()


def http_app(elements: int, work_s: float, spin: bool) -> Any:
    """A bare KServe V2 HTTP endpoint as an ASGI app: health, metadata, config, and an inference
    that waits and echoes its input as a binary output (perf_analyzer sends binary inputs)."""
    tensor = {"datatype": "FP32", "shape": [-1, elements]}
    fixed = {
        "/v2": {"name": "floor", "version": "0", "extensions": []},
        f"/v2/models/{MODEL}": {
            "name": MODEL,
            "versions": ["1"],
            "platform": "python",
            "inputs": [{"name": "INPUT0", **tensor}],
            "outputs": [{"name": "OUTPUT0", **tensor}],
        },
        f"/v2/models/{MODEL}/config": {
            "name": MODEL,
            "backend": "python",
            "max_batch_size": 8,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [elements]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [elements]}],
        },
    }
    bodies = {path: json.dumps(value).encode() for path, value in fixed.items()}
    empty = {"/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}/ready"}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"]
        headers: list[tuple[bytes, bytes]] = []
        if scope["method"] == "POST" and path == f"/v2/models/{MODEL}/infer":
            given = dict(scope["headers"]).get(b"inference-header-content-length")
            split = int(given) if given is not None else len(body)
            request = json.loads(body[:split])
            (tensor_in,) = request["inputs"]
            data = body[split:] or struct.pack(f"<{elements}f", *tensor_in["data"])
            _wait(work_s, spin)
            output = {"name": "OUTPUT0", "datatype": "FP32", "shape": tensor_in["shape"]}
            output["parameters"] = {"binary_data_size": len(data)}
            answer = {"model_name": MODEL, "model_version": "1", "outputs": [output]}
            if request.get("id"):
                answer["id"] = request["id"]
            header = json.dumps(answer).encode()
            headers.append((b"inference-header-content-length", str(len(header)).encode()))
            status, payload = 200, header + data
        elif path in bodies:
            status, payload = 200, bodies[path]
        elif path in empty:
            status, payload = 200, b""
        else:
            status, payload = 404, b'{"error": "not found"}'
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return app


def serve(kind: str, port: int, elements: int, work_us: int, spin: bool) -> None:
    """Run one floor server until killed (a child process of its own)."""
    work_s = work_us / 1e6
    if kind == "http":
        import socket

        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", port))
        sock.listen(128)  # connections made before uvicorn runs wait in the backlog
        config = uvicorn.Config(
            http_app(elements, work_s, spin),
            loop="uvloop",
            http="httptools",
            lifespan="off",
            log_level="warning",
            access_log=False,
        )
        print("ready", flush=True)
        uvicorn.Server(config).run(sockets=[sock])
        return
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    if kind == "sync":
        from concurrent import futures

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        servicer = _servicer(elements, work_s, spin, aio=False)
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print("ready", flush=True)
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server()
        servicer = _servicer(elements, work_s, spin, aio=True)
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    import uvloop

    uvloop.run(main())


def measure(
    pa: list[str],
    kind: str,
    work_us: int,
    *,
    spin: bool,
    protocol: str,
    args: argparse.Namespace,
    work: Path,
) -> dict[str, Any]:
    port = free_port()
    http = protocol == "pa_http"
    if kind.startswith("infermux"):
        repo = work / f"repo-{work_us}"
        (repo / MODEL / "1").mkdir(parents=True, exist_ok=True)
        (repo / MODEL / "config.pbtxt").write_text(INFERMUX_CONFIG.format(elements=args.elements))
        source = INFERMUX_MODEL.format(work_s=work_us / 1e6)
        (repo / MODEL / "1" / "model.py").write_text(source)
        command = [sys.executable, "-m", "infermux", "serve", "--model-repository", str(repo),
                   "--host", "127.0.0.1", "--http-port", str(port) if http else "0",
                   "--grpc-port", "0" if http else str(port),
                   "--metrics-port", "-1", "--frontends", kind.rpartition("-f")[2],
                   *shlex.split(args.infermux_args)]  # fmt: skip
    else:
        command = [sys.executable, __file__, "--serve", kind, str(port), str(args.elements)]
        command += [str(work_us), "spin" if spin else "sleep"]
    server = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        seen = []
        for line in server.stdout:  # infermux logs its start-up before the ready line
            seen.append(line)
            if "ready" in line:
                break
        else:
            return {"error": f"the server did not start: {''.join(seen)[-2000:]}"}
        threading.Thread(target=server.stdout.read, daemon=True).start()  # never block it
        data = work / "input.json"
        values = [0.5] * args.elements
        data.write_text(json.dumps({"data": [{"INPUT0": values}]}))
        stem = f"pa-{kind}-{protocol}-{work_us}-{'spin' if spin else 'sleep'}"
        argv = perfanalyzer.command(
            pa,
            model=MODEL,
            url=f"127.0.0.1:{port}",
            protocol=protocol,
            concurrency=1,
            input_data=data,
            csv_path=work / f"{stem}.csv",
            interval_ms=args.interval_ms,
            stability=25,
            max_trials=5,
            extra=[],
        )
        result = perfanalyzer.run(argv, work / f"{stem}.log", warmup=1.0, timeout=120)
        return {"pa_command": " ".join(argv), **result}
    finally:
        stop_group(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-us", default="0,900", help="the model's wait, comma-separated")
    parser.add_argument("--servers", default=",".join(SERVERS), help=f"of {', '.join(SERVERS)}")
    parser.add_argument("--waits", default="spin,sleep", help="spin, sleep or both")
    parser.add_argument("--protocols", default="pa_grpc", help="pa_grpc, pa_http or both")
    parser.add_argument("--elements", type=int, default=4)
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--perf-analyzer", default="")
    parser.add_argument("--infermux-args", default="", help="more `infermux serve` flags")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--serve", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        kind, port, elements, work_us, wait = args.serve
        serve(kind, int(port), int(elements), int(work_us), wait == "spin")
        return
    pa, found = perfanalyzer.locate(args.perf_analyzer, HERE.parents[1])
    if pa is None:
        raise SystemExit(found)
    rows = []
    work = Path(tempfile.mkdtemp(prefix="c1-floor-"))
    try:
        for protocol, kind, work_us, wait in points(args):
            spin = wait == "spin"
            reading = measure(pa, kind, work_us, spin=spin, protocol=protocol, args=args, work=work)
            p50 = reading.get("p50_ms")
            row = {"server": kind, "protocol": protocol, "work_us": work_us, "wait": wait}
            row.update(reading)
            if p50 is not None:
                row["p50_over_work_ms"] = round(p50 - work_us / 1000, 3)
            rows.append(row)
            print(
                f"{kind:5} {protocol} work {work_us:5d} us ({wait:5}): p50 {fmt(p50)} ms, "
                f"p99 {fmt(reading.get('p99_ms'))} ms, over the work "
                f"{fmt(row.get('p50_over_work_ms'))} ms {reading.get('error', '')}",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    document = {"perf_analyzer": found, "elements": args.elements, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(document, indent=2) + "\n")


def points(args: argparse.Namespace) -> list[tuple[str, str, int, str]]:
    """(protocol, server, work, wait) to measure: each server over the protocols it speaks;
    no sleeping variant of no wait at all, nor of infermux's model (it spins)."""
    made = []
    for protocol in args.protocols.split(","):
        for kind in args.servers.split(","):
            if protocol not in PROTOCOLS.get(kind, ("pa_grpc", "pa_http")):
                continue
            for work_us in (int(w) for w in args.work_us.split(",")):
                for wait in args.waits.split(","):
                    if (work_us == 0 or kind.startswith("infermux")) and wait == "sleep":
                        continue
                    made.append((protocol, kind, work_us, wait))
    return made


def fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
