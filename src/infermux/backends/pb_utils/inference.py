"""``pb_utils.InferenceRequest`` and ``pb_utils.InferenceResponseSender``.

A request is what ``execute`` receives (one per client request, its inputs the request's own
arrays), and also what a model builds to call another model (BLS): ``exec()`` from ``execute``,
``await async_exec()`` from an ``async def execute``. Such a call goes through the server's data
plane like a client's request (:mod:`infermux.backends.server_calls`); its failure comes back as
a response whose ``has_error()`` is true, not as an exception. With ``decoupled=True`` the call
reads a stream of responses (:mod:`.response_iterator`), which a decoupled target requires.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Literal, overload

from infermux.backends import server_calls
from infermux.backends.pb_utils.errors import TritonError, TritonModelException
from infermux.backends.pb_utils.response import (
    InferenceResponse,
    failure,
    parameters_json,
    response_of,
)
from infermux.backends.pb_utils.response_iterator import ResponseIterator
from infermux.backends.pb_utils.tensor import Tensor
from infermux.errors import DecoupledModelError, InfermuxError
from infermux.types import InferRequest, Parameter, RequestedOutput, datatype_of
from infermux.types import Tensor as WireTensor

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2


class InferenceResponseSender:
    """What ``request.get_response_sender()`` gives a decoupled model: ``send(response,
    flags)`` any number of times, from any thread, also after ``execute`` returned; the last
    with ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (``response`` may then be None).
    A send blocks while the client is too far behind in reading."""

    def __init__(
        self,
        send: Callable[[InferenceResponse | None, bool], None],
        cancelled: Callable[[], bool],
    ) -> None:
        self._send = send
        self._cancelled = cancelled

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is not FINAL."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException('"response" must be an InferenceResponse or None.')
        try:
            self._send(response, final)
        except RuntimeError:
            raise TritonModelException(
                "Unable to send response. Response sender has been closed."
            ) from None

    def is_cancelled(self) -> bool:
        return self._cancelled()


class InferenceRequest:
    """One request: given to ``execute``, or built by a model to call another (BLS)."""

    _sender: InferenceResponseSender | None = None  # set for a decoupled model's requests
    _cancelled: Callable[[], bool] | None = None  # set for a request given to execute()

    def __init__(  # noqa: PLR0917  (Triton's signature, positions included)
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: object = None,
        trace: object = None,
        parameters: dict[str, Parameter] | str | None = None,
    ) -> None:
        self._id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._outputs = list(requested_output_names)
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters_json(parameters)

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def parameters(self) -> str:
        """The request's parameters as a JSON object string, as Triton gives them."""
        return self._parameters

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def is_cancelled(self) -> bool:
        """The client gave the request up (or, decoupled, the server ended it) while it ran."""
        if self._cancelled is not None:
            return self._cancelled()
        return self._sender is not None and self._sender.is_cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() is for decoupled models (model_transaction_policy "
                "{ decoupled: true }): return one InferenceResponse per request from execute()"
            )
        return self._sender

    @overload
    def exec(self, decoupled: Literal[False] = False) -> InferenceResponse: ...
    @overload
    def exec(self, decoupled: Literal[True]) -> ResponseIterator: ...
    @overload
    def exec(self, decoupled: bool) -> InferenceResponse | ResponseIterator: ...

    def exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """Run this request on model ``model_name`` and wait for its answer (BLS); with
        ``decoupled=True``, for its first response: the iterator yields the rest as they come."""
        calls, request = self._call()
        if decoupled:
            try:
                responses = calls.stream(request)
            except InfermuxError as exc:
                return ResponseIterator(failure(exc), True, None)
            return ResponseIterator.read(responses)
        try:
            return response_of(calls.infer(request))
        except InfermuxError as exc:
            return _failed(exc)

    @overload
    async def async_exec(self, decoupled: Literal[False] = False) -> InferenceResponse: ...
    @overload
    async def async_exec(self, decoupled: Literal[True]) -> ResponseIterator: ...
    @overload
    async def async_exec(self, decoupled: bool) -> InferenceResponse | ResponseIterator: ...

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """``exec`` for an ``async def execute``: awaitable, so several calls can overlap."""
        calls, request = self._call()
        if decoupled:
            try:
                responses = calls.stream(request)
            except InfermuxError as exc:
                return ResponseIterator(failure(exc), True, None)
            return await ResponseIterator.aread(responses)
        try:
            return response_of(await calls.infer_async(request))
        except InfermuxError as exc:
            return _failed(exc)

    def _call(self) -> tuple[server_calls.ServerCalls, InferRequest]:
        if not self._model_name:
            raise TritonModelException("InferenceRequest.exec() needs model_name")
        calls = server_calls.current()
        if calls is None:
            raise TritonModelException(
                "this model cannot call other models here: BLS runs in the server's process "
                "(not isolation: process)"
            )
        version = "" if self._model_version < 0 else str(self._model_version)
        inputs = []
        for tensor in self._inputs:
            array = tensor.as_numpy()
            inputs.append(
                WireTensor(tensor.name(), datatype_of(array.dtype), tuple(array.shape), array)
            )
        request = InferRequest(
            model_name=str(self._model_name),
            model_version=version,
            inputs=inputs,
            outputs=[RequestedOutput(name) for name in self._outputs],
            id=self._id,
            parameters=self._call_parameters(),
        )
        return calls, request

    def _call_parameters(self) -> dict[str, Parameter]:
        """The request's parameters, with what Triton sets on a BLS request beside them, as a
        client's request carries it: the timeout (microseconds; 0: none) and the sequence."""
        parameters: dict[str, Parameter] = json.loads(self._parameters)
        if self._timeout:
            parameters["timeout"] = int(self._timeout)
        if self._correlation_id:
            parameters["sequence_id"] = self._correlation_id
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            parameters["sequence_start"] = True
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            parameters["sequence_end"] = True
        return parameters


def _failed(exc: InfermuxError) -> InferenceResponse:
    if isinstance(exc, DecoupledModelError):
        # The data plane's wording is for a client; a model streams with exec(decoupled=True).
        message = (
            f"model '{exc.model}' is decoupled (model_transaction_policy.decoupled): a BLS call "
            "reads its responses with exec(decoupled=True) or async_exec(decoupled=True)"
        )
        return InferenceResponse([], TritonError(message, TritonError.UNSUPPORTED))
    return failure(exc)
