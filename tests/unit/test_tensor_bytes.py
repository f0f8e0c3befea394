"""Raw tensor bytes as Triton's protocols carry them (``infermux.tensor_bytes``)."""

from __future__ import annotations

import struct
from typing import Any

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermux.errors import InvalidArgumentError
from infermux.tensor_bytes import (
    count_bytes_elements,
    tensor_from_bytes,
    tensor_to_bytes,
)
from infermux.types import DATATYPES, element_count, numpy_dtype

PROPERTY = settings(max_examples=50, deadline=None, derandomize=True, database=None)

SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def arrays_for(draw: st.DrawFn, datatype: str) -> npt.NDArray[Any]:
    """Any array of ``datatype``: every bit pattern for floats (NaN, inf, subnormals)."""
    shape = draw(SHAPES)
    if datatype == "BYTES":
        count = element_count(shape)
        items = draw(st.lists(st.binary(max_size=8), min_size=count, max_size=count))
        out = np.empty(count, dtype=np.object_)
        for i, item in enumerate(items):
            out[i] = item
        return out.reshape(shape)
    dtype = numpy_dtype(datatype)
    if dtype.kind in "fV" or datatype == "BF16":
        # Draw raw bits so that every NaN payload and signed zero is covered.
        bits = np.dtype(f"u{dtype.itemsize}")
        return draw(hnp.arrays(bits, shape)).view(dtype)
    return draw(hnp.arrays(dtype, shape))


def assert_same(actual: npt.NDArray[Any], expected: npt.NDArray[Any]) -> None:
    """Equal shape, dtype and elements; bit-exact for fixed-size datatypes."""
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    if expected.dtype == np.dtype(ml_dtypes.bfloat16):
        # numpy's comparison warns on bfloat16 NaNs; float32 holds every bfloat16 exactly.
        np.testing.assert_array_equal(actual.astype(np.float32), expected.astype(np.float32))
    else:
        np.testing.assert_array_equal(actual, expected)
    if expected.dtype != np.object_:
        assert np.ascontiguousarray(actual).tobytes() == np.ascontiguousarray(expected).tobytes()
    else:
        assert actual.tolist() == expected.tolist()


