"""The transport-free data plane: every V2 operation, shared by all front ends."""

from infermux.dataplane.operations import Operations
from infermux.dataplane.plane import DataPlane

__all__ = ["DataPlane", "Operations"]
