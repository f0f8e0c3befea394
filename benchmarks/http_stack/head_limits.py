"""Per-request cost of infermux's bounded httptools protocol (frontends/http/protocol.py) against
uvicorn's own, in-process: a keep-alive connection over a fake transport receives a request as
tritonclient sends it (a 7-header head and a 200-byte JSON body, or a bodyless GET), a trivial
ASGI app answers, the loop runs until the answer is written. Rounds alternate the two classes;
the median of rounds is printed (docs/decisions.md, "HTTP request limits").

    python benchmarks/http_stack/head_limits.py [--requests 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from infermux.frontends.http.protocol import protocol_class
from infermux.settings import HttpLimits

BODY = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":[' + b"1.0," * 15
BODY += b'1.0]}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":false}}]}'
POST = (
    b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: localhost:8000\r\n"
    b"User-Agent: python/gevent-http-client-1.5.5\r\nAccept-Encoding: gzip, deflate\r\n"
    b"Connection: keep-alive\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\r\n" % len(BODY)
) + BODY
GET = b"GET /v2/health/ready HTTP/1.1\r\nHost: localhost:8000\r\n\r\n"


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.answers = 0

    def write(self, data: Any) -> None:
        self.answers += 1

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def app(scope: Any, receive: Any, send: Any) -> None:
    while (await receive()).get("more_body", False):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b"ok"})


async def run(cls: type[asyncio.Protocol], request: bytes, count: int) -> float:
    config = uvicorn.Config(app, http=cls, lifespan="off", log_level="error")
    config.load()
    protocol: Any = cls(config=config, server_state=ServerState(), app_state={})  # type: ignore[call-arg]
    transport = Transport()
    protocol.connection_made(transport)
    started = time.perf_counter()
    for _ in range(count):
        protocol.data_received(request)
        # The answer is written once the task ends; polling is what is measured here.
        while protocol.tasks:  # noqa: ASYNC110
            await asyncio.sleep(0)
    elapsed = time.perf_counter() - started
    protocol.connection_lost(None)
    return elapsed / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    classes = {"uvicorn": HttpToolsProtocol, "bounded": protocol_class(HttpLimits())}
    for label, request in (("POST 7 headers + 200 B body", POST), ("GET health", GET)):
        times: dict[str, list[float]] = {name: [] for name in classes}
        for _ in range(args.rounds):
            for name, cls in classes.items():
                # uvloop, as infermux serves
                times[name].append(uvloop.run(run(cls, request, args.requests)))
        base, bounded = (statistics.median(times[n]) for n in ("uvicorn", "bounded"))
        print(f"{label}: uvicorn {base:.2f} us, bounded {bounded:.2f} us per request "
              f"(+{bounded - base:.2f} us, {bounded / base - 1:+.1%})")  # fmt: skip


if __name__ == "__main__":
    main()
