"""Triton's generate extension: its flat JSON documents <-> :mod:`infermux.types`.

A request is one JSON object: each key naming a model input carries that input's value (a
scalar or a list; the datatype and shape come from the model's config, a batch of one for a
batching model), ``parameters`` is an optional object of request parameters, and, as in
Triton, any other key with a scalar value is one more request parameter. A response is the
outputs by name (a scalar when the output has one element, else a flat list) beside
``model_name`` and ``model_version``.
"""

from __future__ import annotations

from typing import Any

from infermux.errors import InvalidArgumentError
from infermux.frontends.http.codec import array_to_json, dumps, error_body, json_to_array
from infermux.model_config import ModelConfig, TensorConfig
from infermux.types import InferRequest, InferResponse, Parameters, Tensor

MULTIPLE_RESPONSES = (
    "generate expects model to produce exactly 1 response, use generate stream for model "
    "that generates various number of responses"
)
"""Triton's refusal when ``/generate`` meets a model that answered more or fewer than once."""

_SCALARS = (bool, int, float, str)


def decode_request(doc: Any, config: ModelConfig, model_version: str) -> InferRequest:
    """The inference request a generate body asks ``config``'s model for."""
    if not isinstance(doc, dict):
        raise InvalidArgumentError("the generate request must be a JSON object")
    specs = {spec.name: spec for spec in config.inputs}
    parameters = _parameters(doc.get("parameters"))
    inputs: list[Tensor] = []
    for key, value in doc.items():
        if key == "parameters":
            continue
        spec = specs.get(key)
        if spec is not None:
            inputs.append(_input(spec, value, config.batching))
        elif isinstance(value, _SCALARS):
            parameters[key] = value  # Triton passes a key naming no input on as a parameter
        else:
            raise InvalidArgumentError(
                f"field '{key}' is not an input of model '{config.name}' (its inputs: "
                f"{', '.join(sorted(specs))}); any other field is a request parameter and must "
                "be a string, number or boolean"
            )
    given = {tensor.name for tensor in inputs}
    missing = [s.name for s in config.inputs if not s.optional and s.name not in given]
    if missing:
        raise InvalidArgumentError(
            f"model '{config.name}' expects input '{missing[0]}', missing from the request "
            f"(expected {len(config.inputs)} inputs but got {len(given)})"
        )
    return InferRequest(
        model_name=config.name,
        model_version=model_version,
        inputs=inputs,
        parameters=parameters,
    )


def _parameters(value: Any) -> Parameters:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgumentError("field 'parameters' must be an object")
    for key, item in value.items():
        if not isinstance(item, _SCALARS):
            raise InvalidArgumentError(
                f"field 'parameters.{key}' must be a boolean, number or string"
            )
    return dict(value)


def _input(spec: TensorConfig, value: Any, batching: bool) -> Tensor:
    if isinstance(value, dict):
        raise InvalidArgumentError(
            f"input '{spec.name}' must be a scalar or a list of {spec.datatype} values, "
            "got an object"
        )
    shape = ((1,) if batching else ()) + _dims(spec.dims, _count(value))
    array = json_to_array(spec.name, spec.datatype, shape, value)
    return Tensor(spec.name, spec.datatype, shape, array)


def _count(value: Any) -> int:
    if not isinstance(value, list):
        return 1
    return sum(_count(item) for item in value)


def _dims(dims: tuple[int, ...], count: int) -> tuple[int, ...]:
    """``dims`` with its variable (-1) dimensions sized to hold ``count`` elements: the last
    one takes what the fixed ones leave, the others are 1."""
    if -1 not in dims:
        return dims  # json_to_array names the input when the count does not fit
    fixed = 1
    for d in dims:
        fixed *= d if d != -1 else 1
    last = len(dims) - 1 - dims[::-1].index(-1)
    rest = count // fixed if fixed and count % fixed == 0 else count
    return tuple((rest if i == last else 1) if d == -1 else d for i, d in enumerate(dims))


def encode_response(response: InferResponse) -> bytes:
    """A response's outputs as a generate document (JSON)."""
    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    for tensor in response.outputs:
        data = array_to_json(tensor.name, tensor.datatype, tensor.data)
        doc[tensor.name] = data[0] if tensor.data.size == 1 else data
    return dumps(doc)


def event(response: InferResponse) -> bytes:
    """One server-sent event: the response's document, or ``{"error": ...}`` for a failed one."""
    if response.error is not None:
        return error_event(response.error.message)
    return b"data: " + encode_response(response) + b"\n\n"


def error_event(message: str) -> bytes:
    """The event of a failure after the stream began (Triton's error object as the data)."""
    return b"data: " + error_body(message) + b"\n\n"
