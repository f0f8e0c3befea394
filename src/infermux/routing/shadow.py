"""Shadow traffic: a copy of a request runs on a candidate version after the primary answered;
the two answers are compared output by output and the outcome counted. The client only ever
gets the primary's answer, whatever the candidate does (fails, differs, is slow, is full)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infermux.backends.base import ModelRequest
from infermux.errors import InfermuxError, RejectedError
from infermux.repository import LoadedModel
from infermux.routing.policy import ShadowPolicy
from infermux.types import Tensor

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ShadowStats:
    """The figures of one candidate version."""

    mirrored: int = 0
    agreed: int = 0
    disagreed: int = 0
    failed: int = 0  # the candidate raised
    dropped: int = 0  # not run: candidate not served, queue full, inputs on a GPU
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    latency_delta_ns: int = 0  # sum over compared requests of (candidate - primary) duration

    @property
    def compared(self) -> int:
        return self.agreed + self.disagreed

    def to_json(self) -> dict[str, Any]:
        compared = self.compared
        return {
            "mirrored": self.mirrored,
            "compared": compared,
            "agreed": self.agreed,
            "disagreed": self.disagreed,
            "failed": self.failed,
            "dropped": self.dropped,
            "agreement_rate": self.agreed / compared if compared else None,
            "max_abs_diff": dict(self.max_abs_diff),
            "mean_latency_delta_us": self.latency_delta_ns / compared / 1000 if compared else None,
        }


Mirror = tuple[ShadowPolicy, LoadedModel, ShadowStats]
"""A shadow run to start: the policy's shadow settings, the candidate version, its figures."""


@dataclass(slots=True)
class Comparison:
    agreed: bool
    max_abs_diff: dict[str, float]


def compare(
    policy: ShadowPolicy, primary: Sequence[Tensor], candidate: Sequence[Tensor]
) -> Comparison:
    """Output by output: same names, shapes and datatypes, values within the output's
    tolerance (exactly equal for BYTES and BOOL)."""
    theirs = {t.name: t for t in candidate}
    agreed = len(theirs) == len(primary)
    diffs: dict[str, float] = {}
    for tensor in primary:
        other = theirs.get(tensor.name)
        if other is None:
            agreed = False
            continue
        a, b = np.asarray(tensor.data), np.asarray(other.data)
        if a.shape != b.shape or tensor.datatype != other.datatype:
            agreed = False
            diffs[tensor.name] = float("inf")
            continue
        if a.dtype.kind in "OSUb":
            equal = bool(np.array_equal(a, b))
            diffs[tensor.name] = 0.0 if equal else float("inf")
            agreed = agreed and equal
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        diffs[tensor.name] = float(np.max(np.abs(a64 - b64))) if a.size else 0.0
        tolerance = policy.tolerance(tensor.name)
        agreed = agreed and bool(
            np.allclose(b64, a64, atol=tolerance.atol, rtol=tolerance.rtol, equal_nan=True)
        )
    return Comparison(agreed, diffs)


def record(stats: ShadowStats, comparison: Comparison, primary_ns: int, candidate_ns: int) -> None:
    if comparison.agreed:
        stats.agreed += 1
    else:
        stats.disagreed += 1
    for name, diff in comparison.max_abs_diff.items():
        stats.max_abs_diff[name] = max(stats.max_abs_diff.get(name, 0.0), diff)
    stats.latency_delta_ns += candidate_ns - primary_ns


def copied(request: ModelRequest) -> ModelRequest | None:
    """A copy of ``request`` for a shadow run (None for inputs left in GPU memory)."""
    if request.device_inputs:
        return None
    inputs = {name: np.array(array, copy=True) for name, array in request.inputs.items()}
    return ModelRequest(inputs, request.requested_outputs, dict(request.parameters), request.id)


class ShadowRuns:
    """The shadow runs in progress (background tasks, cancelled at shutdown)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(
        self,
        mirror: Mirror,
        request: ModelRequest | None,
        primary: Sequence[Tensor],
        primary_ns: int,
    ) -> None:
        """Run ``request`` on the candidate and compare with ``primary``, the primary's outputs
        (it took ``primary_ns`` from submission to answer), without delaying the client."""
        if request is None:
            mirror[2].dropped += 1
            return
        # The primary's outputs may alias its inputs (an identity model), which live in shared
        # memory that is reused once the answer has left: compare against a copy.
        kept = [dataclasses.replace(t, data=np.array(t.data, copy=True)) for t in primary]
        run = _run(mirror, request, kept, primary_ns)
        task = asyncio.get_running_loop().create_task(run)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()


async def _run(
    mirror: Mirror,
    request: ModelRequest,
    primary: Sequence[Tensor],
    primary_ns: int,
) -> None:
    policy, candidate, stats = mirror
    stats.mirrored += 1
    started = time.perf_counter_ns()
    try:
        done = await candidate.scheduler.submit(request)
    except RejectedError:
        stats.dropped += 1  # the candidate's queue is full: shadow traffic yields
        return
    except InfermuxError as exc:
        stats.failed += 1
        logger.debug("shadow run on %s:%d failed: %s", candidate.name, candidate.version, exc)
        return
    record(
        stats, compare(policy, primary, done.outputs), primary_ns, time.perf_counter_ns() - started
    )
