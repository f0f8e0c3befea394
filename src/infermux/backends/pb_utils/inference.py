"""``pb_utils.InferenceRequest`` and ``pb_utils.InferenceResponse``.

A request is what ``execute`` receives (one per client request, its inputs the request's own
arrays), and also what a model builds to call another model (BLS): ``exec()`` from ``execute``,
``await async_exec()`` from an ``async def execute``. Such a call goes through the server's data
plane like a client's request (:mod:`infermux.backends.server_calls`); its failure comes back as
a response whose ``has_error()`` is true, not as an exception.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from infermux.backends import server_calls
from infermux.backends.pb_utils.errors import TritonError, TritonModelException
from infermux.backends.pb_utils.tensor import Tensor
from infermux.errors import InfermuxError
from infermux.types import (
    InferRequest,
    InferResponse,
    Parameter,
    RequestedOutput,
    datatype_of,
)
from infermux.types import Tensor as WireTensor

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2


class InferenceResponse:
    """``InferenceResponse(output_tensors=[...], error=None)``: one request's answer."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Parameter] | str | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, (list, tuple)):
            raise TritonModelException('"output_tensors" must be a list.')
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException('"error" must be a TritonError.')
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


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
        self._parameters = _parameters_json(parameters)

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

    def exec(self, decoupled: bool = False) -> InferenceResponse:
        """Run this request on model ``model_name`` and wait for its answer (BLS)."""
        calls, request = self._call(decoupled)
        try:
            return _response(calls.infer(request))
        except InfermuxError as exc:
            return InferenceResponse([], TritonError.of(exc))

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse:
        """``exec`` for an ``async def execute``: awaitable, so several calls can overlap."""
        calls, request = self._call(decoupled)
        try:
            return _response(await calls.infer_async(request))
        except InfermuxError as exc:
            return InferenceResponse([], TritonError.of(exc))

    def _call(self, decoupled: bool) -> tuple[server_calls.ServerCalls, InferRequest]:
        if decoupled:
            raise TritonModelException("decoupled BLS calls are not supported yet")
        if not self._model_name:
            raise TritonModelException("InferenceRequest.exec() needs model_name")
        calls = server_calls.current()
        if calls is None:
            raise TritonModelException(
                "this model cannot call other models here: BLS runs from initialize() or "
                "execute() of a model loaded in the server process (not isolation: process)"
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
            parameters=json.loads(self._parameters),
        )
        return calls, request


def _response(answer: InferResponse) -> InferenceResponse:
    return InferenceResponse([Tensor(t.name, t.data) for t in answer.outputs])


def _parameters_json(parameters: dict[str, Parameter] | str | None) -> str:
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        if not isinstance(json.loads(parameters), dict):
            raise TritonModelException("parameters must be a JSON object")
        return parameters
    return json.dumps(parameters)
