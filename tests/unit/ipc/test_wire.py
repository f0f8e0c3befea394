"""The channel's frames: what the front end sends to give a request up, the deadline an
inference request carries, and a stream's responses and credit survive the wire and keep older
frames readable."""

from __future__ import annotations

import msgspec

from infermux.errors import ErrorCode, FailureReason, InvalidArgumentError, RejectedError
from infermux.ipc.wire import (
    Answer,
    Call,
    Cancel,
    Credit,
    Failure,
    Infer,
    Part,
    Release,
    WireTensor,
    cancelled,
    encode,
    part,
    part_error,
    raise_failure,
    to_executor,
    to_frontend,
)
from infermux.types import InferResponse


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


def test_a_stream_is_an_infer_frame_with_a_window_and_older_frames_have_none() -> None:
    decoded = to_executor(encode(Infer(3, "m", "", "id", {}, [], [], {}, window=16)))
    assert isinstance(decoded, Infer)
    assert decoded.window == 16
    old = msgspec.msgpack.encode([1, 3, "m", "", "id", {}, [], [], {}, 0, [], False, False])
    decoded = to_executor(old)
    assert isinstance(decoded, Infer)
    assert decoded.window == 0  # answered once, as before streams crossed the channel


def test_credit_frames_name_their_stream_and_are_told_from_the_others() -> None:
    frames = [Credit(7, 8), Cancel(7), Release([64]), Credit(2**40, 1)]
    assert [to_executor(encode(f)) for f in frames] == frames


def test_a_part_frame_says_whether_more_responses_follow() -> None:
    tensor = WireTensor("OUT", "INT32", (1, 1), {}, 128, 4)
    frames = [
        Part(5, "m", "1", "r", {}, [tensor], final=False),
        Part(5, "m", "1", "r", {}, [], final=True, flag_only=True),
        Answer(6, "m", "1", "r", {}, [tensor]),  # a plain answer stays one
    ]
    decoded = [to_frontend(encode(f)) for f in frames]
    assert decoded == frames
    assert [type(f) for f in decoded] == [Part, Part, Answer]


def test_a_response_crosses_as_a_part_and_keeps_its_error() -> None:
    tensor = WireTensor("OUT", "INT32", (1,), {}, 0, 4)
    plain = InferResponse("m", "2", [], "r", {"p": 1}, final=False)
    frame = to_frontend(encode(part(9, plain, [tensor])))
    assert isinstance(frame, Part)
    assert (frame.seq, frame.model, frame.version, frame.id) == (9, "m", "2", "r")
    assert frame.outputs == [tensor]
    assert frame.parameters == {"p": 1}
    assert not frame.final
    assert part_error(frame) is None
    failed = InferResponse("m", "2", [], "r", final=True, error=InvalidArgumentError("bad 3"))
    frame = to_frontend(encode(part(9, failed, [])))
    assert isinstance(frame, Part)
    assert frame.final
    error = part_error(frame)
    assert error is not None
    assert (error.code, error.message) == (ErrorCode.INVALID_ARG, "bad 3")
    rejected = InferResponse("m", "2", [], error=RejectedError("full"))
    error = part_error(to_frontend(encode(part(1, rejected, []))))  # type: ignore[arg-type]
    assert error is not None
    assert error.reason is FailureReason.REJECTED
