"""Imported at start-up by every Python process of an infermux server that a device step starts
with this directory first on ``PYTHONPATH`` (``issue24_steps.sh variants``): sets a tuning
constant from the environment, so that one device call can measure several values on one tree
without carrying a copy of ``src/`` per value (the working tree that travels is capped). A
benchmark aid only: the server has no such settings, and with none of the variables set this
changes nothing.

- ``INFERMUX_BENCH_HOLD=N``: the front ends' micro-batch hold,
  :data:`infermux.transport.grouping.HOLD_WHILE_IN_FLIGHT`.
- ``INFERMUX_BENCH_HOLD_US=N``: the longest a held micro-batch waits,
  :data:`infermux.transport.grouping.HOLD_SECONDS` (2,000 µs by default; a uvloop timer, so
  whole milliseconds: 1000 is the shorter value worth trying).
- ``INFERMUX_BENCH_PAD_STEP=N``: CUDA graph buckets also every ``N`` rows from 8 to 64, beside
  :func:`infermux.runtime.graphs.padding_sizes` (every 2 rows there by default since the
  ``variants-14666b2`` call, so only a step of 1 or an odd one adds buckets now).
- ``INFERMUX_BENCH_EXECUTOR_NICE=N``: the executor process runs at nice ``N`` (negative: ahead
  of the front ends and perf_analyzer's threads on a saturated host; needs root). Asks whether
  the executor's loop, the one serial stage, waits for a core at c=256.
- ``INFERMUX_BENCH_FRONTEND_NICE=N``: every front end at nice ``N`` (positive needs no
  privilege: the executor ahead of the front ends, not of the client).
- ``INFERMUX_BENCH_FRONTEND_SHM=0``: front ends pass system shared-memory references on and the
  executor reads the regions (:meth:`infermux.transport.regions.RegionCopies.resolve` finds
  nothing), for ``benchmarks/frontends/shm_read.py``.
"""

from __future__ import annotations

import os
from types import ModuleType

_HOLD = os.environ.get("INFERMUX_BENCH_HOLD", "")
_HOLD_US = os.environ.get("INFERMUX_BENCH_HOLD_US", "")
_PAD_STEP = os.environ.get("INFERMUX_BENCH_PAD_STEP", "")
_NICE = os.environ.get("INFERMUX_BENCH_EXECUTOR_NICE", "")
_FRONTEND_NICE = os.environ.get("INFERMUX_BENCH_FRONTEND_NICE", "")
_FRONTEND_SHM = os.environ.get("INFERMUX_BENCH_FRONTEND_SHM", "")

if _HOLD or _HOLD_US:
    from infermux.transport import grouping, micro_batcher

    # micro_batcher reads its own copies of the names (``from .grouping import ...``) at each hold.
    if _HOLD:
        grouping.HOLD_WHILE_IN_FLIGHT = micro_batcher.HOLD_WHILE_IN_FLIGHT = int(_HOLD)
    if _HOLD_US:
        grouping.HOLD_SECONDS = micro_batcher.HOLD_SECONDS = int(_HOLD_US) / 1e6

if _PAD_STEP:
    from infermux.runtime import graphs

    _default = graphs.padding_sizes
    _step = int(_PAD_STEP)

    def _finer(top: int) -> list[int]:
        return sorted({*_default(top), *range(8, min(64, top) + 1, _step)})

    graphs.padding_sizes = _finer


def _niced(module: ModuleType, nice: str) -> None:
    """Have ``module.main`` (a process entry point the supervisor spawns) start at ``nice``."""
    main = module.main

    def niced_main(*args: object, **kwargs: object) -> None:
        os.nice(int(nice))
        main(*args, **kwargs)

    # The supervisor's spawn pickles the entry point by module and name: the child looks the
    # name up after this hook ran, so it starts here.
    niced_main.__qualname__ = niced_main.__name__ = "main"
    niced_main.__module__ = module.__name__
    module.main = niced_main


if _NICE:
    from infermux.processes import executor

    _niced(executor, _NICE)

if _FRONTEND_NICE:
    from infermux.processes import frontend

    _niced(frontend, _FRONTEND_NICE)

if _FRONTEND_SHM == "0":
    from infermux.transport import regions

    def _executor_reads(self: regions.RegionCopies, request: object) -> None:
        return None

    regions.RegionCopies.resolve = _executor_reads  # type: ignore[assignment]
