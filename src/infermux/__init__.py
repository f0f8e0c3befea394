"""infermux: a Python-first inference server speaking the KServe V2 / Triton protocol.

The names exported here are the public contract for model authors (see ``docs/python-models.md``).
"""

from infermux.backends.base import ModelContext, ModelRequest
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
    "InfermuxError",
    "InternalError",
    "InvalidArgumentError",
    "ModelConfig",
    "ModelContext",
    "ModelRequest",
    "NotFoundError",
    "TensorConfig",
    "UnavailableError",
    "UnsupportedError",
    "__version__",
]
