"""A batch's copies on a real GPU: through the driver (its batched copy, or one call per copy)
from pinned host and device memory, and device to device through the gather kernel, aligned or
not, over more copies than one launch carries."""

from __future__ import annotations

import pytest
import torch

from infermux.runtime.driver import DRIVER, Driver, gathered
from infermux.runtime.gather_kernel import GATHER, MAX_COPIES, GatherKernel

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PARTS = (3, 1, 7, 2, 5)  # rows of each copy; a row is 64 int32


def _parts(rows: tuple[int, ...], where: str) -> list[torch.Tensor]:
    made = [
        torch.arange(n * 64, dtype=torch.int32).reshape(n, 64) + 1000 * i
        for i, n in enumerate(rows)
    ]
    return [p.pin_memory() if where == "pinned" else p.cuda() for p in made]


def _gather_and_check(parts: list[torch.Tensor], copy: object) -> None:
    rows = sum(p.shape[0] for p in parts)
    target = torch.full((rows + 4, 64), -1, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    copies = gathered(target.data_ptr(), [(p.data_ptr(), p.numel() * 4) for p in parts])
    with torch.cuda.device(0), torch.cuda.stream(stream):
        copy(copies, stream.cuda_stream)  # type: ignore[operator]
    stream.synchronize()
    assert torch.equal(target[:rows].cpu(), torch.cat([p.cpu() for p in parts]))
    assert bool((target[rows:] == -1).all())  # nothing past the parts


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("source", ["pinned", "device"])
def test_the_driver_gathers_every_part(batched: bool, source: str) -> None:
    driver = Driver()
    driver.bind()
    if not batched:
        driver._batch, driver.batch_copies = None, ""
    elif not driver.batch_copies:
        pytest.skip("this driver has no cuMemcpyBatchAsync (CUDA < 12.8)")
    _gather_and_check(_parts(PARTS, source), driver.copy)


@pytest.mark.parametrize("rows", [PARTS, (1,) * (MAX_COPIES + 9), (300, 2, 41)])
def test_the_kernel_gathers_device_parts(rows: tuple[int, ...]) -> None:
    kernel = GatherKernel()
    _gather_and_check(_parts(rows, "device"), lambda copies, stream: kernel.copy(copies, stream, 0))
    assert kernel.unavailable == ""


def test_the_kernel_copies_unaligned_bytes() -> None:
    kernel = GatherKernel()
    source = torch.arange(4096, dtype=torch.int32, device="cuda").view(torch.uint8)
    target = torch.zeros(24000, dtype=torch.uint8, device="cuda")
    # Odd sizes at odd offsets on both sides: the byte loop; an aligned copy whose size is not a
    # multiple of 16: the uint4 loop, then the byte loop for its last 8 bytes.
    copies = [
        (target.data_ptr() + 1, source.data_ptr() + 3, 1001),
        (target.data_ptr() + 2003, source.data_ptr() + 7, 5),
        (target.data_ptr() + 4096, source.data_ptr(), 16384 - 8),
    ]
    assert target.numel() > 4096 + 16384 - 8
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with torch.cuda.device(0), torch.cuda.stream(stream):
        kernel.copy(copies, stream.cuda_stream, 0)
    stream.synchronize()
    got, src = target.cpu(), source.cpu()
    assert torch.equal(got[1:1002], src[3:1004])
    assert torch.equal(got[2003:2008], src[7:12])
    assert torch.equal(got[4096 : 4096 + 16376], src[:16376])
    assert [int(got[i]) for i in (0, 1002, 2008, 4095, 4096 + 16376)] == [0] * 5  # only the copies


def test_the_servers_driver_batches_copies_and_has_the_kernel() -> None:
    """On the H200 (CUDA 13, cuda-python with NVRTC) the event-loop path uses one driver call
    per batch for host copies and one kernel launch for device copies."""
    DRIVER.bind()
    assert DRIVER.batch_copies in {"cuMemcpyBatchAsync_v2", "cuMemcpyBatchAsync"}
    with torch.cuda.device(0):
        assert GATHER.function(0), GATHER.unavailable
