"""Triton's trace settings over infermux's sampling: checks, scopes, rate, count, flushes."""

from __future__ import annotations

import pytest

from infermux.errors import ErrorCode, InfermuxError
from infermux.observability.trace_settings import (
    TraceTable,
    checked_trace_changes,
    specified,
)

URL = "http://collector:4318/v1/traces"


def table(level: str = "TIMESTAMPS", rate: int = 1) -> TraceTable:
    return TraceTable(level, rate, URL)


def picks(t: TraceTable, model: str, n: int) -> list[bool]:
    return [t.sampler(model).sample() for _ in range(n)]


def test_values_are_answered_as_triton_writes_them() -> None:
    assert table("OFF", 1000).settings() == {
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_mode": "opentelemetry",
        "url": URL,
    }


@pytest.mark.parametrize(
    ("changes", "code", "fragment"),
    [
        ({"trace_file": "t.json"}, ErrorCode.UNSUPPORTED, "trace file location can not be"),
        ({"trace_file": None}, ErrorCode.UNSUPPORTED, "trace file location"),
        ({"trace_level": ["TENSORS"]}, ErrorCode.UNSUPPORTED, "TENSORS"),
        ({"trace_level": ["TIMESTAMPS", "TENSORS"]}, ErrorCode.UNSUPPORTED, "TENSORS"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, ErrorCode.INVALID_ARG, "only one trace level"),
        ({"trace_level": "TIMESTAMPS"}, ErrorCode.INVALID_ARG, "'trace_level' must be a list"),
        ({"trace_level": []}, ErrorCode.INVALID_ARG, "'trace_level' must be a list"),
        ({"trace_level": ["LOUD"]}, ErrorCode.INVALID_ARG, "'LOUD'"),
        ({"trace_rate": 5}, ErrorCode.INVALID_ARG, "'trace_rate': expected a string"),
        ({"trace_rate": "five"}, ErrorCode.INVALID_ARG, "Unable to parse 'trace_rate', got: five"),
        ({"trace_rate": "0"}, ErrorCode.INVALID_ARG, "out of range [ 1,"),
        ({"trace_count": "-2"}, ErrorCode.INVALID_ARG, "'trace_count', value is out of range"),
        ({"log_frequency": "-1"}, ErrorCode.INVALID_ARG, "'log_frequency'"),
        ({"trace_mode": "triton"}, ErrorCode.UNSUPPORTED, "trace_mode can not be updated"),
        ({"trace_colour": "red"}, ErrorCode.INVALID_ARG, "unknown trace setting 'trace_colour'"),
    ],
)
def test_refusals_name_the_setting(
    changes: dict[str, object], code: ErrorCode, fragment: str
) -> None:
    with pytest.raises(InfermuxError) as caught:
        checked_trace_changes({"trace_rate": "3", **changes})
    assert caught.value.code is code
    assert fragment in caught.value.message


def test_accepted_values_are_parsed() -> None:
    assert checked_trace_changes(
        {
            "trace_level": ["TIMESTAMPS"],
            "trace_rate": "10",
            "trace_count": ["-1"],  # gRPC: a list of one string
            "log_frequency": None,
            "trace_mode": "opentelemetry",
        }
    ) == {"trace_level": "TIMESTAMPS", "trace_rate": 10, "trace_count": -1, "log_frequency": None}
    assert checked_trace_changes({"trace_level": ["OFF"]}) == {"trace_level": "OFF"}


def test_rate_samples_one_request_in_n_from_the_change_on() -> None:
    t = table(rate=1)
    assert picks(t, "m", 2) == [True, True]
    t.update("", checked_trace_changes({"trace_rate": "3"}))
    assert picks(t, "m", 6) == [False, False, True, False, False, True]


def test_count_stops_sampling_and_shows_what_is_left() -> None:
    t = table()
    t.update("", checked_trace_changes({"trace_count": "2"}))
    assert picks(t, "m", 4) == [True, True, False, False]
    assert t.settings()["trace_count"] == "0"
    t.update("", checked_trace_changes({"trace_count": "-1"}))
    assert picks(t, "m", 2) == [True, True]


def test_level_off_samples_nothing() -> None:
    t = table()
    t.update("", checked_trace_changes({"trace_level": ["OFF"]}))
    assert picks(t, "m", 3) == [False] * 3
    assert not t.any_on()


def test_a_models_settings_are_its_own_merged_with_the_global_ones() -> None:
    t = table("OFF", 1000)
    t.update("a", checked_trace_changes({"trace_level": ["TIMESTAMPS"]}))
    assert t.any_on()
    assert t.settings("a")["trace_level"] == ["TIMESTAMPS"]
    assert t.settings("a")["trace_rate"] == "1000"  # global (command line)
    assert t.settings("b")["trace_level"] == ["OFF"]
    t.update("", checked_trace_changes({"trace_rate": "2"}))
    assert t.settings("a")["trace_rate"] == "2"  # what it does not set follows the global value
    assert picks(t, "a", 4) == [False, True, False, True]
    assert picks(t, "b", 4) == [False] * 4
    # A count the model does not set is the global one, used up by either scope.
    t.update("", checked_trace_changes({"trace_count": "1", "trace_level": ["TIMESTAMPS"]}))
    assert picks(t, "a", 2) == [False, True]
    assert picks(t, "b", 2) == [False, False]
    assert t.settings()["trace_count"] == "0"
    # null clears a model's setting; left with none, the model uses the global settings again.
    t.update("a", checked_trace_changes({"trace_level": None}))
    assert t.settings("a") == t.settings()
    assert t.sampler("a") is t.sampler("")


def test_global_null_returns_to_the_command_line() -> None:
    t = table("OFF", 1000)
    t.update("", checked_trace_changes({"trace_level": ["TIMESTAMPS"], "trace_rate": "5"}))
    t.update("", checked_trace_changes({"trace_level": None, "trace_rate": None}))
    assert t.settings() == table("OFF", 1000).settings()


def test_log_frequency_asks_for_a_flush_every_n_traces() -> None:
    t = table()
    sampler = t.sampler("")
    assert [sampler.ended() for _ in range(3)] == [False] * 3  # 0: the exporter's schedule
    t.update("", checked_trace_changes({"log_frequency": "2"}))
    assert [sampler.ended() for _ in range(4)] == [False, True, False, True]
    assert t.settings()["log_frequency"] == "2"


def test_specified_keeps_what_clients_set() -> None:
    before = {"trace_rate": "5"}
    after = specified(before, {"trace_level": ["TIMESTAMPS"], "trace_rate": None})
    assert after == {"trace_level": ["TIMESTAMPS"]}
    assert before == {"trace_rate": "5"}  # a new dict
