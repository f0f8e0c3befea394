"""The protocol clients the load generator drives: one ``Driver`` per client process, holding
every slot's prepared request.

- ``grpc_shm``: gRPC with system shared memory: every slot registers its own input and output
  region once; requests carry only region names, the answer is read from the output region.
- ``grpc``: gRPC with the tensor bytes in ``raw_input_contents`` / ``raw_output_contents``.
- ``http``: KServe V2 over HTTP with Triton's binary tensor extension.
- ``http_json``: the peers' ``POST /predict`` with base64 in JSON (see peers.py).

Implementations (``--grpc-client``, ``--http-client``): ``stub`` sends a ``ModelInferRequest``
serialised once per slot through a bare ``grpc.aio`` channel, ``aiohttp`` posts a body built once
per slot; ``tritonclient`` uses ``tritonclient.grpc.aio`` / ``tritonclient.http.aio``, which
rebuild the request on every call.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from specs import ModelSpec

SHM_PREFIX = "imxb"
REQUEST_TIMEOUT_S = 120.0  # unbatched peers queue for seconds at high concurrency


@dataclass
class Target:
    """What one client process talks to, and how."""

    protocol: str
    model: str
    tiny: bool
    ref_dir: str
    http_url: str = ""  # base URL (infermux) or the full /predict URL (peers)
    grpc_target: str = ""  # host:port
    grpc_client: str = "stub"
    http_client: str = "aiohttp"


class Driver(Protocol):
    async def setup(self, slots: int) -> None: ...

    async def infer(self, slot: int) -> npt.NDArray[Any]: ...

    async def close(self) -> None: ...


def _v2_inputs(spec: ModelSpec, ref: dict[str, npt.NDArray[Any]]) -> list[tuple[str, Any, Any]]:
    return [(t.name, [1, *t.dims], ref[t.name]) for t in spec.inputs]


class GrpcStub:
    """Pre-serialised ``ModelInferRequest`` per slot on one bare grpc.aio channel."""

    def __init__(self, target: Target, spec: ModelSpec, ref: dict[str, npt.NDArray[Any]]) -> None:
        self._target, self._spec, self._ref = target, spec, ref
        self._shm = target.protocol == "grpc_shm"
        self._regions = SharedRegions(target, spec, ref) if self._shm else None
        self._requests: list[bytes] = []
        self._channel: Any = None
        self._call: Any = None

    async def setup(self, slots: int) -> None:
        import grpc
        from tritonclient.grpc import service_pb2

        self._pb = service_pb2
        options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        self._channel = grpc.aio.insecure_channel(self._target.grpc_target, options=options)
        self._call = self._channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=None,  # requests are bytes already
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        if self._regions is not None:
            self._regions.create(slots)
        for slot in range(slots):
            request = service_pb2.ModelInferRequest(model_name=self._spec.name)
            offset = 0
            for t in self._spec.inputs:
                tensor = request.inputs.add(name=t.name, datatype=t.datatype, shape=[1, *t.dims])
                if self._regions is not None:
                    _set_shm(
                        tensor.parameters, self._regions.input_name(slot), t.item_bytes, offset
                    )
                    offset += t.item_bytes
                else:
                    request.raw_input_contents.append(self._ref[t.name].tobytes())
            output = request.outputs.add(name=self._spec.output.name)
            if self._regions is not None:
                _set_shm(
                    output.parameters, self._regions.output_name(slot), self._spec.output.item_bytes
                )
            self._requests.append(request.SerializeToString())

    async def infer(self, slot: int) -> npt.NDArray[Any]:
        response = await self._call(self._requests[slot], timeout=REQUEST_TIMEOUT_S)
        out = response.outputs[0]
        if self._regions is not None:
            return self._regions.read_output(slot)
        return np.frombuffer(response.raw_output_contents[0], dtype=_np(out.datatype)).reshape(
            list(out.shape)
        )

    async def close(self) -> None:
        if self._regions is not None:
            self._regions.destroy()
        if self._channel is not None:
            await self._channel.close()


def _set_shm(parameters: Any, region: str, size: int, offset: int = 0) -> None:
    parameters["shared_memory_region"].string_param = region
    parameters["shared_memory_byte_size"].int64_param = size
    if offset:
        parameters["shared_memory_offset"].int64_param = offset


def _np(datatype: str) -> Any:
    return {"FP16": np.float16, "FP32": np.float32, "UINT8": np.uint8, "INT64": np.int64}[datatype]


class GrpcTritonClient:
    """``tritonclient.grpc.aio``: InferInput objects built once per slot, request built per call."""

    def __init__(self, target: Target, spec: ModelSpec, ref: dict[str, npt.NDArray[Any]]) -> None:
        self._target, self._spec, self._ref = target, spec, ref
        self._regions = SharedRegions(target, spec, ref) if target.protocol == "grpc_shm" else None
        self._slots: list[tuple[list[Any], list[Any]]] = []

    async def setup(self, slots: int) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.grpc.aio import InferenceServerClient

        self._client = InferenceServerClient(self._target.grpc_target)
        if self._regions is not None:
            self._regions.create(slots)
        for slot in range(slots):
            inputs, offset = [], 0
            for name, shape, array in _v2_inputs(self._spec, self._ref):
                item = grpcclient.InferInput(name, shape, _datatype(array))
                if self._regions is not None:
                    item.set_shared_memory(self._regions.input_name(slot), array.nbytes, offset)
                    offset += array.nbytes
                else:
                    item.set_data_from_numpy(array)
                inputs.append(item)
            output = grpcclient.InferRequestedOutput(self._spec.output.name)
            if self._regions is not None:
                output.set_shared_memory(
                    self._regions.output_name(slot), self._spec.output.item_bytes
                )
            self._slots.append((inputs, [output]))

    async def infer(self, slot: int) -> npt.NDArray[Any]:
        inputs, outputs = self._slots[slot]
        result = await self._client.infer(
            self._spec.name, inputs, outputs=outputs, client_timeout=REQUEST_TIMEOUT_S
        )
        if self._regions is not None:
            return self._regions.read_output(slot)
        array: npt.NDArray[Any] = result.as_numpy(self._spec.output.name)
        return array

    async def close(self) -> None:
        if self._regions is not None:
            self._regions.destroy()
        await self._client.close()


def _datatype(array: npt.NDArray[Any]) -> str:
    from tritonclient.utils import np_to_triton_dtype

    name: str = np_to_triton_dtype(array.dtype)
    return name


class SharedRegions:
    """One input and one output system shared-memory region per slot, registered once (through
    the synchronous gRPC client, before the load starts) and removed at the end."""

    PER_SLOT = 2
    """Regions a slot registers: what a server's region limit must allow per slot."""

    def __init__(self, target: Target, spec: ModelSpec, ref: dict[str, npt.NDArray[Any]]) -> None:
        self._target, self._spec, self._ref = target, spec, ref
        self._prefix = f"{SHM_PREFIX}_{os.getpid()}"
        self._inputs: list[Any] = []
        self._outputs: list[Any] = []
        self._registered: list[str] = []

    def input_name(self, slot: int) -> str:
        return f"{self._prefix}_{slot}_in"

    def output_name(self, slot: int) -> str:
        return f"{self._prefix}_{slot}_out"

    def create(self, slots: int) -> None:
        import tritonclient.grpc as grpcclient

        self._client = grpcclient.InferenceServerClient(self._target.grpc_target)
        in_bytes = sum(t.item_bytes for t in self._spec.inputs)
        out_bytes = self._spec.output.item_bytes
        arrays = [self._ref[t.name] for t in self._spec.inputs]
        try:
            self._create(slots, in_bytes, out_bytes, arrays)
        except BaseException:
            self.destroy()  # a refused registration must not leak the regions made so far
            raise

    def _create(
        self, slots: int, in_bytes: int, out_bytes: int, arrays: list[npt.NDArray[Any]]
    ) -> None:
        import tritonclient.utils.shared_memory as shm

        for slot in range(slots):
            for name, size, handles in (
                (self.input_name(slot), in_bytes, self._inputs),
                (self.output_name(slot), out_bytes, self._outputs),
            ):
                handle = shm.create_shared_memory_region(name, "/" + name, size)
                handles.append(handle)
                if handles is self._inputs:
                    shm.set_shared_memory_region(handle, arrays)  # back to back: offsets add up
                self._client.register_system_shared_memory(name, "/" + name, size)
                self._registered.append(name)

    def read_output(self, slot: int) -> npt.NDArray[Any]:
        import tritonclient.utils.shared_memory as shm

        out = self._spec.output
        # Copied out, as a real client would before the slot's next request overwrites it.
        return np.array(
            shm.get_contents_as_numpy(self._outputs[slot], np.dtype(out.dtype), [1, *out.dims])
        )

    def destroy(self) -> None:
        import tritonclient.utils.shared_memory as shm

        for name in self._registered:
            try:
                self._client.unregister_system_shared_memory(name)
            except Exception as exc:  # the server may be gone; the regions still go below
                print(f"unregister {name}: {exc}", file=sys.stderr)
        for handle in self._inputs + self._outputs:
            shm.destroy_shared_memory_region(handle)
        self._registered, self._inputs, self._outputs = [], [], []


