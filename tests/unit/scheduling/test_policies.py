"""Triton's dynamic batching policies, on the DynamicBatcher with controllable instances."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from infermux.backends import stacking
from infermux.backends.base import ExecuteResult, ModelRequest
from infermux.errors import InfermuxError, InvalidArgumentError, UnavailableError
from infermux.model_config import DynamicBatchingConfig, QueuePolicyConfig
from infermux.scheduling import Completion, DynamicBatcher
from infermux.types import Tensor


class Gated:
    """Requests whose value is 0 wait for ``gate``; every batch is recorded as a list of values."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate
        self.batches: list[list[int]] = []

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        values = [int(r.inputs["x"].reshape(-1)[0]) for r in requests]
        if 0 in values:
            self.gate.wait(10)
        self.batches.append(values)
        return [{"y": r.inputs["x"]} for r in requests]

    def close(self) -> None:
        pass


def finish(request: ModelRequest, result: ExecuteResult) -> list[Tensor]:
    if isinstance(result, InfermuxError):
        raise result
    assert not isinstance(result, Exception)
    y = np.asarray(result["y"])
    return [Tensor("y", "INT64", y.shape, y)]


def request(value: int, rows: int = 1, cols: int = 1, **params: Any) -> ModelRequest:
    return ModelRequest({"x": np.full((rows, cols), value)}, ("y",), dict(params))


def make(
    config: DynamicBatchingConfig | None, *, instances: int = 1, max_batch_size: int = 8, **kw: Any
) -> tuple[DynamicBatcher, list[Gated], threading.Event]:
    gate = threading.Event()
    models = [Gated(gate) for _ in range(instances)]
    batcher = DynamicBatcher(
        "m", models, finish=finish, batching=config, max_batch_size=max_batch_size, **kw
    )
    return batcher, models, gate


async def blocked(batcher: DynamicBatcher) -> asyncio.Future[Completion]:
    """Occupy the (single) instance with a request that waits for the gate."""
    first = asyncio.ensure_future(batcher.submit(request(0)))
    await asyncio.sleep(0.05)
    return first


@pytest.mark.parametrize("preserve", [False, True])
async def test_preserve_ordering_releases_responses_in_arrival_order(preserve: bool) -> None:
    config = DynamicBatchingConfig(preserve_ordering=preserve)
    batcher, _, gate = make(config, instances=2, max_batch_size=1)
    finished: list[int] = []

    async def call(value: int) -> None:
        await batcher.submit(request(value))
        finished.append(value)

    slow = asyncio.ensure_future(call(0))  # blocks one instance
    await asyncio.sleep(0.05)
    fast = asyncio.ensure_future(call(1))  # runs on the other instance
    await asyncio.sleep(0.1)
    assert finished == ([] if preserve else [1])
    gate.set()
    await asyncio.gather(slow, fast)
    assert finished == ([0, 1] if preserve else [1, 0])
    await batcher.close()


async def test_higher_priority_goes_first() -> None:
    config = DynamicBatchingConfig(priority_levels=3, default_priority_level=3)
    batcher, (model,), gate = make(config, max_batch_size=1)
    first = await blocked(batcher)
    low = [asyncio.ensure_future(batcher.submit(request(v, priority=3))) for v in (10, 11)]
    default = asyncio.ensure_future(batcher.submit(request(12)))  # priority 0: default level 3
    clamped = asyncio.ensure_future(batcher.submit(request(13, priority=9)))  # out of range
    high = asyncio.ensure_future(batcher.submit(request(20, priority=1)))
    mid = asyncio.ensure_future(batcher.submit(request(30, priority=2)))
    await asyncio.sleep(0.05)
    gate.set()
    await asyncio.gather(first, *low, default, clamped, high, mid)
    assert model.batches == [[0], [20], [30], [10], [11], [12], [13]]
    with pytest.raises(InvalidArgumentError, match="'priority' must be an integer >= 0"):
        await batcher.submit(request(1, priority=-1))
    await batcher.close()


async def test_timeout_reject_fails_queued_request_on_time() -> None:
    policy = QueuePolicyConfig(default_timeout_microseconds=50_000)
    batcher, (model,), gate = make(DynamicBatchingConfig(default_queue_policy=policy))
    first = await blocked(batcher)
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="Request timeout expired"):
        await batcher.submit(request(5))
    assert time.monotonic() - started < 1.0  # rejected while the instance is still busy
    gate.set()
    await first
    assert model.batches == [[0]]  # the rejected request never ran
    await batcher.close()


async def test_timeout_delay_moves_behind_requests_on_time() -> None:
    policy = QueuePolicyConfig(timeout_action="DELAY", default_timeout_microseconds=20_000)
    config = DynamicBatchingConfig(default_queue_policy=policy)
    batcher, (model,), gate = make(config, max_batch_size=1)
    first = await blocked(batcher)
    late = asyncio.ensure_future(batcher.submit(request(1)))
    await asyncio.sleep(0.08)  # request 1 times out: delayed, not rejected
    fresh = asyncio.ensure_future(batcher.submit(request(2)))
    await asyncio.sleep(0.001)
    gate.set()
    await asyncio.gather(first, late, fresh)
    assert model.batches == [[0], [2], [1]]
    await batcher.close()


