"""Triton's log settings over Python logging: checks, levels, the filter between them."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from infermux.errors import ErrorCode, InfermuxError
from infermux.observability import logs


@pytest.fixture(autouse=True)
def fresh_levels() -> Iterator[None]:
    saved = logging.getLogger("infermux").level
    logs._install(0, "default", "")
    yield
    logs._install(0, "default", "")
    logging.getLogger("infermux").setLevel(saved)


def test_defaults() -> None:
    assert logs.log_settings() == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }


@pytest.mark.parametrize(
    ("changes", "code", "fragment"),
    [
        ({"log_colour": True}, ErrorCode.INVALID_ARG, "unknown log setting 'log_colour'"),
        ({"log_info": "yes"}, ErrorCode.INVALID_ARG, "'log_info' must be a boolean"),
        ({"log_verbose_level": True}, ErrorCode.INVALID_ARG, "'log_verbose_level'"),
        ({"log_verbose_level": -1}, ErrorCode.INVALID_ARG, "'log_verbose_level'"),
        ({"log_format": "xml"}, ErrorCode.INVALID_ARG, "'log_format'"),
        ({"log_file": "/tmp/x.log"}, ErrorCode.UNSUPPORTED, "log_file"),
    ],
)
def test_refusals_name_the_setting_and_change_nothing(
    changes: dict[str, object], code: ErrorCode, fragment: str
) -> None:
    with pytest.raises(InfermuxError) as caught:
        logs.update_log_settings({"log_info": False, **changes})
    assert caught.value.code is code
    assert fragment in caught.value.message
    assert logs.log_settings()["log_info"] is True


def test_null_and_the_current_file_change_nothing() -> None:
    assert logs.update_log_settings({"log_info": None, "log_file": ""}) == logs.log_settings()
    assert logs.log_settings()["log_info"] is True


def test_levels_follow_the_switches() -> None:
    infermux = logging.getLogger("infermux")
    logs.update_log_settings({"log_verbose_level": 1})
    assert infermux.getEffectiveLevel() == logging.DEBUG
    logs.update_log_settings({"log_verbose_level": 0, "log_info": False})
    assert infermux.getEffectiveLevel() == logging.WARNING
    logs.update_log_settings({"log_info": True, "log_warning": False})
    record = logging.LogRecord("infermux.x", logging.WARNING, "", 0, "w", None, None)
    assert not logs._LEVELS.filter(record)  # warnings off between info and error, which are on
    record.levelno = logging.ERROR
    assert logs._LEVELS.filter(record)
    logs.update_log_settings({"log_info": False, "log_error": False})
    assert infermux.getEffectiveLevel() > logging.CRITICAL


def test_format_replaces_the_handlers_formatter() -> None:
    handler = logging.StreamHandler()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        logs.update_log_settings({"log_format": "json"})
        assert "Json" in type(handler.formatter).__name__
        assert logs.log_settings()["log_format"] == "json"
    finally:
        root.removeHandler(handler)
