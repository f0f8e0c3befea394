from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from infermux.observability.logs import RateLimitedLog, configure_logging, formatter
from infermux.settings import ServerSettings


def record(**extra: object) -> logging.LogRecord:
    made = logging.LogRecord("infermux.x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    made.__dict__.update(extra)
    return made


def test_json_lines_carry_the_request_fields() -> None:
    line = formatter("json", "executor").format(record(request_id="r1", model="m", version=2))
    doc = json.loads(line)
    assert doc["message"] == "hello you"
    assert doc["level"] == "INFO"
    assert doc["logger"] == "infermux.x"
    assert doc["role"] == "executor"
    assert (doc["request_id"], doc["model"], doc["version"]) == ("r1", "m", 2)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", doc["time"])


def test_text_formats() -> None:
    iso = formatter("ISO8601", "frontend-1").format(record())
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} INFO \[frontend-1\] infermux.x", iso)
    plain = formatter("default").format(record())
    assert plain.endswith("INFO infermux.x: hello you")
    assert json.loads(formatter("json").format(record()))["role"] == "server"


def test_rate_limited_warnings_count_what_they_suppress(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    log = RateLimitedLog(logging.getLogger("infermux.x"), interval=10, clock=lambda: now[0])
    for _ in range(5):
        log.report("bad", "bad request from %s", "peer")
    log.report("other", "another kind")  # kinds are limited separately
    now[0] += 10
    log.report("bad", "bad request from %s", "peer")
    assert [r.getMessage() for r in caplog.records] == [
        "bad request from peer",
        "another kind",
        "bad request from peer (4 similar suppressed)",
    ]


def test_log_file_and_levels_turned_off(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    settings = ServerSettings(log_file=path, log_info=False, log_error=False)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging(settings)
        logger = logging.getLogger("infermux.x")
        for level in (logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL):
            logger.log(level, "at %s", logging.getLevelName(level))
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], root.level = saved
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith("WARNING infermux.x: at WARNING")
