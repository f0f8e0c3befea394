"""Every V2 datatype round-trips through an identity model, over JSON and binary encodings."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.http as httpclient

from infermux.types import DATATYPES
from tests.support import ServerProcess, identity_name

pytestmark = pytest.mark.e2e

# BF16 cannot be sent as JSON by tritonclient (it refuses); FP16 can.
JSON_DATATYPES = [d for d in DATATYPES if d != "BF16"]


def sample(datatype: str, shape: tuple[int, ...] = (2, 5)) -> npt.NDArray[Any]:
    rng = np.random.default_rng(abs(hash(datatype)) % 1000)
    count = int(np.prod(shape))
    if datatype == "BYTES":
        values = [f"v{i}-{'é' * (i % 3)}".encode() for i in range(count)]
        return np.array(values, dtype=np.object_).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if datatype == "BF16":
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    dtype = np.dtype(httpclient.triton_to_np_dtype(datatype))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 1000).astype(dtype)


def roundtrip(server: ServerProcess, datatype: str, binary: bool) -> npt.NDArray[Any]:
    client = httpclient.InferenceServerClient(server.url)
    data = sample(datatype)
    infer_input = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    infer_input.set_data_from_numpy(data, binary_data=binary)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer(identity_name(datatype), [infer_input], outputs=[output])
    client.close()
    got: npt.NDArray[Any] | None = result.as_numpy("OUTPUT0")
    assert got is not None
    out = result.get_output("OUTPUT0")
    assert out is not None
    assert out["datatype"] == datatype
    assert out["shape"] == list(data.shape)
    return got


@pytest.mark.parametrize("datatype", DATATYPES)
def test_binary_roundtrip(test_server: ServerProcess, datatype: str) -> None:
    np.testing.assert_array_equal(roundtrip(test_server, datatype, True), sample(datatype))


@pytest.mark.parametrize("datatype", JSON_DATATYPES)
def test_json_equals_binary(test_server: ServerProcess, datatype: str) -> None:
    as_json = roundtrip(test_server, datatype, False)
    as_binary = roundtrip(test_server, datatype, True)
    if datatype == "BYTES":  # tritonclient returns JSON BYTES as str
        as_json = np.vectorize(lambda s: s.encode(), otypes=[object])(as_json)
    np.testing.assert_array_equal(as_json, as_binary)
    np.testing.assert_array_equal(as_binary, sample(datatype))


def test_bf16_json_is_accepted(test_server: ServerProcess) -> None:
    """BF16 values sent as JSON numbers come back as the same bfloat16 values."""
    import httpx

    values = [1.0, -2.5, 0.15625, 3.0e38]
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "BF16", "data": values}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
    }
    reply = httpx.post(f"http://{test_server.url}/v2/models/identity_bf16/infer", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()["outputs"][0]["data"]
    expected = np.array(values, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(np.array(data, dtype=np.float32), expected)
