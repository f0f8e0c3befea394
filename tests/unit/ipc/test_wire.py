"""The channel's frames: what the front end sends to give a request up, and the deadline an
inference request carries, survive the wire and keep older frames readable."""

from __future__ import annotations

import msgspec

from infermux.errors import ErrorCode, FailureReason
from infermux.ipc.wire import (
    Call,
    Cancel,
    Failure,
    Infer,
    Release,
    cancelled,
    encode,
    raise_failure,
    to_executor,
    to_frontend,
)


def test_a_cancel_frame_names_the_request_and_is_told_from_the_others() -> None:
    frames = [Cancel(7), Release([64]), Call(8, "ready", [], {}), Cancel(2**40)]
    assert [to_executor(encode(f)) for f in frames] == frames


def test_an_infer_frame_carries_its_deadline() -> None:
    frame = Infer(3, "m", "", "id", {}, [], [], {}, deadline_ns=123_456_789)
    decoded = to_executor(encode(frame))
    assert isinstance(decoded, Infer)
    assert decoded.deadline_ns == 123_456_789


def test_an_infer_frame_without_a_deadline_has_none() -> None:
    # A frame written without the field (as before deadlines travelled) decodes with 0: none.
    old = msgspec.msgpack.encode([1, 3, "m", "", "id", {}, [], [], {}])
    decoded = to_executor(old)
    assert isinstance(decoded, Infer)
    assert decoded.deadline_ns == 0


def test_a_cancelled_answer_is_a_cancelled_error_never_retried() -> None:
    frame = to_frontend(encode(cancelled(5, "the client gave up on the request")))
    assert isinstance(frame, Failure)
    assert frame.seq == 5
    error = raise_failure(frame)
    assert error.code is ErrorCode.CANCELLED
    assert error.reason is FailureReason.CANCELED
    assert "gave up" in error.message
