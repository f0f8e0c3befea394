"""Stacking a batch and splitting its outputs back are inverses (hypothesis)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import infermux
from infermux.backends.base import DeviceParts, ModelRequest
from infermux.backends.stacking import compatible, split, stack
from infermux.errors import InvalidArgumentError
from infermux.types import DeviceArray

DTYPES = [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16, np.float32, np.float64]


@st.composite
def batches(draw: st.DrawFn) -> list[dict[str, npt.NDArray[Any]]]:
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    inner = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    dtype = draw(st.sampled_from(DTYPES))
    use_bytes = draw(st.booleans())
    out = []
    for rows in sizes:
        numbers = draw(hnp.arrays(dtype, (rows, *inner)))
        tensors: dict[str, npt.NDArray[Any]] = {"num": numbers}
        if use_bytes:
            words = draw(st.lists(st.binary(max_size=5), min_size=rows * 2, max_size=rows * 2))
            tensors["txt"] = np.array(words, dtype=np.object_).reshape(rows, 2)
        out.append(tensors)
    return out


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(batches())
def test_split_undoes_stack(inputs: list[dict[str, npt.NDArray[Any]]]) -> None:
    requests = [ModelRequest(tensors, ()) for tensors in inputs]
    stacked = stack(requests)
    assert stacked["num"].shape[0] == sum(r.batch_size for r in requests)
    parts = split(stacked, [r.batch_size for r in requests])
    for part, original in zip(parts, inputs, strict=True):
        assert part.keys() == original.keys()
        for name, array in original.items():
            assert part[name].dtype == array.dtype
            assert part[name].shape == array.shape
            assert part[name].tobytes() == array.tobytes() or array.dtype == np.object_
            if array.dtype == np.object_:
                assert part[name].tolist() == array.tolist()


def test_incompatible_requests_are_refused() -> None:
    a = ModelRequest({"x": np.zeros((1, 2), np.float32)}, ())
    b = ModelRequest({"x": np.zeros((1, 3), np.float32)}, ())
    c = ModelRequest({"x": np.zeros((2, 2), np.float64)}, ())
    d = ModelRequest({"y": np.zeros((1, 2), np.float32)}, ())
    assert compatible(a, ModelRequest({"x": np.zeros((5, 2), np.float32)}, ()))
    assert not compatible(a, b)
    assert not compatible(a, c)
    assert not compatible(a, d)
    with pytest.raises(InvalidArgumentError, match="cannot be stacked"):
        stack([a, b])
    with pytest.raises(ValueError, match="empty batch"):
        stack([])


def test_split_checks_row_counts() -> None:
    with pytest.raises(InvalidArgumentError, match="output 'y' has 3 rows but the batch has 4"):
        split({"y": np.zeros((3, 1))}, [2, 2])
    with pytest.raises(InvalidArgumentError, match="has 0 rows"):
        split({"y": np.array(1.0)}, [1])


def test_stack_into_a_buffer_the_backend_offers() -> None:
    """A backend with a staging buffer gets the batch stacked straight into it (one copy)."""
    buffer = np.zeros(64, dtype=np.uint8)
    offered: list[tuple[str, tuple[int, ...]]] = []

    def into(name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any] | None:
        offered.append((name, shape))
        if name != "x":
            return None  # "y" goes to a new array
        return buffer[: int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)

    requests = [
        ModelRequest({"x": np.full((1, 3), i, np.int32), "y": np.ones((1, 2), np.int8)}, ())
        for i in range(3)
    ]
    stacked = stack(requests, into)
    assert offered == [("x", (3, 3)), ("y", (3, 2))]
    assert np.shares_memory(stacked["x"], buffer)
    assert stacked["x"].tolist() == [[0, 0, 0], [1, 1, 1], [2, 2, 2]]
    assert not np.shares_memory(stacked["y"], buffer)
    assert stacked["y"].shape == (3, 2)


class _Doubler:
    """A model written against the public contract (type-checked: it must conform)."""

    def execute(self, requests: list[infermux.ModelRequest]) -> Sequence[infermux.ExecuteResult]:
        x = np.asarray(infermux.stack(requests)["INPUT0"], dtype=np.float32)
        return infermux.split({"OUTPUT0": x * 2}, [r.batch_size for r in requests])


def test_model_authors_get_the_contract_and_the_helpers_from_infermux() -> None:
    model: infermux.Model = _Doubler()
    requests = [
        infermux.ModelRequest({"INPUT0": np.ones((n, 2), np.float32)}, ("OUTPUT0",)) for n in (1, 3)
    ]
    results = model.execute(requests)
    assert [np.asarray(r["OUTPUT0"]).shape for r in results if isinstance(r, Mapping)] == [
        (1, 2),
        (3, 2),
    ]


def test_device_parts_know_their_rows_and_refuse_to_be_empty() -> None:
    fp16 = np.dtype(np.float16)
    parts = DeviceParts(
        tuple(DeviceArray(4096 * i, (n, 3, 8), fp16, 0) for i, n in enumerate([2, 1, 5]))
    )
    assert parts.shape == (8, 3, 8)
    assert ModelRequest({}, ("y",), device_inputs={"x": parts}).batch_size == 8
    flat = parts.reshape((8, 24))
    assert flat.shape == (8, 24)
    assert [p.shape for p in flat.parts] == [(2, 24), (1, 24), (5, 24)]
    with pytest.raises(ValueError, match="at least one part"):
        DeviceParts(())
