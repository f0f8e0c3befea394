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
    return {
        "json": b"\0" + json.dumps(doc).encode(),
        "binary": b"\1" + len(header).to_bytes(2, "little") + binary,
        "grpc": b"\2" + request.SerializeToString(),
    }


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus")
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in seeds().items():
        (folder / name).write_bytes(data)
