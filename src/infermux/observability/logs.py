"""Log set-up shared by every infermux process: text (``default``, ``ISO8601``) or one JSON
object per line (``json``, through python-json-logger), with a role tag per process.

Records about one request carry ``request_id``, ``model`` and ``version`` as extra fields
(``reason`` too when it failed): JSON lines show them as keys, so a log pipeline can join a
client's request id to the server's lines without parsing messages.
"""

from __future__ import annotations

import logging
import sys

from infermux.settings import ServerSettings

_TEXT = "%(asctime)s %(levelname)s {tag}%(name)s: %(message)s"


def configure_logging(settings: ServerSettings, role: str = "") -> None:
    """Log to stderr; a child process names itself (``[frontend-1]``, or a ``role`` key in
    JSON) so that lines can be told apart."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(settings.log_format, role))
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
