"""argparse ``type=`` callables for ``infermux serve`` flags, shared by the flag modules
(``serve_options.py``, ``http_limit_options.py``, ``triton_flags.py``): one wording for every bad
value, which names the flag through argparse (``argument --x: must be > 0, got 0``) and exits 2."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from infermux.settings import DISABLED_PORT

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def boolean(value: str) -> bool:
    """tritonserver's booleans: ``true/false``, ``on/off``, ``1/0`` (any case), and yes/no."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")


def verbosity(value: str) -> int:
    """``--log-verbose``: a level >= 0, or true/false (1/0), as tritonserver reads it."""
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return int(lowered == "true")
    return non_negative_int(value)


def port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a port number") from None
    if number != DISABLED_PORT and not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"port {number} is outside 0-65535 (or -1: no TCP)")
    return number


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


def add_bool(
    parser: argparse._ActionsContainer, flag: str, default: bool | None, help: str
) -> None:
    # tritonserver's boolean flags take a value (--flag=false); a bare --flag means true.
    parser.add_argument(
        flag,
        type=boolean,
        nargs="?",
        const=True,
        default=default,
        metavar="BOOL",
        help=help if default is None else f"{help} (default {str(default).lower()})",
    )
