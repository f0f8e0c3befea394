"""Triton's ``inference.GRPCInferenceService`` as thin async handlers over the data plane.

Each handler decodes with :mod:`.codec`, makes one data-plane call and encodes the answer. Errors
become gRPC statuses exactly as Triton maps its error codes (``src/grpc/grpc_utils.cc``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, NoReturn, TypeVar

import grpc  # type: ignore[import-untyped,unused-ignore]  # grpcio ships no type information
from tritonclient.grpc import service_pb2, service_pb2_grpc

from infermux.dataplane import Operations
from infermux.errors import ErrorCode, InfermuxError, InvalidArgumentError
from infermux.frontends.grpc import codec
from infermux.frontends.grpc.handlers import Malformed
from infermux.frontends.model_first import unknown_model_first
from infermux.observability import tracing
from infermux.observability.logs import RateLimitedLog
from infermux.repository.overrides import FILE_PREFIX
from infermux.routing.router import ROUTING_KEY_HEADER, ROUTING_KEY_PARAMETER
from infermux.settings import DEFAULT_GRPC_MAX_STREAM_IN_FLIGHT
from infermux.types import InferRequest

logger = logging.getLogger(__name__)
_client_faults = RateLimitedLog(logger)

Message = Any  # protobuf messages: tritonclient's generated modules carry no type information
Context = Any  # grpc.aio.ServicerContext

STATUS_OF: dict[ErrorCode, Any] = {
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
}
"""Triton's ``ErrorCodeToGrpcStatus``: every error code has its own gRPC status."""


EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"
"""Request parameter (tritonclient's ``enable_empty_final_response``): flag every stream
response final or not, and send a final flag that came without outputs as an empty response."""
FINAL_PARAMETER = "triton_final_response"
"""Response parameter: this is the last response of its request."""

_S = TypeVar("_S")
_R = TypeVar("_R")


async def _abort(context: Context, code: Any, message: str) -> NoReturn:
    await context.abort(code, message)
    # grpc.aio's abort always raises; this line only tells the type checker so.
    raise AssertionError("context.abort returned")


def _unary(
    method: Callable[[_S, Message, Context], Awaitable[_R]],
) -> Callable[[_S, Message, Context], Awaitable[_R]]:
    """Answer an :class:`InfermuxError` with its Triton status, anything else with INTERNAL."""

    @functools.wraps(method)
    async def handler(self: _S, request: Message, context: Context) -> _R:
        if isinstance(request, Malformed):
            _malformed(method.__name__, context.peer(), request)
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, request.describe())
        try:
            return await method(self, request, context)
        except InfermuxError as exc:
            await _abort(context, STATUS_OF[exc.code], exc.message)
        except grpc.aio.AbortError:  # the handler aborted itself; a second abort would fail
            raise
        except Exception as exc:
            logger.exception("unhandled error in gRPC %s", method.__name__)
            await _abort(context, grpc.StatusCode.INTERNAL, f"internal error: {exc}")

    return handler


def _malformed(method: str, peer: str, request: Malformed) -> None:
    # One line, no traceback: the fault is the client's, and a client can send these at will.
    _client_faults.report(
        "malformed", "malformed gRPC %s request from %s: %s", method, peer, request.reason
    )