@pytest.mark.parametrize(
    ("default_us", "override", "requested_us", "rejected"),
    [
        (10_000_000, True, 30_000, True),  # a request may shorten the timeout...
        (30_000, True, 10_000_000, True),  # ...but not lengthen it
        (0, True, 30_000, True),  # no default timeout: the request's applies
        (10_000_000, False, 30_000, False),  # override not allowed: the default applies
    ],
)
async def test_timeout_override_rules(
    default_us: int, override: bool, requested_us: int, rejected: bool
) -> None:
    policy = QueuePolicyConfig(
        default_timeout_microseconds=default_us, allow_timeout_override=override
    )
    batcher, _, gate = make(DynamicBatchingConfig(default_queue_policy=policy))
    first = await blocked(batcher)
    pending = asyncio.ensure_future(batcher.submit(request(5, timeout=requested_us)))
    await asyncio.sleep(0.2)
    assert pending.done() is rejected
    gate.set()
    await first
    if rejected:
        with pytest.raises(UnavailableError, match="Request timeout expired"):
            await pending
    else:
        await pending
    await batcher.close()


async def test_max_queue_size_rejects_the_excess_at_once() -> None:
    policy = QueuePolicyConfig(max_queue_size=2)
    batcher, _, gate = make(DynamicBatchingConfig(default_queue_policy=policy), max_batch_size=1)
    first = await blocked(batcher)  # executing: no longer counts as queued
    admitted = [asyncio.ensure_future(batcher.submit(request(v))) for v in (1, 2)]
    await asyncio.sleep(0.01)
    with pytest.raises(UnavailableError, match="Exceeds maximum queue size"):
        await batcher.submit(request(3))
    gate.set()
    assert len(await asyncio.gather(first, *admitted)) == 3
    await batcher.close()


async def test_per_level_policies() -> None:
    config = DynamicBatchingConfig(
        priority_levels=2,
        default_priority_level=2,
        priority_queue_policy={1: QueuePolicyConfig(max_queue_size=1)},
    )
    batcher, _, gate = make(config, max_batch_size=1)
    first = await blocked(batcher)
    high = asyncio.ensure_future(batcher.submit(request(1, priority=1)))
    await asyncio.sleep(0.01)
    with pytest.raises(UnavailableError, match="Exceeds maximum queue size"):
        await batcher.submit(request(2, priority=1))
    low = [asyncio.ensure_future(batcher.submit(request(v))) for v in (3, 4, 5)]  # unlimited
    gate.set()
    await asyncio.gather(first, high, *low)
    await batcher.close()


async def test_cancelled_request_leaves_the_queue() -> None:
    policy = QueuePolicyConfig(max_queue_size=1)
    batcher, (model,), gate = make(DynamicBatchingConfig(default_queue_policy=policy))
    first = await blocked(batcher)
    gone = asyncio.ensure_future(batcher.submit(request(7)))
    await asyncio.sleep(0.01)
    gone.cancel()
    await asyncio.sleep(0.01)
    # Its slot is free again, and it never reaches the model.
    kept = asyncio.ensure_future(batcher.submit(request(8)))
    await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(first, kept)
    assert model.batches == [[0], [8]]
    assert batcher.pending == 0
    await batcher.close()


async def test_delay_collects_a_batch_and_preferred_size_cuts_it_short() -> None:
    config = DynamicBatchingConfig(max_queue_delay_microseconds=100_000)
    batcher, (model,), _ = make(config, max_batch_size=4)
    started = time.monotonic()
    await asyncio.gather(*(batcher.submit(request(v)) for v in (1, 2)))
    assert time.monotonic() - started >= 0.09  # waited for more
    assert model.batches == [[1, 2]]
    await asyncio.gather(*(batcher.submit(request(v)) for v in (3, 4, 5, 6)))
    assert model.batches[-1] == [3, 4, 5, 6]  # a full batch goes at once
    await batcher.close()

    config = DynamicBatchingConfig(
        max_queue_delay_microseconds=5_000_000, preferred_batch_sizes=(2,)
    )
    batcher, (model,), _ = make(config, max_batch_size=4)
    started = time.monotonic()
    await asyncio.gather(*(batcher.submit(request(v)) for v in (1, 2)))
    assert time.monotonic() - started < 1.0  # a preferred size does not wait for the delay
    assert model.batches == [[1, 2]]
    await batcher.close()


async def test_only_compatible_requests_are_batched_together() -> None:
    batcher, (model,), gate = make(
        DynamicBatchingConfig(), max_batch_size=8, compatible=stacking.compatible
    )
    first = await blocked(batcher)
    rest = [
        asyncio.ensure_future(batcher.submit(request(v, cols=c)))
        for v, c in ((1, 1), (2, 1), (3, 2), (4, 2), (5, 1))
    ]
    await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(first, *rest)
    assert model.batches == [[0], [1, 2], [3, 4], [5]]
    await batcher.close()
