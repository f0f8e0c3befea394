"""Coverage-guided fuzzing (atheris / libFuzzer) of the request parsers a client's bytes reach
first: the HTTP V2 body (JSON, with or without the binary tensor extension) and the gRPC
``ModelInferRequest`` deserializer and decoding. A finding is any exception but
:class:`InfermuxError` (the front ends would answer 500) or a crash.

    pip install atheris
    python fuzz/request_parsers.py -max_total_time=60 fuzz/corpus   # seeds: fuzz/seeds.py

Input layout: byte 0 picks the parser (0: HTTP JSON body, 1: HTTP body with the next two bytes
as ``Inference-Header-Content-Length``, 2: gRPC protobuf), the rest is the body.

``tests/e2e/test_malformed.py`` and ``tests/unit/frontends/test_fuzz_codecs.py`` cover the same
ground in CI with hypothesis and a seeded mutator; this harness is for longer, guided runs.
"""

from __future__ import annotations

import contextlib
import sys

import atheris
from tritonclient.grpc import service_pb2

# Only infermux's own modules are instrumented: instrumenting everything loaded (grpc,
# protobuf, numpy glue) takes minutes before the first input and finds nothing of ours.
with atheris.instrument_imports(include=["infermux"]):
    from infermux.errors import InfermuxError
    from infermux.frontends.grpc import codec as grpc_codec
    from infermux.frontends.grpc.handlers import Malformed, tolerant
    from infermux.frontends.http import codec as http_codec


# The gRPC server's own deserializer: it must turn any bytes into a message or Malformed, never
# raise (grpc would log a traceback and answer UNKNOWN).
parse_infer_request = tolerant(service_pb2.ModelInferRequest)


def one_input(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 3, data[1:]
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
