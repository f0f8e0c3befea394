"""V2 datatype <-> numpy dtype mapping, element sizes and counts (``infermux.types``)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from infermux.errors import ErrorCode, InvalidArgumentError
from infermux.types import (
    DATATYPES,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
    datatype_of,
    element_count,
    element_size,
    numpy_dtype,
)

EXPECTED_DTYPES: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "BYTES": np.dtype(np.object_),
}

EXPECTED_SIZES = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "FP32": 4,
    "FP64": 8,
    "BF16": 2,
    "BYTES": 0,
}


def test_datatypes_are_every_v2_datatype_in_tritons_order() -> None:
    assert tuple(EXPECTED_DTYPES) == DATATYPES


@pytest.mark.parametrize("datatype", list(EXPECTED_DTYPES))
def test_numpy_dtype_maps_every_datatype(datatype: str) -> None:
    assert numpy_dtype(datatype) == EXPECTED_DTYPES[datatype]


@pytest.mark.parametrize("datatype", list(EXPECTED_DTYPES))
def test_datatype_of_inverts_numpy_dtype(datatype: str) -> None:
    assert datatype_of(numpy_dtype(datatype)) == datatype


def test_bf16_is_ml_dtypes_bfloat16() -> None:
    dtype = numpy_dtype("BF16")
    assert dtype == np.dtype(ml_dtypes.bfloat16)
    assert dtype.itemsize == 2
    # A bfloat16 is the upper half of a float32: 1.0 is 0x3F80.
    assert np.array([1.0], dtype=dtype).view(np.uint16)[0] == 0x3F80


@pytest.mark.parametrize("name", ["FLOAT32", "fp32", "", "TYPE_FP32", "STRING"])
def test_numpy_dtype_rejects_unknown_names(name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown datatype") as info:
        numpy_dtype(name)
    assert f"'{name}'" in info.value.message
    assert "FP32" in info.value.message  # lists what is valid
    assert info.value.code is ErrorCode.INVALID_ARG


@pytest.mark.parametrize(
    ("dtype", "datatype"),
    [
        (np.dtype(">i4"), "INT32"),
        (np.dtype(">u2"), "UINT16"),
        (np.dtype(">f8"), "FP64"),
        (np.dtype("<f2"), "FP16"),
        (np.dtype(np.longlong), "INT64"),
        (np.dtype(np.ulonglong), "UINT64"),
        (np.dtype(np.intc), "INT32"),
    ],
)
def test_datatype_of_ignores_byte_order_and_aliases(
    dtype: np.dtype[np.generic], datatype: str
) -> None:
    assert datatype_of(dtype) == datatype


@pytest.mark.parametrize("dtype", [np.dtype("S5"), np.dtype("U3"), np.dtype(np.object_)])
def test_datatype_of_string_and_object_arrays_is_bytes(dtype: np.dtype[np.generic]) -> None:
    assert datatype_of(dtype) == "BYTES"


@pytest.mark.parametrize("dtype", [np.dtype(np.complex64), np.dtype(np.longdouble), np.dtype("V4")])
def test_datatype_of_rejects_dtypes_without_a_v2_datatype(dtype: np.dtype[np.generic]) -> None:
    with pytest.raises(InvalidArgumentError, match="has no V2 datatype"):
        datatype_of(dtype)


@pytest.mark.parametrize(("datatype", "size"), list(EXPECTED_SIZES.items()))
def test_element_size(datatype: str, size: int) -> None:
    assert element_size(datatype) == size


def test_element_size_rejects_unknown_datatype() -> None:
    with pytest.raises(InvalidArgumentError, match="NOPE"):
        element_size("NOPE")


@pytest.mark.parametrize(
    ("shape", "count"),
    [((), 1), ((0,), 0), ((3,), 3), ((2, 3), 6), ((2, 0, 5), 0), ((1, 1, 1, 7), 7)],
)
def test_element_count(shape: tuple[int, ...], count: int) -> None:
    assert element_count(shape) == count


def test_value_types_default_to_empty_containers() -> None:
    tensor = Tensor("X", "FP32", (1,), np.zeros(1, dtype=np.float32))
    request = InferRequest("m", "", [tensor])
    response = InferResponse("m", "1", [tensor])
    assert tensor.parameters == {}
    assert request.outputs == []
    assert request.id == ""
    assert request.parameters == {}
    assert response.id == ""
    assert response.parameters == {}
    assert RequestedOutput("Y").parameters == {}
    # Mutable defaults are not shared between instances.
    tensor.parameters["k"] = 1
    assert Tensor("Z", "FP32", (1,), np.zeros(1, dtype=np.float32)).parameters == {}
