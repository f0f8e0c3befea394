"""infermux: a Python-first inference server speaking the KServe V2 / Triton protocol.

The names exported here are the public contract for model authors (see ``docs/python-models.md``).
"""

from infermux.backends.base import ExecuteResult, Model, ModelContext, ModelRequest
from infermux.backends.stacking import split, stack
from infermux.errors import (
    ErrorCode,
    InfermuxError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
)
from infermux.model_config import ModelConfig, TensorConfig

__version__ = "0.1.0"

__all__ = [
    "ErrorCode",
    "ExecuteResult",
    "InfermuxError",
    "InternalError",
    "InvalidArgumentError",
    "Model",
    "ModelConfig",
    "ModelContext",
    "ModelRequest",
    "NotFoundError",
    "TensorConfig",
    "UnavailableError",
    "UnsupportedError",
    "__version__",
    "split",
    "stack",
]
