"""The one-pass checks of a micro-batch's CUDA slices (``device_views``, ``destinations``)
against the general path, slice by slice (``read``; ``write``'s checks): the fast path gives
exactly the views the general one would, and gives up (None) wherever the general one refuses,
copies through the host or would name an error, so that the general path still says what is
wrong. CUDA is the stand-in of ``test_cuda_shared_memory.py``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from infermux.dataplane.cuda_shared_memory import AllocationSizes, CudaSharedMemoryRegistry
from infermux.errors import InfermuxError
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    DeviceArray,
    Tensor,
    numpy_dtype,
)
from tests.unit.dataplane.test_cuda_shared_memory import HANDLE, FakeIpc

OTHER = bytes(reversed(HANDLE))

# Mostly valid values (so that whole micro-batches pass often), and each way a value can be
# wrong: another type, a bool, a negative, a region of no kind, a host-only datatype.
VALID = 12
offsets = st.one_of(
    *[st.integers(0, 96)] * VALID, st.just(-4), st.just(True), st.just(8.0), st.just("8")
)
regions = st.sampled_from(["a"] * VALID + ["b"] * VALID + ["nope", "", 7])
datatypes = st.sampled_from(["FP32"] * VALID + ["INT64", "FP16", "BOOL", "BYTES", "NOPE"])


def registry_with(shrunk: int) -> CudaSharedMemoryRegistry:
    """Regions 'a' (128 bytes registered, ``shrunk`` left of its allocation) and 'b' (64)."""
    ipc = FakeIpc()
    ipc.allocate(HANDLE, 128)
    ipc.allocate(OTHER, 64)
    registry = CudaSharedMemoryRegistry(enabled=True, ipc=lambda: ipc)
    registry.register("a", HANDLE, 0, 128)
    registry.register("b", OTHER, 1, 64)
    del ipc.memory[HANDLE][shrunk:]  # an allocation that shrank after its registration
    return registry


@st.composite
def slices(draw: st.DrawFn) -> tuple[str, tuple[int, ...], dict[str, Any]]:
    datatype = draw(datatypes)
    shape = (draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 4])))
    itemsize = {"FP32": 4, "INT64": 8, "FP16": 2, "BOOL": 1}.get(datatype, 1)
    exact = math.prod(shape) * itemsize
    size = draw(st.one_of(*[st.just(exact)] * VALID, st.integers(-1, 80), st.just(False)))
    parameters: dict[str, Any] = {SHM_REGION: draw(regions), SHM_BYTE_SIZE: size}
    if draw(st.booleans()):
        parameters[SHM_OFFSET] = draw(offsets)
    return datatype, shape, parameters


def described(views: tuple[DeviceArray, ...] | list[DeviceArray]) -> list[tuple[Any, ...]]:
    return [(v.pointer, v.shape, v.dtype, v.device_id) for v in views]


@settings(max_examples=400, deadline=None)
@given(st.lists(slices(), min_size=1, max_size=4), st.sampled_from([128, 40]))
def test_device_views_are_what_reads_one_by_one_give_or_none(
    drawn: list[tuple[str, tuple[int, ...], dict[str, Any]]], shrunk: int
) -> None:
    registry = registry_with(shrunk)
    tensors = [Tensor("x", t, shape, np.empty(0), p) for t, shape, p in drawn]
    general: list[DeviceArray] | None = []
    try:
        for tensor in tensors:
            view = registry.read(tensor, on_device=True)
            if not isinstance(view, DeviceArray) or tensor.datatype != tensors[0].datatype:
                general = None  # a host copy, or datatypes the batch cannot stack
                break
            assert general is not None
            general.append(view)
    except InfermuxError:
        general = None
    sizes: AllocationSizes = {}
    fast = registry.device_views(tensors, sizes)
    if general is None:
        assert fast is None
    else:
        assert fast is not None
        assert described(fast) == described(general)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 3), slices()), min_size=1, max_size=4),
    st.sampled_from([128, 40]),
    st.booleans(),
)
def test_destinations_are_the_places_writes_would_take_or_none(
    drawn: list[tuple[int, tuple[str, tuple[int, ...], dict[str, Any]]]],
    shrunk: int,
    extra: bool,
) -> None:
    registry = registry_with(shrunk)
    datatype = drawn[0][1][0]
    row = (2,)
    places = [p for _, (_, _, p) in drawn]
    rows = [count for count, _ in drawn]
    if extra:  # asked with more than a place (classification): the host path
        places[-1] = {**places[-1], "classification": 1}
    fast = registry.destinations(datatype, row, places, rows, {})
    # The general path's view of each place: a write of the rows would be refused, or fit.
    fits = datatype not in ("BOOL", "BYTES", "NOPE") and not extra
    expected = []
    if fits:
        itemsize = numpy_dtype(datatype).itemsize
        for parameters, count in zip(places, rows, strict=True):
            try:
                region, start, size = registry._slice("output 'y'", parameters)
            except InfermuxError:
                fits = False
                break
            if size < count * math.prod(row) * itemsize:
                fits = False
                break
            dtype = numpy_dtype(datatype)
            expected.append((start, (count, *row), dtype, region.info.device_id))
    if not fits:
        assert fast is None
    else:
        assert fast is not None
        assert described(fast) == expected


def test_every_slice_of_a_region_is_held_to_the_one_allocation_size_asked() -> None:
    registry = registry_with(40)  # 'a': 128 bytes registered, 40 left of its allocation
    first = Tensor("x", "FP32", (1, 4), np.empty(0), {SHM_REGION: "a", SHM_BYTE_SIZE: 16})
    past = Tensor("x", "FP32", (1, 4), np.empty(0), {**first.parameters, SHM_OFFSET: 48})
    sizes: AllocationSizes = {}
    assert registry.device_views([first, past], sizes) is None  # the answer for 'first' holds
    assert list(sizes.values()) == [40]
    places = [first.parameters, past.parameters]
    assert registry.destinations("FP32", (4,), places, [1, 1], sizes) is None
    # Two datatypes in one input cannot be stacked, even where the byte sizes agree.
    ints = Tensor("x", "INT32", (1, 4), np.empty(0), dict(first.parameters))
    assert registry.device_views([first, ints], {}) is None
    (view,) = registry.device_views([first], {}) or ()
    assert (view.shape, view.dtype) == ((1, 4), np.dtype(np.float32))