def client_bytes(datatype: str, array: npt.NDArray[Any]) -> bytes:
    """What a client such as tritonclient sends: little-endian, BYTES length-prefixed."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(item)) + item for item in array.reshape(-1))
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


# -- properties ------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
@PROPERTY
@given(data=st.data())
def test_round_trip(datatype: str, data: st.DataObject) -> None:
    array = data.draw(arrays_for(datatype))
    raw = tensor_to_bytes(datatype, array)
    assert raw == client_bytes(datatype, array)
    decoded = tensor_from_bytes("T", datatype, array.shape, raw)
    assert_same(decoded, array)
    assert tensor_to_bytes(datatype, decoded) == raw
    if datatype == "BYTES":
        assert count_bytes_elements(raw) == array.size
    else:
        assert len(raw) == array.size * numpy_dtype(datatype).itemsize
    # At an odd offset inside a larger body, as the HTTP codec hands it over: the decoder must
    # cope with unaligned data.
    body = b"{json}" + raw + b"trailer"
    view = memoryview(body)[6 : 6 + len(raw)]
    assert_same(tensor_from_bytes("T", datatype, array.shape, view), array)


# -- encoding details ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "values", "raw"),
    [
        ("BOOL", [True, False], b"\x01\x00"),
        ("UINT8", [1, 255], b"\x01\xff"),
        ("INT16", [-2], b"\xfe\xff"),
        ("UINT32", [1], b"\x01\x00\x00\x00"),
        ("INT32", [1, -2], b"\x01\x00\x00\x00\xfe\xff\xff\xff"),
        ("INT64", [-1], b"\xff" * 8),
        ("FP16", [1.0], b"\x00\x3c"),
        ("FP32", [1.0], b"\x00\x00\x80\x3f"),
        ("FP64", [-2.0], b"\x00" * 7 + b"\xc0"),
        ("BF16", [1.0], b"\x80\x3f"),
    ],
)
def test_fixed_size_encoding_is_little_endian(datatype: str, values: list[Any], raw: bytes) -> None:
    array = np.array(values, dtype=numpy_dtype(datatype))
    assert tensor_to_bytes(datatype, array) == raw
    assert_same(tensor_from_bytes("T", datatype, array.shape, raw), array)


def test_big_endian_arrays_are_sent_little_endian() -> None:
    array = np.array([1, 2], dtype=">i4")
    assert tensor_to_bytes("INT32", array) == b"\x01\x00\x00\x00\x02\x00\x00\x00"


def test_non_contiguous_arrays_are_sent_row_major() -> None:
    array = np.arange(6, dtype=np.int8).reshape(2, 3).T
    assert tensor_to_bytes("INT8", array) == bytes([0, 3, 1, 4, 2, 5])
    objects = np.array([[b"a", b"b"], [b"c", b"d"]], dtype=np.object_).T
    assert tensor_to_bytes("BYTES", objects) == b"".join(
        struct.pack("<I", 1) + c for c in (b"a", b"c", b"b", b"d")
    )


def test_bytes_encoding_is_length_prefixed() -> None:
    array = np.array([b"ab", b"", b"\x00\xff"], dtype=np.object_)
    raw = tensor_to_bytes("BYTES", array)
    assert raw == b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00\x00\xff"
    assert_same(tensor_from_bytes("T", "BYTES", (3,), raw), array)


def test_bytes_encoding_accepts_str_and_numpy_strings() -> None:
    mixed = np.array(["héllo", b"raw", 7], dtype=np.object_)
    assert tensor_to_bytes("BYTES", mixed) == (
        struct.pack("<I", 6)
        + "héllo".encode()
        + struct.pack("<I", 3)
        + b"raw"
        + b"\x01\x00\x00\x007"
    )
    assert tensor_to_bytes("BYTES", np.array(["ab"])) == b"\x02\x00\x00\x00ab"
    assert tensor_to_bytes("BYTES", np.array([b"ab"])) == b"\x02\x00\x00\x00ab"


def test_fixed_size_decoding_is_a_zero_copy_view() -> None:
    array = tensor_from_bytes("T", "UINT16", (2,), b"\x01\x00\x02\x00")
    assert array.tolist() == [1, 2]
    assert not array.flags.writeable
    raw = bytearray(b"\x01\x00\x02\x00")
    view = tensor_from_bytes("T", "UINT16", (2,), memoryview(raw))
    raw[0] = 9
    assert view.tolist() == [9, 2]


def test_bf16_decodes_to_ml_dtypes_bfloat16() -> None:
    array = tensor_from_bytes("T", "BF16", (2,), b"\x80\x3f\x00\xc0")
    assert array.dtype == np.dtype(ml_dtypes.bfloat16)
    assert array.astype(np.float32).tolist() == [1.0, -2.0]


@pytest.mark.parametrize("shape", [(), (1,), (1, 1, 1)])
def test_scalar_shapes_hold_one_element(shape: tuple[int, ...]) -> None:
    assert tensor_from_bytes("T", "INT8", shape, b"\x05").shape == shape
    assert tensor_from_bytes("T", "BYTES", shape, b"\x01\x00\x00\x00x").shape == shape


@pytest.mark.parametrize("datatype", DATATYPES)
def test_zero_size_tensors_are_empty(datatype: str) -> None:
    array = tensor_from_bytes("T", datatype, (2, 0, 3), b"")
    assert array.shape == (2, 0, 3)
    assert array.dtype == numpy_dtype(datatype)
    assert tensor_to_bytes(datatype, array) == b""


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "shape", "raw"),
    [
        ("FP32", (2,), b"\x00" * 7),
        ("FP32", (2,), b"\x00" * 9),
        ("INT64", (0,), b"\x00"),
        ("BF16", (1, 2), b"\x00" * 2),
        ("BOOL", (), b""),
    ],
)
def test_fixed_size_byte_count_mismatch_names_the_tensor(
    datatype: str, shape: tuple[int, ...], raw: bytes
) -> None:
    with pytest.raises(InvalidArgumentError, match=r"input 'INPUT0'.*binary data") as info:
        tensor_from_bytes("INPUT0", datatype, shape, raw)
    assert str(len(raw)) in info.value.message
    assert datatype in info.value.message


def test_unknown_datatype_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="FP8"):
        tensor_from_bytes("INPUT0", "FP8", (1,), b"\x00")


@pytest.mark.parametrize(
    ("shape", "raw", "match"),
    [
        ((1,), b"", "fewer than the 1 elements"),
        ((2,), b"\x01\x00\x00\x00a\x01\x00", "fewer than the 2 elements"),  # truncated prefix
        ((1,), b"\x05\x00\x00\x00abc", "element 0 declares 5 bytes but only 3 remain"),
        ((2,), b"\x00\x00\x00\x00\xff\xff\xff\xff", "element 1 declares 4294967295 bytes"),
        ((1,), b"\x01\x00\x00\x00ab", "1 bytes of BYTES data remain"),
        ((0,), b"\x00\x00\x00\x00", "4 bytes of BYTES data remain"),
    ],
)
def test_malformed_bytes_data_names_the_tensor(
    shape: tuple[int, ...], raw: bytes, match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match) as info:
        tensor_from_bytes("INPUT0", "BYTES", shape, raw)
    assert "input 'INPUT0'" in info.value.message


@pytest.mark.parametrize(
    ("raw", "count"),
    [(b"", 0), (b"\x00\x00\x00\x00", 1), (b"\x02\x00\x00\x00ab\x00\x00\x00\x00", 2)],
)
def test_count_bytes_elements(raw: bytes, count: int) -> None:
    assert count_bytes_elements(raw) == count
    assert count_bytes_elements(memoryview(raw)) == count


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\x00\x00", "truncated length prefix"),
        (b"\x00\x00\x00\x00\x01", "truncated length prefix"),
        (b"\x03\x00\x00\x00ab", "runs past the end"),
    ],
)
def test_count_bytes_elements_rejects_malformed_data(raw: bytes, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        count_bytes_elements(raw)


@pytest.mark.parametrize("datatype", ["BYTES", "FP32"])
def test_a_shape_numpy_cannot_describe_is_an_invalid_argument(datatype: str) -> None:
    """Found by tests/e2e/test_malformed.py: a zero among huge dimensions passed the size
    checks (0 elements) and failed building the array, as an internal error."""
    with pytest.raises(InvalidArgumentError, match=r"input 'x': shape .* is too large"):
        tensor_from_bytes("x", datatype, (2**40, 0, 2**40), b"")


@pytest.mark.parametrize("datatype", ["BYTES", "FP32"])
def test_more_dimensions_than_numpy_holds_is_an_invalid_argument(datatype: str) -> None:
    """Issue 23: 65 dimensions failed building the array (numpy holds 64), as a 500."""
    with pytest.raises(
        InvalidArgumentError, match="input 'x': shape has 65 dimensions; at most 64"
    ):
        tensor_from_bytes("x", datatype, (1,) * 65, b"\0\0\0\0")
    assert tensor_from_bytes("x", "FP32", (1,) * 64, b"\0\0\0\0").ndim == 64


def test_bytes_elements_are_counted_before_allocating() -> None:
    """A BYTES shape of 2**40 elements over 4 bytes is refused without allocating 8 TiB."""
    with pytest.raises(InvalidArgumentError, match="fewer than the 1099511627776 elements"):
        tensor_from_bytes("x", "BYTES", (2**40,), b"\0\0\0\0")
