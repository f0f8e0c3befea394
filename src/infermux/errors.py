"""The error tree shared by every layer.

Each error carries one of Triton's error codes; front ends map the code to an HTTP status or a gRPC
status code, so the data plane and everything below it never think in transport terms.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """Triton's error codes (``TRITONSERVER_Error_Code``), which front ends map to wire statuses."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


class FailureReason(enum.Enum):
    """Why an inference request failed, as Triton's ``nv_inference_request_failure`` metric
    labels it (``reason``): refused by the scheduler (queue full, timed out in the queue,
    unloading), given up by the client, raised by the model, or anything else (bad input)."""

    REJECTED = "REJECTED"
    CANCELED = "CANCELED"
    BACKEND = "BACKEND"
    OTHER = "OTHER"


class InfermuxError(Exception):
    """Base of every error infermux reports to a client.

    ``message`` is shown to the client verbatim, so it must name what was wrong (the field, the
    model, the tensor) and never leak internals such as stack traces. ``reason`` classifies an
    inference failure for metrics; the scheduler marks what the model raised as ``BACKEND``.
    """

    code: ErrorCode = ErrorCode.INTERNAL
    reason: FailureReason = FailureReason.OTHER

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message


class InvalidArgumentError(InfermuxError):
    """The request (or a configuration) is malformed; retrying it unchanged cannot succeed."""

    code = ErrorCode.INVALID_ARG


class NotFoundError(InfermuxError):
    """A model, version or region named by the request does not exist."""

    code = ErrorCode.NOT_FOUND


class UnavailableError(InfermuxError):
    """The server cannot take this request now (model not ready, queue full, shutting down)."""

    code = ErrorCode.UNAVAILABLE


class RejectedError(UnavailableError):
    """The scheduler refused the request (queue full, timed out while queued, model unloading)."""

    reason = FailureReason.REJECTED


class UnsupportedError(InfermuxError):
    """The operation is understood but not supported in this configuration."""

    code = ErrorCode.UNSUPPORTED


class DecoupledModelError(UnsupportedError):
    """A single-response call reached a decoupled model, whose answers only a stream carries.
    Typed so that a caller can say how to stream from where it stands (a model's BLS call
    names ``exec(decoupled=True)``; a client, gRPC ModelStreamInfer)."""

    def __init__(self, message: str, model: str) -> None:
        super().__init__(message)
        self.model = model


class InternalError(InfermuxError):
    """Something failed inside the server or the model, not because of the request."""

    code = ErrorCode.INTERNAL


class ConfigError(InvalidArgumentError):
    """A model configuration is invalid; the message names the file and the field."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        where = f"{source}: " if source else ""
        # "*" means the parser could not tell which field (e.g. a syntax error at line:column).
        what = "" if field in ("", "*") else f"field '{field}': "
        super().__init__(f"{where}{what}{problem}")
        self.source = source
        self.field = field


class ModelLoadError(InfermuxError):
    """A model version could not be loaded; the repository index shows ``message`` as reason.

    INVALID_ARG, as Triton answers a failed load (HTTP 400): what failed is the model or its
    config (a bad field, a file missing or outside the model directory, the model raising while
    it loads), and loading it again unchanged fails again."""

    code = ErrorCode.INVALID_ARG


class StartupError(Exception):
    """The server cannot start (bad repository path, port in use, ...); the message says why."""
