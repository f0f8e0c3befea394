"""Triton's ``inference.GRPCInferenceService`` as thin async handlers over the data plane.

Each handler decodes with :mod:`.codec`, makes one data-plane call and encodes the answer. Errors
become gRPC statuses exactly as Triton maps its error codes (``src/grpc/grpc_utils.cc``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc  # type: ignore[import-untyped,unused-ignore]  # grpcio ships no type information
from tritonclient.grpc import service_pb2, service_pb2_grpc

from infermux.dataplane import Operations
from infermux.errors import ErrorCode, InfermuxError, InvalidArgumentError
from infermux.frontends.grpc import codec
from infermux.frontends.grpc.calls import (
    Context,
    Message,
    deadline_ns,
    decode,
    from_metadata,
    report_malformed,
)
from infermux.frontends.grpc.handlers import Malformed
from infermux.frontends.grpc.stream import serve_stream
from infermux.repository.overrides import FILE_PREFIX
from infermux.settings import DEFAULT_GRPC_MAX_STREAM_IN_FLIGHT
from infermux.types import InferRequest

logger = logging.getLogger(__name__)


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
            report_malformed(method.__name__, context.peer(), request)
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
        from_metadata(infer_request, context.invocation_metadata() or ())
        infer_request.deadline_ns = deadline_ns(context)
        response = await self._dp.infer(infer_request)
        return codec.encode_infer_response(response)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Message], context: Context
    ) -> AsyncIterator[Message]:
        """Triton's bidirectional stream (``stream.py``)."""
        replies = serve_stream(self._dp, request_iterator, context, self._stream_in_flight)
        # Closed here when the call ends or is cancelled, not whenever it is collected: its
        # requests still running are cancelled as the stream goes.
        async with contextlib.aclosing(replies):
            async for reply in replies:
                yield reply

    async def _decode(self, message: Message) -> InferRequest:
        return await decode(self._dp, message)

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


def _setting(value: Message) -> bool | int | str | None:
    """A ``LogSettingsRequest.SettingValue`` as its Python value (None: unset)."""
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)
