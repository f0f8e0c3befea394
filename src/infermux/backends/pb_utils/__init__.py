"""Triton's ``triton_python_backend_utils``, for Triton Python-backend models served unchanged.

A ``model.py`` defining ``class TritonPythonModel`` does ``import triton_python_backend_utils as
pb_utils``; infermux registers this package under that name when it loads a Python model
(``backends/python_model.py``), nothing is installed on the path. See docs/python-models.md for
what is supported; the adapter that drives such a model is ``backends/triton_model.py``.
"""

from infermux.backends.pb_utils.custom_metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    Metric,
    MetricFamily,
)
from infermux.backends.pb_utils.errors import TritonError, TritonModelException
from infermux.backends.pb_utils.inference import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponseSender,
)
from infermux.backends.pb_utils.logger import Logger, LogLevel
from infermux.backends.pb_utils.model_config import (
    TRITON_STRING_TO_NUMPY,
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    triton_string_to_numpy,
    using_decoupled_model_transaction_policy,
)
from infermux.backends.pb_utils.response import InferenceResponse
from infermux.backends.pb_utils.response_iterator import ResponseIterator
from infermux.backends.pb_utils.tensor import Tensor

MODULE_NAME = "triton_python_backend_utils"


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The input named ``name`` of a request, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The output named ``name`` of a response, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


__all__ = [
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "MODULE_NAME",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "LogLevel",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "triton_string_to_numpy",
    "using_decoupled_model_transaction_policy",
]
