"""Log set-up shared by every infermux process: text (``default``, ``ISO8601``) or one JSON
object per line (``json``, through python-json-logger), with a role tag per process.

Records about one request carry ``request_id``, ``model`` and ``version`` as extra fields
(``reason`` too when it failed): JSON lines show them as keys, so a log pipeline can join a
client's request id to the server's lines without parsing messages.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from infermux.settings import ServerSettings

_TEXT = "%(asctime)s %(levelname)s {tag}%(name)s: %(message)s"


def configure_logging(settings: ServerSettings, role: str = "") -> None:
    """Log to stderr, or append to ``--log-file`` (every process of the server to the same
    file); a child process names itself (``[frontend-1]``, or a ``role`` key in JSON) so that
    lines can be told apart. ``--log-info=false`` (and warning, error) drops that level."""
    handler: logging.Handler
    if settings.log_file is not None:
        handler = logging.FileHandler(settings.log_file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(settings.log_format, role))
    dropped = {
        level
        for level, shown in (
            (logging.INFO, settings.log_info),
            (logging.WARNING, settings.log_warning),
            (logging.ERROR, settings.log_error),
            (logging.CRITICAL, settings.log_error),
        )
        if not shown
    }
    if dropped:
        handler.addFilter(lambda record: record.levelno not in dropped)
    logging.basicConfig(
        level=logging.DEBUG if settings.log_verbose else logging.INFO,
        handlers=[handler],
        force=True,
    )


def formatter(log_format: str, role: str = "") -> logging.Formatter:
    """The formatter for ``--log-format``."""
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter

        return JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            static_fields={"role": role or "server"},
            datefmt="%Y-%m-%dT%H:%M:%S%z",
        )
    tag = f"[{role}] " if role else ""
    if log_format == "ISO8601":
        return logging.Formatter(_TEXT.format(tag=tag), datefmt="%Y-%m-%dT%H:%M:%S%z")
    return logging.Formatter(_TEXT.format(tag=tag))


class RateLimitedLog:
    """Warnings that a client can trigger at will, at most one line per ``interval`` seconds of
    each kind: a flood of bad requests must not become a flood of log lines (or of disk). The
    next line of a kind says how many were suppressed since the last one."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}  # kinds are a few fixed strings, never request data
        self._suppressed: dict[str, int] = {}

    def report(self, kind: str, message: str, *args: object) -> None:
        """A warning, unless one of this ``kind`` was logged less than ``interval`` ago."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last[kind] = now
        suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            message += " (%d similar suppressed)"
            args = (*args, suppressed)
        self._logger.warning(message, *args)
