"""Imported at start-up by every Python process of an infermux server that a device step starts
with this directory first on ``PYTHONPATH`` (``issue24_steps.sh hold``): sets the front ends'
micro-batch hold, :data:`infermux.transport.grouping.HOLD_WHILE_IN_FLIGHT`, to
``$INFERMUX_BENCH_HOLD``, so that one device call can measure several values on one tree without
carrying a copy of ``src/`` per value. A benchmark aid only: the server has no such setting.
"""

from __future__ import annotations

import os

_HOLD = os.environ.get("INFERMUX_BENCH_HOLD", "")

if _HOLD:
    from infermux.transport import grouping, micro_batcher

    # micro_batcher reads its own copy of the name (``from .grouping import ...``) at each hold.
    grouping.HOLD_WHILE_IN_FLIGHT = micro_batcher.HOLD_WHILE_IN_FLIGHT = int(_HOLD)
