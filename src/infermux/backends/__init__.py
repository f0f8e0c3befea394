"""Backends turn a model version on disk into instances that execute batches of requests."""

from infermux.backends.base import (
    Backend,
    BackendInstance,
    ExecuteResult,
    ModelContext,
    ModelRequest,
)
from infermux.backends.registry import BackendRegistry

__all__ = [
    "Backend",
    "BackendInstance",
    "BackendRegistry",
    "ExecuteResult",
    "ModelContext",
    "ModelRequest",
]
