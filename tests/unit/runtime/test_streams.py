"""Stream priorities: the config's words mapped into the device's CUDA priority range."""

from __future__ import annotations

import pytest

from infermux.errors import ModelLoadError
from infermux.runtime import Occupancy, parse_priority, priority_for

H100_RANGE = (0, -5)  # (least, greatest): CUDA counts urgency downwards


@pytest.mark.parametrize(("priority", "expected"), [("high", -5), ("normal", 0), ("low", 0)])
def test_priorities_map_into_the_cuda_range(priority: str, expected: int) -> None:
    assert priority_for(parse_priority("m", priority), H100_RANGE) == expected


def test_a_range_below_the_default_still_orders_high_normal_low() -> None:
    spread = (2, -3)
    assert priority_for("high", spread) == -3
    assert priority_for("normal", spread) == 0
    assert priority_for("low", spread) == 2


def test_a_range_without_zero_maps_normal_to_the_least_urgent() -> None:
    assert priority_for("normal", (-1, -4)) == -1


def test_a_device_without_priorities_maps_everything_to_zero() -> None:
    assert {priority_for(p, (0, 0)) for p in ("high", "normal", "low")} == {0}


@pytest.mark.parametrize(
    ("value", "expected"), [("", "normal"), (" HIGH ", "high"), ("low", "low")]
)
def test_parse_priority_accepts_the_three_words(value: str, expected: str) -> None:
    assert parse_priority("m", value) == expected


def test_parse_priority_refuses_anything_else() -> None:
    with pytest.raises(ModelLoadError, match=r"model 'm': parameter STREAM_PRIORITY must be high"):
        parse_priority("m", "urgent")


def test_occupancy_is_busy_time_over_wall_time_between_samples() -> None:
    occupancy = Occupancy(busy_seconds=0.0, now=100.0)
    assert occupancy.sample(0.25, now=101.0) == 0.25
    assert occupancy.sample(1.25, now=102.0) == 1.0
    assert occupancy.sample(1.25, now=104.0) == 0.0
    # Clamped: streams overlap their copies with other work, and clocks are not exact.
    assert occupancy.sample(9.0, now=105.0) == 1.0
    assert occupancy.sample(9.0, now=105.0) == 0.0
