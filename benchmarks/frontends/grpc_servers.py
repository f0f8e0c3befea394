"""What a gRPC request costs the server's CPU, by server design (issue 24, item 3).

The same client (a grpc.aio stub in its own process, ``simple``-shaped ModelInfer requests: two
INT32 [1, 16] inputs as raw contents, ``--concurrency`` in flight) drives each server in turn, and
the server's whole process group's CPU time is read from /proc before and after: CPU µs per
request is the figure, as it does not depend on how many cores the machine lends the server.

    aio-echo      grpc.aio, a handler that returns a prebuilt answer: grpc.aio's own floor
    sync-echo     grpcio's thread-pool server (16 threads), the same handler
    sync-loop     the thread-pool server with its handler handing each call to an asyncio loop
                  on a thread of its own and waiting for the answer there, as a synchronous
                  front end would have to (infermux's data plane lives on a loop)
    aio-codec     grpc.aio plus infermux's codec (decode the request, encode an answer built
                  from its inputs): a leaner servicer's floor, with no data plane
    infermux      ``infermux serve --frontends 1``: codec, data plane, batcher, the model
    infermux-f2   ``infermux serve --frontends 2``: the same over the process hop

    python benchmarks/frontends/grpc_servers.py [--requests 20000] [--concurrency 16]
        [--variants aio-echo,sync-echo,sync-loop,aio-codec,infermux,infermux-f2] [--rounds 2]
        [--out benchmarks/results/frontends]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import cpu_seconds, free_port, group_pids, machine_info, stop_group

VARIANTS = ("aio-echo", "sync-echo", "sync-loop", "aio-codec", "infermux", "infermux-f2")
READY = re.compile(r"gRPC on [^ ]*?:(\d+)")


# ----------------------------------------------------------------------------- servers
def _request() -> Any:
    import numpy as np
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32")
        tensor.shape.extend([1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    return request


def _echo_answer() -> Any:
    from tritonclient.grpc import service_pb2

    response = service_pb2.ModelInferResponse(model_name="simple", model_version="1")
    for name in ("OUTPUT0", "OUTPUT1"):
        tensor = response.outputs.add(name=name, datatype="INT32")
        tensor.shape.extend([1, 16])
        response.raw_output_contents.append(bytes(64))
    return response


def serve(variant: str, port: int) -> None:
    """Run one of the bare servers (not infermux) until killed."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    answer = _echo_answer()
    if variant in ("sync-echo", "sync-loop"):
        from concurrent import futures

        loop = None
        if variant == "sync-loop":
            import threading

            import uvloop

            loop = uvloop.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True).start()

        async def on_loop() -> Any:
            return answer

        class SyncEcho(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
            def ModelInfer(self, request: Any, context: Any) -> Any:
                if loop is None:
                    return answer
                return asyncio.run_coroutine_threadsafe(on_loop(), loop).result()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(SyncEcho(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print(f"ready: gRPC on 127.0.0.1:{port}", flush=True)
        server.wait_for_termination()
        return

    from infermux.frontends.grpc import codec
    from infermux.types import InferResponse

    class AioServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
        async def ModelInfer(self, request: Any, context: Any) -> Any:
            if variant == "aio-echo":
                return answer
            decoded = codec.decode_infer_request(request)
            outputs = [
                type(t)(f"OUTPUT{i}", t.datatype, t.shape, t.data)
                for i, t in enumerate(decoded.inputs)
            ]
            return codec.encode_infer_response(InferResponse("simple", "1", outputs, decoded.id))

    async def main() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(AioServicer(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print(f"ready: gRPC on 127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()

    import uvloop

    uvloop.run(main())


def start(variant: str, work: Path) -> tuple[subprocess.Popen[str], int]:
    if variant.startswith("infermux"):
        frontends = "2" if variant.endswith("f2") else "1"
        command = [sys.executable, "-m", "infermux", "serve", "--host", "127.0.0.1",
                   "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
                   "--frontends", frontends]  # fmt: skip
    else:
        command = [sys.executable, __file__, "serve", variant, str(free_port())]
    log = (work / f"{variant}.log").open("w")
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None
    deadline = time.monotonic() + 120
    for line in process.stdout:
        log.write(line)
        match = READY.search(line)
        if match:
            # Keep draining the output so that the server never blocks on a full pipe.
            import threading

            threading.Thread(target=_drain, args=(process, log), daemon=True).start()
            return process, int(match.group(1))
        if time.monotonic() > deadline:
            break
    stop_group(process)
    raise SystemExit(f"{variant} did not start: see {work / f'{variant}.log'}")


def _drain(process: subprocess.Popen[str], log: Any) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        log.write(line)


# ----------------------------------------------------------------------------- client
def drive(port: int, requests: int, concurrency: int) -> float:
    """Send ``requests`` ModelInfer calls, ``concurrency`` in flight; the seconds it took."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    async def main() -> float:
        request = _request()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            left = requests

            async def worker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await stub.ModelInfer(request)

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return time.perf_counter() - started

    import uvloop

    return uvloop.run(main())


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    process, port = start(variant, args.out)
    try:
        client = [sys.executable, __file__, "drive", str(port), str(args.requests // 10), "4"]
        subprocess.run(client, check=True, capture_output=True)  # warm-up
        pids = group_pids(process.pid)
        before = cpu_seconds(pids)
        client[4:6] = [str(args.requests), str(args.concurrency)]
        done = subprocess.run(client, check=True, capture_output=True, text=True)
        seconds = float(done.stdout.strip().splitlines()[-1])
        used = cpu_seconds(pids) - before
    finally:
        stop_group(process)
    return {
        "variant": variant,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "seconds": round(seconds, 3),
        "requests_per_s": round(args.requests / seconds, 1),
        "server_cpu_us_per_request": round(used / args.requests * 1e6, 1),
        "server_cores": round(used / seconds, 3),
    }


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], int(sys.argv[3]))
        return
    if sys.argv[1:2] == ["drive"]:
        print(drive(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parents[1] / "results" / "frontends"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for round_ in range(args.rounds):
        for variant in args.variants.split(","):
            row = measure(variant, args) | {"round": round_ + 1}
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {"machine": machine_info(), "rows": rows}
    (args.out / "grpc_servers.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# gRPC server CPU per request (c={args.concurrency}, {args.requests:,} requests, "
        f"{machine_info()['nproc']} cores)",
        "",
        "| variant | round | req/s | server CPU µs/request | server cores |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['variant']} | {r['round']} | {r['requests_per_s']:,.0f} | "
        f"{r['server_cpu_us_per_request']:,.1f} | {r['server_cores']} |"
        for r in rows
    ]
    text = "\n".join(lines) + "\n"
    (args.out / "grpc_servers.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