class HttpBinary:
    """KServe V2 over HTTP with the binary tensor extension; one body built per slot."""

    def __init__(self, target: Target, spec: ModelSpec, ref: dict[str, npt.NDArray[Any]]) -> None:
        self._target, self._spec, self._ref = target, spec, ref
        self._url = f"{target.http_url}/v2/models/{spec.name}/infer"

    async def setup(self, slots: int) -> None:
        import aiohttp

        header = {
            "inputs": [
                {
                    "name": name,
                    "shape": shape,
                    "datatype": _datatype(array),
                    "parameters": {"binary_data_size": array.nbytes},
                }
                for name, shape, array in _v2_inputs(self._spec, self._ref)
            ],
            "outputs": [{"name": self._spec.output.name, "parameters": {"binary_data": True}}],
        }
        head = json.dumps(header, separators=(",", ":")).encode()
        self._body = head + b"".join(self._ref[t.name].tobytes() for t in self._spec.inputs)
        self._headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(head)),
        }
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),  # one keep-alive connection per slot
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        )

    async def infer(self, slot: int) -> npt.NDArray[Any]:
        async with self._session.post(self._url, data=self._body, headers=self._headers) as r:
            data = await r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
            length = int(r.headers["Inference-Header-Content-Length"])
        out = json.loads(data[:length])["outputs"][0]
        array: npt.NDArray[Any] = np.frombuffer(data[length:], dtype=_np(out["datatype"]))
        return array.reshape(out["shape"])

    async def close(self) -> None:
        await self._session.close()


