"""``Driver.copy`` on a real GPU: a batch of copies from pinned host memory and from device
memory lands where it should, through the driver's batched copy and through one call per copy."""

from __future__ import annotations

import pytest
import torch

from infermux.runtime.driver import DRIVER, Driver

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PARTS = (3, 1, 7, 2, 5)  # rows of each copy; a row is 64 int32


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("source", ["pinned", "device"])
def test_a_batch_of_copies_gathers_every_part(batched: bool, source: str) -> None:
    driver = Driver()
    driver.bind()
    if not batched:
        driver._batch, driver.batch_copies = None, ""
    elif not driver.batch_copies:
        pytest.skip("this driver has no cuMemcpyBatchAsync (CUDA < 12.8)")
    parts = [
        torch.arange(rows * 64, dtype=torch.int32).reshape(rows, 64) + 1000 * i
        for i, rows in enumerate(PARTS)
    ]
    parts = [p.pin_memory() if source == "pinned" else p.cuda() for p in parts]
    target = torch.full((sum(PARTS) + 4, 64), -1, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with torch.cuda.device(0), torch.cuda.stream(stream):
        queued = driver.gather_to_device(
            target.data_ptr(),
            [(p.data_ptr(), p.numel() * p.element_size()) for p in parts],
            stream.cuda_stream,
        )
    stream.synchronize()
    assert queued == sum(PARTS) * 64 * 4
    expected = torch.cat([p.cpu() for p in parts])
    assert torch.equal(target[: sum(PARTS)].cpu(), expected)
    assert bool((target[sum(PARTS) :] == -1).all())  # nothing past the parts


def test_the_servers_driver_has_the_batched_copy() -> None:
    """The H200's driver (CUDA 13) has it: the event-loop path uses one call per batch."""
    DRIVER.bind()
    assert DRIVER.batch_copies in {"cuMemcpyBatchAsync_v2", "cuMemcpyBatchAsync"}
