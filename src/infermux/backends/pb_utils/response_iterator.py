"""What a BLS call on a decoupled model gives back: its responses, one at a time, as they come.

``request.exec(decoupled=True)`` returns a :class:`ResponseIterator` once the first response
has come; ``await request.async_exec(decoupled=True)`` gives one the same way without blocking
the model's event loop. As in Triton's python_backend:

- it yields every response, in order; the last may be empty (no output tensors) when the target
  sent its final flag alone, so a model checks ``len(response.output_tensors()) > 0``;
- a failed response has ``has_error()`` true and the stream may go on after it; a call that
  fails before it runs (unknown model, bad input) yields one failed response;
- a model that is not decoupled answers once: that response is the last;
- iterating again after the last response replays them all from the first;
- an iterator dropped before its end is read to its end by the server and its responses
  dropped: the target runs as it would for a reader. ``cancel()`` gives the call up instead
  (the target's ``is_cancelled()`` turns true).

``for`` waits on the calling thread; ``async for`` (an infermux addition) awaits each response
on the model's own event loop instead, so that an ``async def execute`` can overlap it.
"""

from __future__ import annotations

from infermux.backends.pb_utils.response import InferenceResponse, failure, response_of
from infermux.backends.server_calls import CallResponses
from infermux.errors import InfermuxError
from infermux.types import InferResponse


class ResponseIterator:
    """The responses of one BLS call on a decoupled model (see the module's docstring)."""

    def __init__(self, first: InferenceResponse, last: bool, rest: CallResponses | None) -> None:
        self._responses = [first]  # kept for a replay, as Triton keeps them
        self._index = 0  # the next to yield of those read
        self._finished = last
        self._rest = rest

    @classmethod
    def read(cls, calls: CallResponses) -> ResponseIterator:
        """Wait for the first response of ``calls`` on this thread."""
        try:
            return cls._started(calls.next(), calls)
        except InfermuxError as exc:
            return cls(failure(exc), True, None)

    @classmethod
    async def aread(cls, calls: CallResponses) -> ResponseIterator:
        """Await the first response of ``calls``."""
        try:
            return cls._started(await calls.anext(), calls)
        except InfermuxError as exc:
            return cls(failure(exc), True, None)

    @classmethod
    def _started(cls, first: InferResponse | None, calls: CallResponses) -> ResponseIterator:
        if first is None:  # the stream ended without a response
            return cls(InferenceResponse(), True, None)
        return cls(response_of(first), first.final, calls)

    def __iter__(self) -> ResponseIterator:
        self._rewind()
        return self

    def __next__(self) -> InferenceResponse:
        if self._index < len(self._responses):
            self._index += 1
            return self._responses[self._index - 1]
        if self._finished or self._rest is None:
            raise StopIteration
        response = self._took(self._rest.next())
        if response is None:
            raise StopIteration
        return response

    def __aiter__(self) -> ResponseIterator:
        self._rewind()
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._index < len(self._responses):
            self._index += 1
            return self._responses[self._index - 1]
        if self._finished or self._rest is None:
            raise StopAsyncIteration
        response = self._took(await self._rest.anext())
        if response is None:
            raise StopAsyncIteration
        return response

    def cancel(self) -> None:
        """Give the call up: the target's ``is_cancelled()`` turns true and what it sends from
        now on is dropped; the iteration ends after the responses already read."""
        if not self._finished and self._rest is not None:
            self._finished = True
            self._rest.cancel()

    def __del__(self) -> None:
        if not self._finished and self._rest is not None:
            self._rest.abandon()

    def _rewind(self) -> None:
        # Triton's: a new iteration after the last response starts again from the first.
        if self._finished and self._index >= len(self._responses):
            self._index = 0

    def _took(self, answer: InferResponse | None) -> InferenceResponse | None:
        if answer is None:
            self._finished = True
            self._index = len(self._responses)
            return None
        response = response_of(answer)
        self._finished = answer.final
        self._responses.append(response)
        self._index = len(self._responses)
        return response
