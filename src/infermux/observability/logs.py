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
from collections.abc import Callable, Mapping

from infermux.errors import InvalidArgumentError, UnsupportedError
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
    _install(settings.log_verbose, settings.log_format, role)


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


# -- Triton's logging extension (GET/POST /v2/logging, gRPC LogSettings) -----------------------

LOG_FORMATS = ("default", "ISO8601", "json")
LogValue = bool | int | str


class _Levels(logging.Filter):
    """Which of Triton's log kinds are on. Python's levels are a threshold, Triton's switches
    independent (warnings off, errors on), so the ``infermux`` logger gets the lowest level on
    and this filter, on every handler, drops the kinds switched off between."""

    def __init__(self) -> None:
        super().__init__()
        self.info = self.warning = self.error = True
        self.verbose = 0
        self.format = "default"
        self.role = ""

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return self.error
        if level >= logging.WARNING:
            return self.warning
        if level >= logging.INFO:
            return self.info
        return self.verbose > 0

    def threshold(self) -> int:
        if self.verbose > 0:
            return logging.DEBUG
        for on, level in ((self.info, logging.INFO), (self.warning, logging.WARNING)):
            if on:
                return level
        return logging.ERROR if self.error else logging.CRITICAL + 1


_LEVELS = _Levels()


def _install(verbose: int, log_format: str, role: str) -> None:
    """Called by :func:`configure_logging`: the command line's settings, the filter on the
    handlers."""
    _LEVELS.info = _LEVELS.warning = _LEVELS.error = True
    _LEVELS.verbose, _LEVELS.format, _LEVELS.role = verbose, log_format, role
    for handler in logging.getLogger().handlers:
        handler.addFilter(_LEVELS)
    logging.getLogger("infermux").setLevel(_LEVELS.threshold())


def log_settings() -> dict[str, LogValue]:
    """This process's log settings, as Triton's logging extension names them (``log_file`` is
    always "": infermux logs to stderr)."""
    return {
        "log_file": "",
        "log_info": _LEVELS.info,
        "log_warning": _LEVELS.warning,
        "log_error": _LEVELS.error,
        "log_verbose_level": _LEVELS.verbose,
        "log_format": _LEVELS.format,
    }


def checked_log_changes(changes: Mapping[str, object]) -> dict[str, LogValue]:
    """``changes`` checked as Triton checks them: a known name, a value of its type (None:
    leave the setting as it is, dropped here). Raises InvalidArgumentError naming the setting;
    a ``log_file`` other than "" is UNSUPPORTED, as in Triton (a client must not choose which
    file the server writes)."""
    checked: dict[str, LogValue] = {}
    for name, value in changes.items():
        if value is None:
            continue
        if name == "log_file":
            if value != "":
                raise UnsupportedError(
                    "log_file: the log file location can not be updated through the network "
                    "protocol (infermux logs to stderr; redirect it when starting the server)"
                )
            continue
        if name in ("log_info", "log_warning", "log_error"):
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"log setting '{name}' must be a boolean")
        elif name == "log_verbose_level":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgumentError(
                    f"log setting '{name}' must be an integer >= 0, got {value!r}"
                )
        elif name == "log_format":
            if value not in LOG_FORMATS:
                raise InvalidArgumentError(
                    f"log setting '{name}' must be one of {', '.join(LOG_FORMATS)}, got {value!r}"
                )
        else:
            raise InvalidArgumentError(f"unknown log setting '{name}'")
        checked[name] = value
    return checked


def update_log_settings(changes: Mapping[str, object]) -> dict[str, LogValue]:
    """Check ``changes`` (:func:`checked_log_changes`), apply them all to this process, and
    return its settings."""
    checked = checked_log_changes(changes)
    for name, value in checked.items():
        if name == "log_verbose_level":
            _LEVELS.verbose = int(value)
        elif name == "log_format":
            _LEVELS.format = str(value)
            for handler in logging.getLogger().handlers:
                handler.setFormatter(formatter(_LEVELS.format, _LEVELS.role))
        else:
            setattr(_LEVELS, name.removeprefix("log_"), bool(value))
    logging.getLogger("infermux").setLevel(_LEVELS.threshold())
    return log_settings()
