"""``pb_utils.InferenceResponse``: one request's answer, as a model returns it from ``execute``
(or sends it through a response sender) and as a BLS call gives it back to the calling model."""

from __future__ import annotations

import json
from collections.abc import Sequence

from infermux.backends.pb_utils.errors import TritonError, TritonModelException
from infermux.backends.pb_utils.tensor import Tensor
from infermux.errors import InfermuxError
from infermux.types import InferResponse, Parameter


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
        self._parameters = parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


def response_of(answer: InferResponse) -> InferenceResponse:
    """The server's answer to a BLS call as the calling model reads it; a failed response
    (a decoupled model's error mid-stream) has no outputs and ``error()`` set."""
    if answer.error is not None:
        return failure(answer.error)
    tensors = [Tensor(t.name, t.data) for t in answer.outputs]
    return InferenceResponse(tensors, parameters=dict(answer.parameters))


def failure(error: InfermuxError) -> InferenceResponse:
    """A BLS call's failure as Triton gives it: a response whose ``has_error()`` is true."""
    return InferenceResponse([], TritonError.of(error))


def parameters_json(parameters: dict[str, Parameter] | str | None) -> str:
    """Parameters as Triton hands them around: a JSON object string."""
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        if not isinstance(json.loads(parameters), dict):
            raise TritonModelException("parameters must be a JSON object")
        return parameters
    return json.dumps(parameters)
