"""``pb_utils.TritonError`` and ``pb_utils.TritonModelException``, with Triton's error codes."""

from __future__ import annotations

from typing import ClassVar

from infermux.errors import ErrorCode, InfermuxError


class TritonError:
    """An error a model puts in one response (``InferenceResponse(error=...)``): that request
    alone fails, with ``message`` and the status of ``code`` (INTERNAL by default, as Triton)."""

    UNKNOWN: ClassVar[int] = 0
    INTERNAL: ClassVar[int] = 1
    NOT_FOUND: ClassVar[int] = 2
    INVALID_ARG: ClassVar[int] = 3
    UNAVAILABLE: ClassVar[int] = 4
    UNSUPPORTED: ClassVar[int] = 5
    ALREADY_EXISTS: ClassVar[int] = 6
    CANCELLED: ClassVar[int] = 7

    def __init__(self, message: str, code: int = 1) -> None:
        if code not in _CODES:
            raise TritonModelException(f"unknown TritonError code {code!r}")
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {_CODES[self._code].value})"

    def as_exception(self) -> InfermuxError:
        """The infermux error that fails the request with this message and code."""
        return InfermuxError(self._message, _CODES[self._code])

    @classmethod
    def of(cls, error: InfermuxError) -> TritonError:
        """An infermux error as a model sees it (the answer of a BLS call that failed)."""
        return cls(error.message, _NUMBERS[error.code])


_CODES: dict[int, ErrorCode] = {
    TritonError.UNKNOWN: ErrorCode.UNKNOWN,
    TritonError.INTERNAL: ErrorCode.INTERNAL,
    TritonError.NOT_FOUND: ErrorCode.NOT_FOUND,
    TritonError.INVALID_ARG: ErrorCode.INVALID_ARG,
    TritonError.UNAVAILABLE: ErrorCode.UNAVAILABLE,
    TritonError.UNSUPPORTED: ErrorCode.UNSUPPORTED,
    TritonError.ALREADY_EXISTS: ErrorCode.ALREADY_EXISTS,
    TritonError.CANCELLED: ErrorCode.CANCELLED,
}
_NUMBERS = {code: number for number, code in _CODES.items()}


class TritonModelException(Exception):
    """Raised by the API on misuse, and by models to fail a whole batch."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message