class HttpTritonClient:
    """``tritonclient.http.aio`` with binary tensors."""

    def __init__(self, target: Target, spec: ModelSpec, ref: dict[str, npt.NDArray[Any]]) -> None:
        self._target, self._spec, self._ref = target, spec, ref

    async def setup(self, slots: int) -> None:
        import tritonclient.http as httpclient
        from tritonclient.http.aio import InferenceServerClient

        url = self._target.http_url.removeprefix("http://")
        self._client = InferenceServerClient(url, conn_limit=max(slots, 1), conn_timeout=60.0)
        self._inputs = []
        for name, shape, array in _v2_inputs(self._spec, self._ref):
            item = httpclient.InferInput(name, shape, _datatype(array))
            item.set_data_from_numpy(array, binary_data=True)
            self._inputs.append(item)
        self._outputs = [httpclient.InferRequestedOutput(self._spec.output.name, binary_data=True)]

    async def infer(self, slot: int) -> npt.NDArray[Any]:
        result = await self._client.infer(
            self._spec.name, self._inputs, outputs=self._outputs, timeout=int(REQUEST_TIMEOUT_S)
        )
        array: npt.NDArray[Any] = result.as_numpy(self._spec.output.name)
        return array

    async def close(self) -> None:
        await self._client.close()


class HttpJson:
    """The peers' ``POST /predict``: base64 in JSON both ways (see peers.py)."""

    def __init__(self, target: Target, spec: ModelSpec, ref: dict[str, npt.NDArray[Any]]) -> None:
        self._target, self._spec, self._ref = target, spec, ref

    async def setup(self, slots: int) -> None:
        import aiohttp

        payload = {
            t.name: base64.b64encode(self._ref[t.name].tobytes()).decode()
            for t in self._spec.inputs
        }
        self._body = json.dumps(payload).encode()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            headers={"Content-Type": "application/json"},
        )

    async def infer(self, slot: int) -> npt.NDArray[Any]:
        async with self._session.post(self._target.http_url, data=self._body) as r:
            data = await r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
        raw = base64.b64decode(json.loads(data)[self._spec.output.name])
        return np.frombuffer(raw, dtype=np.float16).reshape(1, *self._spec.output.dims)

    async def close(self) -> None:
        await self._session.close()


def make_driver(target: Target, spec: ModelSpec, ref: dict[str, npt.NDArray[Any]]) -> Driver:
    if target.protocol in ("grpc", "grpc_shm"):
        if target.grpc_client == "tritonclient":
            return GrpcTritonClient(target, spec, ref)
        return GrpcStub(target, spec, ref)
    if target.protocol == "http":
        if target.http_client == "tritonclient":
            return HttpTritonClient(target, spec, ref)
        return HttpBinary(target, spec, ref)
    if target.protocol == "http_json":
        return HttpJson(target, spec, ref)
    raise ValueError(f"unknown protocol {target.protocol!r}")