# The generated base class is typed Any (hence the ignore); it answers UNIMPLEMENTED for any RPC
# a subclass does not override, and method names are the RPC names.
class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Every RPC of Triton's ``GRPCInferenceService`` over one data plane, for ``grpc.aio``."""

    def __init__(
        self, dataplane: Operations, *, stream_in_flight: int = DEFAULT_GRPC_MAX_STREAM_IN_FLIGHT
    ) -> None:
        self._dp = dataplane
        self._stream_in_flight = stream_in_flight

    # -- health and metadata ----------------------------------------------------------------------

    @_unary
    async def ServerLive(self, request: Message, context: Context) -> Message:
        return service_pb2.ServerLiveResponse(live=self._dp.live())

    @_unary
    async def ServerReady(self, request: Message, context: Context) -> Message:
        return service_pb2.ServerReadyResponse(ready=await self._dp.ready())

    @_unary
    async def ModelReady(self, request: Message, context: Context) -> Message:
        try:
            ready = await self._dp.model_ready(request.name, request.version)
        except InfermuxError as exc:
            # Readiness of a model nobody has heard of is a plain "no", as in Triton.
            if exc.code is not ErrorCode.NOT_FOUND:
                raise
            ready = False
        return service_pb2.ModelReadyResponse(ready=ready)

    @_unary
    async def ServerMetadata(self, request: Message, context: Context) -> Message:
        return codec.server_metadata_response(self._dp.server_metadata())

    @_unary
    async def ModelMetadata(self, request: Message, context: Context) -> Message:
        meta = await self._dp.model_metadata(request.name, request.version)
        return codec.model_metadata_response(meta)

    @_unary
    async def ModelConfig(self, request: Message, context: Context) -> Message:
        return codec.model_config_response(
            await self._dp.model_config(request.name, request.version)
        )

    @_unary
    async def ModelStatistics(self, request: Message, context: Context) -> Message:
        stats = await self._dp.model_statistics(request.name, request.version)
        return codec.statistics_response(stats)

    # -- inference --------------------------------------------------------------------------------

    @_unary
    async def ModelInfer(self, request: Message, context: Context) -> Message:
        infer_request = await self._decode(request)
        _from_metadata(infer_request, context.invocation_metadata() or ())
        infer_request.deadline_ns = _deadline_ns(context)
        response = await self._dp.infer(infer_request)
        return codec.encode_infer_response(response)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Message], context: Context
    ) -> AsyncIterator[Message]:
        """Run the requests of the stream concurrently; send each response as soon as it comes.

        A request gets one response, or, from a decoupled model, zero or more then a final
        flag: responses of one request leave in the order the model sent them. With the request
        parameter ``triton_enable_empty_final_response`` true, a final flag that came without
        outputs is sent as an empty response; otherwise such a flag sends nothing. As in
        Triton's stream handler, every response sent carries ``triton_final_response``.

        Memory is bounded twice. At most ``stream_in_flight`` requests are read and not yet
        finished: past that, the stream is not read until a request's last response has been
        written. At most as many responses wait to be written: past that, the requests stop
        taking responses from the data plane, which holds their models back
        (``backends/responses.py``). grpc.aio writes a response only as the client's
        flow-control window allows, so a client that stops reading meets HTTP/2 flow control
        instead of growing the server's memory.

        A failed response is sent with ``error_message`` and the stream stays open; once the
        client half-closes, the stream ends when the requests still running have finished.
        """
        # (reply, last of its request) or None: the reader is done.
        answers: asyncio.Queue[tuple[Message | None, bool] | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()
        # A slot is taken before a request is read and given back once its last reply is written.
        slots = asyncio.Semaphore(self._stream_in_flight)
        # A reply takes one of these before it is queued and gives it back once written.
        buffered = asyncio.Semaphore(self._stream_in_flight)

        metadata = tuple(context.invocation_metadata() or ())
        peer = context.peer()
        deadline_ns = _deadline_ns(context)  # the stream's: no request outlives it

        async def answer(message: Message) -> None:
            replies = self._stream_replies(message, metadata, peer, deadline_ns)
            try:
                async for item in replies:
                    await buffered.acquire()
                    answers.put_nowait(item)
            finally:
                await replies.aclose()

        async def read() -> None:
            requests = aiter(request_iterator)
            try:
                while True:
                    await slots.acquire()
                    try:
                        message = await anext(requests)
                    except StopAsyncIteration:
                        break
                    task = asyncio.create_task(answer(message))
                    running.add(task)
                    task.add_done_callback(running.discard)
                await asyncio.gather(*running)
            finally:
                answers.put_nowait(None)  # wakes the writer, also when reading failed

        reader = asyncio.create_task(read())
        try:
            while (item := await answers.get()) is not None:
                reply, last = item
                if reply is not None:
                    # grpc.aio asks for the next reply only once this one has been sent.
                    yield reply
                buffered.release()
                if last:
                    slots.release()
            await reader  # surfaces a failed read as the stream's status
        finally:
            # The client went away or the server is stopping: nobody is left to answer.
            reader.cancel()
            for task in list(running):
                task.cancel()

    async def _decode(self, message: Message) -> InferRequest:
        try:
            return codec.decode_infer_request(message)
        except InvalidArgumentError as exc:
            await unknown_model_first(self._dp, message.model_name, message.model_version, exc)

    async def _stream_replies(
        self, message: Message, metadata: tuple[Any, ...], peer: str, deadline_ns: int
    ) -> AsyncGenerator[tuple[Message | None, bool]]:
        """The replies to one request of a stream, each with whether it is the last (which is
        None for a final flag with nothing to send)."""
        if isinstance(message, Malformed):
            _malformed("ModelStreamInfer", peer, message)
            yield service_pb2.ModelStreamInferResponse(error_message=message.describe()), True
            return
        flagged = False  # triton_enable_empty_final_response
        try:
            request = await self._decode(message)
            flagged = request.parameters.pop(EMPTY_FINAL_PARAMETER, False) is True
            _from_metadata(request, metadata)
            request.deadline_ns = deadline_ns
            async for response in self._dp.infer_stream(request):
                final = response.final
                if response.error is not None:
                    yield _stream_error(message, response.error.message, final), final
                elif not response.flag_only or flagged:
                    reply = service_pb2.ModelStreamInferResponse()
                    encoded = codec.encode_infer_response(response, reply.infer_response)
                    # As Triton's stream handler: on every response it writes, whatever the option.
                    encoded.parameters[FINAL_PARAMETER].bool_param = final
                    yield reply, final
                else:
                    yield None, True  # the flag alone: nothing to send, the request is over
        except Exception as exc:
            if isinstance(exc, InfermuxError):
                error = exc.message
            else:
                logger.exception("unhandled error in a gRPC stream request")
                error = f"internal error: {exc}"
            yield _stream_error(message, error, True), True

    # -- repository -------------------------------------------------------------------------------

    @_unary
    async def RepositoryIndex(self, request: Message, context: Context) -> Message:
        entries = await self._dp.repository_index(ready_only=request.ready)
        return codec.repository_index_response(entries)

    @_unary
    async def RepositoryModelLoad(self, request: Message, context: Context) -> Message:
        name = request.model_name
        override: str | None = None
        files: dict[str, bytes] = {}
        for key, value in request.parameters.items():
            if key.startswith(FILE_PREFIX):
                if value.WhichOneof("parameter_choice") != "bytes_param":
                    raise InvalidArgumentError(
                        f"failed to load '{name}': load parameter '{key}' must be a bytes_param "
                        "holding the file's content"
                    )
                files[key.removeprefix(FILE_PREFIX)] = value.bytes_param
            elif key == "config":
                if value.WhichOneof("parameter_choice") != "string_param":
                    raise InvalidArgumentError(
                        f"failed to load '{name}': parameter 'config' must be a ModelConfig "
                        "JSON string"
                    )
                override = value.string_param
        await self._dp.load_model(name, config_override=override, files=files or None)
        return service_pb2.RepositoryModelLoadResponse()

    @_unary
    async def RepositoryModelUnload(self, request: Message, context: Context) -> Message:
        await self._dp.unload_model(request.model_name)
        return service_pb2.RepositoryModelUnloadResponse()

    # -- system shared memory ---------------------------------------------------------------------

    @_unary
    async def SystemSharedMemoryStatus(self, request: Message, context: Context) -> Message:
        return codec.shm_status_response(await self._dp.shm_status(request.name))

    @_unary
    async def SystemSharedMemoryRegister(self, request: Message, context: Context) -> Message:
        await self._dp.shm_register(request.name, request.key, request.offset, request.byte_size)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    @_unary
    async def SystemSharedMemoryUnregister(self, request: Message, context: Context) -> Message:
        await self._dp.shm_unregister(request.name)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    # -- CUDA shared memory -----------------------------------------------------------------------

    @_unary
    async def CudaSharedMemoryStatus(self, request: Message, context: Context) -> Message:
        return codec.cuda_shm_status_response(await self._dp.cuda_shm_status(request.name))

    @_unary
    async def CudaSharedMemoryRegister(self, request: Message, context: Context) -> Message:
        await self._dp.cuda_shm_register(
            request.name, request.raw_handle, request.device_id, request.byte_size
        )
        return service_pb2.CudaSharedMemoryRegisterResponse()

    @_unary
    async def CudaSharedMemoryUnregister(self, request: Message, context: Context) -> Message:
        await self._dp.cuda_shm_unregister(request.name)
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    # -- not implemented yet ----------------------------------------------------------------------

    @_unary
    async def TraceSetting(self, request: Message, context: Context) -> Message:
        # An empty list is how a client clears a setting (tritonclient sends None so).
        changes = {key: list(entry.value) or None for key, entry in request.settings.items()}
        settings = await self._dp.trace_settings(request.model_name, changes)
        response = service_pb2.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    @_unary
    async def LogSettings(self, request: Message, context: Context) -> Message:
        changes = {key: _setting(value) for key, value in request.settings.items()}
        settings = await self._dp.log_settings(changes)
        response = service_pb2.LogSettingsResponse()
        for key, value in settings.items():
            entry = response.settings[key]
            if isinstance(value, bool):
                entry.bool_param = value
            elif isinstance(value, int):
                entry.uint32_param = value
            else:
                entry.string_param = str(value)
        return response


def _stream_error(message: Message, error: str, final: bool) -> Message:
    """A failed response; it echoes the request's id so that the client can tell which of its
    requests failed."""
    response = service_pb2.ModelInferResponse(
        id=message.id, model_name=message.model_name, model_version=message.model_version
    )
    response.parameters[FINAL_PARAMETER].bool_param = final
    return service_pb2.ModelStreamInferResponse(error_message=error, infer_response=response)


def _setting(value: Message) -> bool | int | str | None:
    """A ``LogSettingsRequest.SettingValue`` as its Python value (None: unset)."""
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)


def _deadline_ns(context: Context) -> int:
    """The call's deadline as a ``time.monotonic_ns()`` instant (0: the client set none).
    grpc.aio cancels the handler then; the instant travels to an executor process, which must
    not start the request after it (``InferRequest.deadline_ns``)."""
    remaining = context.time_remaining()
    return 0 if remaining is None else time.monotonic_ns() + int(remaining * 1e9)


def _from_metadata(request: InferRequest, metadata: Iterable[tuple[str, str]]) -> None:
    """What infermux reads from the call's metadata: the W3C trace context and a routing key."""
    pairs = list(metadata)
    request.trace_context = tracing.carrier(pairs)
    for key, value in pairs:
        if key == ROUTING_KEY_HEADER:
            request.parameters.setdefault(ROUTING_KEY_PARAMETER, value)
