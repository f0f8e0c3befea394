"""``pb_utils.Logger``: a model's log lines, written through infermux's logging (the
``infermux.models`` logger: same format, JSON or text, as the server's own lines)."""

from __future__ import annotations

import enum
import logging

_logger = logging.getLogger("infermux.models")


class LogLevel(enum.IntEnum):
    INFO = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR
    VERBOSE = logging.DEBUG


class Logger:
    """Triton's static logger: ``Logger.log_info("...")`` and the like."""

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        _logger.log(int(level), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _logger.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _logger.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _logger.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _logger.debug("%s", message)
