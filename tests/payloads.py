"""The shared V2 payloads in ``tests/data/payloads`` and how to send them with tritonclient."""

from __future__ import annotations

import json
import queue
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import triton_to_np_dtype

PAYLOADS = Path(__file__).parent / "data" / "payloads"
TRANSPORTS = ("http_json", "http_binary", "grpc", "grpc_aio", "grpc_stream")


@dataclass(frozen=True)
class Payload:
    name: str
    model: str
    inputs: dict[str, tuple[str, npt.NDArray[Any]]]
    outputs: dict[str, tuple[str, npt.NDArray[Any]]]


def _array(item: dict[str, Any]) -> tuple[str, npt.NDArray[Any]]:
    datatype, shape = item["datatype"], item["shape"]
    if datatype == "BYTES":
        flat = np.array(item["data"], dtype=np.object_).reshape(-1)
        data = np.array([s.encode() for s in flat], dtype=np.object_)
    else:
        data = np.array(item["data"], dtype=triton_to_np_dtype(datatype))
    return datatype, data.reshape(shape)


def load_payloads() -> list[Payload]:
    out = []
    for path in sorted(PAYLOADS.glob("*.json")):
        doc = json.loads(path.read_text())
        out.append(
            Payload(
                path.stem,
                doc["model"],
                {i["name"]: _array(i) for i in doc["inputs"]},
                {o["name"]: _array(o) for o in doc["outputs"]},
            )
        )
    return out


def _as_bytes(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    # tritonclient returns BYTES sent as JSON as str; compare everything as bytes.
    if array.dtype == np.object_:
        encode = np.vectorize(lambda v: v if isinstance(v, bytes) else v.encode(), otypes=[object])
        encoded: npt.NDArray[Any] = encode(array)
        return encoded
    return array


def run_payload(payload: Payload, transport: str, http_url: str, grpc_url: str) -> dict[str, Any]:
    """Send ``payload`` over ``transport`` and return the outputs (BYTES as bytes)."""
    if transport.startswith("http"):
        binary = transport == "http_binary"
        client = httpclient.InferenceServerClient(http_url)
        inputs = []
        for name, (datatype, data) in payload.inputs.items():
            infer_input = httpclient.InferInput(name, list(data.shape), datatype)
            infer_input.set_data_from_numpy(data, binary_data=binary)
            inputs.append(infer_input)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in payload.outputs]
        result: Any = client.infer(payload.model, inputs, outputs=outputs)
        client.close()
    else:
        g_inputs = []
        for name, (datatype, data) in payload.inputs.items():
            g_input = grpcclient.InferInput(name, list(data.shape), datatype)
            g_input.set_data_from_numpy(data)
            g_inputs.append(g_input)
        g_outputs = [grpcclient.InferRequestedOutput(n) for n in payload.outputs]
        if transport == "grpc":
            g_client = grpcclient.InferenceServerClient(grpc_url)
            result = g_client.infer(payload.model, g_inputs, outputs=g_outputs)
            g_client.close()
        elif transport == "grpc_stream":
            result = _stream(payload.model, grpc_url, g_inputs, g_outputs)
        else:
            import asyncio

            async def call() -> Any:
                aio = grpcaio.InferenceServerClient(grpc_url)
                try:
                    return await aio.infer(payload.model, g_inputs, outputs=g_outputs)
                finally:
                    await aio.close()

            result = asyncio.run(call())
    return {name: _as_bytes(result.as_numpy(name)) for name in payload.outputs}


def _stream(model: str, url: str, inputs: list[Any], outputs: list[Any]) -> Any:
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    client.async_stream_infer(model, inputs, outputs=outputs, request_id="s1")
    got = results.get(timeout=30)
    client.stop_stream()
    client.close()
    if isinstance(got, Exception):
        raise got
    return got
