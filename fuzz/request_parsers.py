"""Coverage-guided fuzzing (atheris / libFuzzer) of the request parsers a client's bytes reach
first: the HTTP V2 body (JSON, with or without the binary tensor extension), the gRPC
``ModelInferRequest`` deserializer and decoding, and the HTTP/1.1 request head as the bounded
protocol reads it. A finding is any exception but :class:`InfermuxError` (the front ends would
answer 500), an HTTP answer other than the limits' (200, 400, 408, 413, 414, 431), a head
buffered past its limit by more than one read, or a crash.

    pip install atheris
    python fuzz/request_parsers.py -max_total_time=60 fuzz/corpus   # seeds: fuzz/seeds.py

Input layout: byte 0 picks the parser (0: HTTP JSON body, 1: HTTP body with the next two bytes
as ``Inference-Header-Content-Length``, 2: gRPC protobuf, 3: an HTTP byte stream, fed to
:class:`BoundedHttpToolsProtocol` in reads of the next byte's size, under small limits so that
random inputs reach them), the rest is the body.

``tests/e2e/test_malformed.py``, ``tests/unit/frontends/test_fuzz_codecs.py`` and
``tests/unit/frontends/http/test_protocol.py`` cover the same ground in CI with hypothesis and a
seeded mutator; this harness is for longer, guided runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import atheris
import uvicorn
from tritonclient.grpc import service_pb2
from uvicorn.server import ServerState

# Only infermux's own modules are instrumented: instrumenting everything loaded (grpc,
# protobuf, numpy glue) takes minutes before the first input and finds nothing of ours.
with atheris.instrument_imports(include=["infermux"]):
    from infermux.errors import InfermuxError
    from infermux.frontends.grpc import codec as grpc_codec
    from infermux.frontends.grpc.handlers import Malformed, tolerant
    from infermux.frontends.http import codec as http_codec
    from infermux.frontends.http.protocol import protocol_class
    from infermux.settings import HttpLimits

LIMITS = HttpLimits(max_header_size=2048, max_header_line_size=512, max_header_count=16)
ANSWERS = {200, 400, 408, 413, 414, 431}


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    while (await receive()).get("more_body", False):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


_LOOP = asyncio.new_event_loop()
_CONFIG = uvicorn.Config(_ok, http=protocol_class(LIMITS), lifespan="off", log_level="critical")
_CONFIG.load()
_STATE = ServerState()


def _http_stream(data: bytes) -> None:
    step, stream = (data[0] if data else 0) + 1, data[1:]
    protocol = _CONFIG.http_protocol_class(  # type: ignore[call-arg]
        config=_CONFIG, server_state=_STATE, app_state={}, _loop=_LOOP
    )
    transport = _Transport()
    protocol.connection_made(transport)
    for start in range(0, len(stream), step):
        if transport.closed:
            break
        protocol.data_received(stream[start : start + step])
        assert protocol._head_received <= LIMITS.max_header_size + step
        _LOOP.run_until_complete(asyncio.sleep(0))
    protocol.connection_lost(None)
    _LOOP.run_until_complete(asyncio.sleep(0))
    for answer in bytes(transport.written).split(b"HTTP/1.1 ")[1:]:
        assert int(answer[:3]) in ANSWERS, bytes(transport.written[:300])


# The gRPC server's own deserializer: it must turn any bytes into a message or Malformed, never
# raise (grpc would log a traceback and answer UNKNOWN).
parse_infer_request = tolerant(service_pb2.ModelInferRequest)


def one_input(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 4, data[1:]
    if mode == 3:
        _http_stream(body)
        return
    if mode == 2:
        message = parse_infer_request(body)
        if isinstance(message, Malformed):  # answered INVALID_ARGUMENT before the codec
            return
        with contextlib.suppress(InfermuxError):
            grpc_codec.decode_infer_request(message)
        return
    header = None
    if mode == 1:
        header, body = int.from_bytes(body[:2], "little"), body[2:]
    with contextlib.suppress(InfermuxError):
        http_codec.decode_infer_request(body, header, "m", "")


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
