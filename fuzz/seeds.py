"""Writes the seed corpus for ``request_parsers.py`` (valid requests of each kind, so that the
fuzzer starts inside the grammar rather than at random bytes).

    python fuzz/seeds.py fuzz/corpus
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from tritonclient.grpc import service_pb2


def seeds() -> dict[str, bytes]:
    tensor = {"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]}
    strings = {"name": "S", "datatype": "BYTES", "shape": [2], "data": ["ab", "c"]}
    doc = {"id": "r", "inputs": [tensor, strings], "outputs": [{"name": "OUT"}],
           "parameters": {"p": 1}}  # fmt: skip
    binary_in = {"name": "B", "datatype": "FP32", "shape": [2],
                 "parameters": {"binary_data_size": 8}}  # fmt: skip
    header = json.dumps({"inputs": [binary_in]}).encode()
    binary = header + np.arange(2, dtype=np.float32).tobytes()
    request = service_pb2.ModelInferRequest(model_name="m")
    item = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 4])
    item.contents.int_contents.extend([1, 2, 3, 4])
    raw = request.inputs.add(name="R", datatype="BYTES", shape=[1])
    del raw  # its bytes go in raw_input_contents, as tritonclient sends them
    request.raw_input_contents.extend([np.arange(4, dtype=np.int32).tobytes(), b"\x01\0\0\0z"])
    # Past numpy's 64 dimensions (issue 23: a 500 / INTERNAL the fuzzers had not reached).
    deep = {"name": "D", "datatype": "FP32", "shape": [1] * 65, "data": [1.0]}
    deep_request = service_pb2.ModelInferRequest(model_name="m")
    deep_request.inputs.add(name="D", datatype="FP32", shape=[1] * 65)
    deep_request.raw_input_contents.append(b"\0\0\0\0")
    # HTTP heads (mode 3, read 64 bytes at a time) of each size class the limits draw lines at.
    health = b"GET /v2/health/live HTTP/1.1\r\nHost: h\r\n"
    post = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}"
    heads = {
        "head_small": health + b"\r\n",
        "head_post": post,
        "head_long_line": health + b"X-Long: " + b"l" * 600 + b"\r\n\r\n",
        "head_many": health + b"".join(b"X-%d: v\r\n" % i for i in range(20)) + b"\r\n",
        "head_large": health + b"".join(b"X-%d: " % i + b"v" * 400 + b"\r\n" for i in range(6)),
        "head_unterminated": health + b"X-Open: " + b"o" * 3000,
        "head_pipelined": health + b"\r\n" + post + health + b"\r\n",
    }
    return {
        "json": b"\0" + json.dumps(doc).encode(),
        "binary": b"\1" + len(header).to_bytes(2, "little") + binary,
        "grpc": b"\2" + request.SerializeToString(),
        "json_deep": b"\0" + json.dumps({"inputs": [deep]}).encode(),
        "grpc_deep": b"\2" + deep_request.SerializeToString(),
        **{name: b"\3\x3f" + head for name, head in heads.items()},
    }


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus")
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in seeds().items():
        (folder / name).write_bytes(data)
