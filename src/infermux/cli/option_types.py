"""argparse ``type=`` callables for numeric ``infermux serve`` flags, shared by the flag modules
(``serve_options.py``, ``http_limit_options.py``): one wording for every bad value, which names
the flag through argparse (``argument --x: must be > 0, got 0``) and exits 2."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any


def positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    """A number of ``kind`` above 0; a float must also be finite (``nan`` compares false with
    everything, so ``nan <= 0`` would let it through as a timeout that never fires)."""

    def parse(value: str) -> int | float:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{value}' is not a {kind.__name__}") from None
        if not math.isfinite(number) or number <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
        return number

    return parse


def non_negative_seconds(value: str) -> float:
    """Seconds, 0 allowed (flags where 0 turns the thing off)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a number of seconds") from None
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {value}")
    return number


def non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not an integer") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number
