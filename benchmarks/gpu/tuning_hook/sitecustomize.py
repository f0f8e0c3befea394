"""Imported at start-up by every Python process of an infermux server that a device step starts
with this directory first on ``PYTHONPATH`` (``issue24_steps.sh variants``): sets a tuning
constant from the environment, so that one device call can measure several values on one tree
without carrying a copy of ``src/`` per value (the working tree that travels is capped). A
benchmark aid only: the server has no such settings, and with none of the variables set this
changes nothing.

- ``INFERMUX_BENCH_HOLD=N``: the front ends' micro-batch hold,
  :data:`infermux.transport.grouping.HOLD_WHILE_IN_FLIGHT`.
- ``INFERMUX_BENCH_PAD_STEP=N``: CUDA graph buckets also every ``N`` rows from 8 to 64, beside
  :func:`infermux.runtime.graphs.padding_sizes` (steps of 4 there by default).
"""

from __future__ import annotations

import os

_HOLD = os.environ.get("INFERMUX_BENCH_HOLD", "")
_PAD_STEP = os.environ.get("INFERMUX_BENCH_PAD_STEP", "")

if _HOLD:
    from infermux.transport import grouping, micro_batcher

    # micro_batcher reads its own copy of the name (``from .grouping import ...``) at each hold.
    grouping.HOLD_WHILE_IN_FLIGHT = micro_batcher.HOLD_WHILE_IN_FLIGHT = int(_HOLD)

if _PAD_STEP:
    from infermux.runtime import graphs

    _default = graphs.padding_sizes
    _step = int(_PAD_STEP)

    def _finer(top: int) -> list[int]:
        return sorted({*_default(top), *range(8, min(64, top) + 1, _step)})

    graphs.padding_sizes = _finer
