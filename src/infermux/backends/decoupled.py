"""An infermux ``Model`` that is decoupled: ``execute`` returns, per request, an iterator (a
generator) or an async iterator (an async generator) of results, and this module sends each
result through the request's :class:`~infermux.backends.responses.ResponseStream`.

The requests of a batch are driven together, on the instance's thread: sync iterators in turn,
one result each (so every request of the batch streams from the start), async iterators
concurrently on the instance's own event loop. An iterator that ends sends the final flag (an
empty final response); one that raises ends its request with that error; a yielded exception is
an error response and the stream goes on. When a request is given up (its reader went away, or
the server ended it: its execution timeout) its iterator is closed: ``GeneratorExit`` at the
``yield`` it is suspended at, or ``aclose()`` for an async one; it is not advanced again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from infermux.backends.base import ExecuteResult, ModelRequest
from infermux.backends.responses import ResponseStream
from infermux.errors import InternalError

logger = logging.getLogger(__name__)


def drive(
    requests: Sequence[ModelRequest],
    results: Sequence[Any],
    source: str,
    loop: asyncio.AbstractEventLoop | None,
) -> list[ExecuteResult]:
    """Send every request's results; return what ``execute`` returns for them to the
    scheduler: ``{}`` for a stream (its answers went through it) or the request's error.
    ``loop`` (made by the caller, reused across batches) runs the async iterators."""
    answers: list[ExecuteResult] = []
    pumps: list[tuple[ResponseStream, Iterator[Any]]] = []
    tasks: list[tuple[ResponseStream, AsyncIterator[Any]]] = []
    for request, result in zip(requests, results, strict=True):
        stream = request.responses
        assert stream is not None, "a decoupled model's requests carry their response stream"
        if isinstance(result, Exception):
            answers.append(result)
        elif hasattr(result, "__aiter__"):
            tasks.append((stream, aiter(result)))
            answers.append({})
        elif hasattr(result, "__iter__") and not isinstance(result, (Mapping, str, bytes)):
            pumps.append((stream, iter(result)))
            answers.append({})
        else:
            answers.append(
                InternalError(
                    f"{source}: a decoupled model's execute() returns, per request, an iterator "
                    f"or async iterator of results, not {type(result).__name__}"
                )
            )
    while pumps:
        pumps = [(stream, it) for stream, it in pumps if _step(stream, it)]
    if tasks:
        if loop is None:
            raise InternalError(f"{source}: an async iterator needs the instance's event loop")
        loop.run_until_complete(_pump_all(tasks))
    return answers


def _step(stream: ResponseStream, iterator: Iterator[Any]) -> bool:
    """Send the iterator's next result; False once its request is over."""
    if _given_up(stream, iterator):  # while another request of the batch had its turn
        return False
    try:
        item = next(iterator)
    except StopIteration:
        stream.send(None, final=True)
        return False
    except Exception as exc:
        stream.send(exc, final=True)
        return False
    stream.send(item)
    return not _given_up(stream, iterator)


def _given_up(stream: ResponseStream, iterator: Iterator[Any]) -> bool:
    """The request was given up: its iterator is closed (GeneratorExit at its yield)."""
    if stream.cancelled:
        _close(iterator)
        return True
    return False


async def _pump_all(tasks: list[tuple[ResponseStream, AsyncIterator[Any]]]) -> None:
    # Gathered inside the loop: asyncio.gather() called outside it looks for the thread's
    # current loop, and an instance thread has none.
    await asyncio.gather(*(_pump(stream, iterator) for stream, iterator in tasks))


async def _pump(stream: ResponseStream, iterator: AsyncIterator[Any]) -> None:
    try:
        async for item in iterator:
            stream.send(item)
            if stream.cancelled:
                await _aclose(iterator)
                return
    except Exception as exc:
        stream.send(exc, final=True)
        return
    stream.send(None, final=True)


def _close(iterator: Iterator[Any]) -> None:
    close = getattr(iterator, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception:  # its request is over: nobody to tell but the log
        logger.exception("closing the generator of a cancelled request failed")


async def _aclose(iterator: AsyncIterator[Any]) -> None:
    close = getattr(iterator, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except Exception:
        logger.exception("closing the async generator of a cancelled request failed")
