"""Which data-plane operations a front end may ask of the executor by name (a ``Call`` frame).

Derived from the one :class:`~infermux.dataplane.operations.Operations` definition, so that a new
operation cannot be forgotten here (before, a hand-kept list in the wire module; a missing entry
failed only at run time, with several front-end processes): every coroutine of ``Operations``
except ``infer``, which travels as its own ``Infer`` frame. ``live`` and ``server_metadata`` are
answered by the front end itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import msgspec
from tritonclient.grpc import model_config_pb2 as config_pb

from infermux.dataplane.operations import Operations
from infermux.ipc import Block
from infermux.model_config import ModelConfig
from infermux.routing.router import TrafficReport
from infermux.types import (
    CudaSharedMemoryRegion,
    ModelMetadata,
    ModelStats,
    RepositoryIndexEntry,
    SharedMemoryRegion,
)

from .link import Link

CALLS = frozenset(
    name
    for name, member in vars(Operations).items()
    if inspect.iscoroutinefunction(member) and name != "infer"
)
"""The data-plane methods a ``Call`` frame may name; anything else is refused."""

FILE_BLOCKS = "file_blocks"
"""The keyword of a ``load_model`` call that carries its ``files`` in the front end's arena:
path -> [offset, size]. The executor reads them into ``files`` before calling the plane."""


async def place_files(
    link: Link, files: Mapping[str, bytes]
) -> tuple[list[Block], dict[str, list[int]]]:
    """A load's ``files`` written into the front end's arena: the blocks (to release once the
    executor answered) and the :data:`FILE_BLOCKS` value naming them. A model's files may be far
    larger than a ring frame, so they cross in the arena as tensors do."""
    blocks: list[Block] = []
    placed: dict[str, list[int]] = {}
    try:
        for path, data in files.items():
            block = await link.allocate(len(data), f"load parameter 'file:{path}'")
            blocks.append(block)
            link.endpoint.arena.buffer(block.offset, len(data))[:] = data
            placed[path] = [block.offset, len(data)]
    except BaseException:
        for block in blocks:
            link.release(block)
        raise
    return blocks, placed


def _as(kind: Any) -> Callable[[Any], Any]:
    return lambda value: msgspec.convert(value, type=kind)


def _config(value: Any) -> ModelConfig:
    return ModelConfig.from_proto(config_pb.ModelConfig.FromString(value))


# How each call's result is rebuilt from msgpack builtins (the executor encodes the dataclasses
# as maps and a model config as its protobuf bytes).
RESULT: dict[str, Callable[[Any], Any]] = {
    "traffic": _as(TrafficReport),
    "ready": bool,
    "model_ready": bool,
    "model_metadata": _as(ModelMetadata),
    "model_config": _config,
    "model_statistics": _as(list[ModelStats]),
    "repository_index": _as(list[RepositoryIndexEntry]),
    "shm_status": _as(list[SharedMemoryRegion]),
    "cuda_shm_status": _as(list[CudaSharedMemoryRegion]),
    "log_settings": dict,
    "trace_settings": dict,
}


class Caller(Protocol):
    """What asks the executor for an operation by name (a ``RemoteExecutor``)."""

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` in the executor (a ``Call`` frame); its rebuilt result."""
        ...


P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=Caller)


def forwarded(
    operation: Callable[Concatenate[Any, P], Awaitable[R]],
) -> Callable[Concatenate[C, P], Coroutine[Any, Any, R]]:
    """A method that asks the executor for ``operation`` by name (a ``Call`` frame) and
    returns its rebuilt result, with the operation's own signature."""
    name = operation.__name__

    async def forward(self: C, /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = await self.call(name, *args, **kwargs)
        return result

    functools.update_wrapper(forward, operation)  # name, doc and signature: the operation's
    forward.__qualname__ = f"RemoteExecutor.{name}"
    return forward
