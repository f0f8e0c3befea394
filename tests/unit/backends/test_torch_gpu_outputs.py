"""Which requests' outputs a CUDA-graph batch copies straight into their clients' CUDA
shared memory (``torch_gpu._write_device_outputs``), checked on the CPU: the graph's outputs are
CPU tensors and the device-to-device copies are recorded instead of made: one gather-kernel call
per batch. An output whose places do not take its bytes exactly is left to the host path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from infermux.backends import torch_gpu  # noqa: E402
from infermux.backends.base import DeviceParts, ModelRequest  # noqa: E402
from infermux.runtime.driver import Copy  # noqa: E402
from infermux.runtime.gather_kernel import GATHER  # noqa: E402
from infermux.types import DeviceArray  # noqa: E402

ROW = 768 * 2  # bytes of one FP16 row of the output below


@dataclass
class Graph:
    outputs: dict[str, Any]


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[Copy], int]]:
    """Each call to the driver: (its copies, the stream); a call with no copies is skipped."""
    made: list[tuple[list[Copy], int]] = []

    def copy(batch: Any, stream: int, device_id: int) -> None:
        if batch:
            made.append((list(batch), stream))

    monkeypatch.setattr(GATHER, "copy", copy)
    return made


def place(pointer: int, rows: int = 1, dtype: Any = np.float16, device: int = 0) -> DeviceArray:
    return DeviceArray(pointer, (rows, 768), np.dtype(dtype), device)


def request(rows: int = 1, **outputs: tuple[DeviceArray, ...]) -> ModelRequest:
    r = ModelRequest({"x": np.zeros((rows, 4), np.int64)}, ("pooled", "other"))
    for name, parts in outputs.items():
        r.device_outputs[name] = DeviceParts(parts)
    return r


def graph() -> Graph:
    return Graph({"pooled": torch.zeros(64, 768, dtype=torch.float16)})


def test_each_request_gets_its_own_rows(copies: list[Any]) -> None:
    g = graph()
    base = g.outputs["pooled"].data_ptr()
    requests = [
        request(pooled=(place(1000),)),
        request(rows=3, pooled=(place(2000, rows=1), place(3000, rows=2))),
        request(),  # no device output: its rows are skipped over
        request(pooled=(place(4000),)),
    ]
    torch_gpu._write_device_outputs(g, requests, 7, 0)  # type: ignore[arg-type]
    assert copies == [
        (
            [
                (1000, base, ROW),
                (2000, base + ROW, ROW),
                (3000, base + 2 * ROW, 2 * ROW),
                (4000, base + 5 * ROW, ROW),
            ],
            7,
        )
    ]
    assert [r.outputs_on_device for r in requests] == [{"pooled"}, {"pooled"}, set(), {"pooled"}]


@pytest.mark.parametrize(
    "places",
    [
        (place(1000, dtype=np.float32),),  # another dtype: the host path casts it
        (place(1000, device=1),),  # another GPU
        (place(1000, rows=2),),  # more rows than the request has
        (DeviceArray(1000, (1, 384), np.dtype(np.float16), 0),),  # a row of another size
    ],
)
def test_places_that_do_not_take_the_bytes_exactly_go_the_host_way(
    copies: list[Any], places: tuple[DeviceArray, ...]
) -> None:
    fits = request(pooled=(place(5000),))
    odd = request(pooled=places)
    g = graph()
    torch_gpu._write_device_outputs(g, [odd, fits], 0, 0)  # type: ignore[arg-type]
    assert copies == [([(5000, g.outputs["pooled"].data_ptr() + ROW, ROW)], 0)]
    assert odd.outputs_on_device == set()
    assert fits.outputs_on_device == {"pooled"}


def test_an_output_the_graph_lacks_or_lays_out_otherwise_is_not_copied(copies: list[Any]) -> None:
    wide = torch.zeros(768, 64, dtype=torch.float16).t()  # rows not contiguous
    g = Graph({"pooled": wide})
    missing = request(other=(place(1000),))
    strided = request(pooled=(place(2000),))
    torch_gpu._write_device_outputs(g, [missing, strided], 0, 0)  # type: ignore[arg-type]
    assert copies == []
    assert missing.outputs_on_device == strided.outputs_on_device == set()
