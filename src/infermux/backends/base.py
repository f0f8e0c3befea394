"""The seam between infermux and a backend (Python, PyTorch, ONNX Runtime, TensorRT, ...).

A :class:`Backend` is registered under a name (``infermux.backends`` entry points) and loads one
:class:`BackendInstance` per configured model instance. Instances receive *batches*: a list of
:class:`ModelRequest`, and return one result per request, so one bad request fails alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from infermux.backends.paths import model_path_of
from infermux.backends.server_calls import ServerCalls
from infermux.errors import ModelLoadError
from infermux.model_config import ModelConfig
from infermux.types import DeviceArray, Parameters

if TYPE_CHECKING:
    from infermux.backends.responses import ResponseStream

ExecuteResult = Mapping[str, npt.ArrayLike] | Exception
"""Per request: output name -> array, or an exception that fails only that request."""


@dataclass(frozen=True, slots=True)
class ModelContext:
    """What a model instance is told when it is created.

    ``version_path`` is the version directory (``<repo>/<model>/<version>``); ``device`` is
    ``"cpu"`` or ``"cuda:N"`` from the instance group; ``instance_name`` is unique per instance.
    ``server`` lets the model send requests to the server it runs in (None: it cannot, e.g. in a
    worker process of its own).
    """

    config: ModelConfig
    version: int
    model_path: Path
    version_path: Path
    instance_name: str
    device: str = "cpu"
    server: ServerCalls | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class DeviceParts:
    """One input of a micro-batch (several requests sent as one) left in GPU memory: each
    request's rows where its client placed them, in request order. A batch gathers them into
    its input one part after the other, device to device, as it gathers requests' inputs."""

    parts: tuple[DeviceArray, ...]
    shape: tuple[int, ...] = field(init=False, repr=False, compare=False)
    """The parts' rows together, then what each row holds. Summed once: the batcher, the
    statistics and the launch read it several times per request (5% of the executor's loop on
    the CUDA-shm path when it was a property)."""

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("DeviceParts needs at least one part")
        rows = sum(p.shape[0] for p in self.parts)
        object.__setattr__(self, "shape", (rows, *self.parts[0].shape[1:]))

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.parts[0].dtype

    def reshape(self, shape: tuple[int, ...]) -> DeviceParts:
        """Each part's rows seen with ``shape`` past the first dimension."""
        return DeviceParts(tuple(p.reshape((p.shape[0], *shape[1:])) for p in self.parts))


DeviceInput = DeviceArray | DeviceParts
"""An input in GPU memory: one request's, or a micro-batch's requests' (:class:`DeviceParts`)."""


def parts_of(value: DeviceInput) -> tuple[DeviceArray, ...]:
    """The arrays a device input is gathered from, in order."""
    return value.parts if isinstance(value, DeviceParts) else (value,)


@dataclass(slots=True)
class ModelRequest:
    """One request as a model sees it: validated numpy inputs and the outputs wanted.

    ``inputs`` holds every input the client sent, with its full shape (batch dim included when
    the model batches) and the config's dtype; BYTES inputs are object arrays of ``bytes``.
    ``requested_outputs`` names the outputs to return; computing others is allowed but wasted.
    """

    inputs: dict[str, npt.NDArray[np.generic]]
    requested_outputs: tuple[str, ...]
    parameters: Parameters = field(default_factory=dict)
    id: str = ""
    device_inputs: dict[str, DeviceInput] = field(default_factory=dict)
    """Inputs left in a client's GPU memory (CUDA shared memory), given only to backends that
    set ``accepts_device_inputs``; for the others they arrive in ``inputs``, copied to host.
    :func:`~infermux.backends.stacking.device_parts` lists a batch's parts of each."""
    device_outputs: dict[str, DeviceParts] = field(default_factory=dict, compare=False)
    """Outputs the data plane asks to have written straight into GPU memory (clients' CUDA
    shared memory), one part per request of a micro-batch, in order. A backend that can (the
    PyTorch GPU path, for a batch a CUDA graph runs) copies the rows there device to device
    before the batch completes and adds the name to ``outputs_on_device``; it still returns
    every output as usual, which is what is checked against the config."""
    outputs_on_device: set[str] = field(default_factory=set, compare=False)
    """Names of ``device_outputs`` written on the device (set by the backend)."""
    responses: ResponseStream | None = field(default=None, compare=False)
    """Set for a request to a decoupled model: where its responses go, then its final flag
    (``backends/responses.py``); its result from ``execute`` then only says whether it failed."""
    cancelled: bool = field(default=False, compare=False)
    """Set (from the event loop's thread) once nobody waits for this request's answer any more:
    the client went away or cancelled it while it ran, or, for a decoupled model, the server
    ended it (its execution timeout). A model may check it to stop early; what it still returns
    or sends for the request is dropped."""

    @property
    def batch_size(self) -> int:
        """Rows in the batch dimension (1 for non-batching models)."""
        # The first input's (host inputs first): read on every request's way through the
        # batcher and statistics, so without building lists.
        for array in self.inputs.values():
            return int(array.shape[0]) if array.shape else 1
        for parts in self.device_inputs.values():
            return int(parts.shape[0]) if parts.shape else 1
        return 1


class Model(Protocol):
    """What a ``model.py`` of the Python backend defines as ``class Model`` (the infermux
    contract; Triton's ``TritonPythonModel`` is served too, docs/python-models.md).

    ``execute`` receives a batch, every request waiting when the instance became free, and
    returns one result per request, in order: a mapping of output name to array, or an
    exception that fails that request alone. Two optional methods complete it (not declared
    here, so that a class without them still conforms): ``initialize(context: ModelContext)``,
    called once before the first batch, and ``finalize()``, once after the last.
    """

    def execute(self, requests: list[ModelRequest]) -> Sequence[ExecuteResult]: ...


class BackendInstance(Protocol):
    """One loaded instance of a model version. Called from one thread at a time."""

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        """Run a batch; return exactly one result per request, in order."""
        ...

    def close(self) -> None:
        """Release everything the instance holds; called once, after its last ``execute``."""
        ...


Collect = Callable[[], Sequence[ExecuteResult]]
"""Gives a launched batch's results, once its ``done`` was called."""


class LaunchesOnLoop(Protocol):
    """An instance that can start a batch without blocking (a GPU instance whose batch is a few
    non-blocking calls on its stream: a CUDA graph replay and its copies).

    The scheduler calls :meth:`launch` on its event loop instead of running ``execute`` on the
    instance's thread. It enqueues the batch and returns at once; ``done()`` is called, from any
    thread, when the batch has finished; then the returned function gives the results, one per
    request (called on the loop, before the instance's next batch). ``launch`` returns None for a
    batch it cannot start so (the scheduler then runs ``execute`` on the instance's thread), and
    raises, having waited for anything it enqueued, when the batch fails to start.
    """

    def launch(
        self, requests: Sequence[ModelRequest], done: Callable[[], None]
    ) -> Collect | None: ...


class Backend(Protocol):
    """Makes instances of one kind of model (chosen by config ``backend`` or ``platform``)."""

    name: str
    stacks_inputs: bool
    """True when instances run one kernel over the stacked batch, so the scheduler must only
    batch requests whose shapes match past the batch dimension (False: a list of requests)."""
    # Optional: ``accepts_device_inputs = True`` when instances read
    # :attr:`ModelRequest.device_inputs` in place on the GPU (absent means False);
    # ``decoupled = True`` when instances answer a decoupled model's requests through
    # :attr:`ModelRequest.responses` (absent: such a model is refused at load).

    def load(self, context: ModelContext) -> BackendInstance:
        """Create one instance; raise :class:`~infermux.errors.ModelLoadError` saying why not."""
        ...


def model_file(context: ModelContext, default: str) -> str:
    """The model file of this version (``default_model_filename`` overrides ``default``).

    Raises :class:`~infermux.errors.ModelLoadError` naming the path when it is missing, the same
    message for every backend, or naming the field when it resolves outside the model directory.
    """
    name = context.config.default_model_filename
    field = "default_model_filename" if name else "model file"
    path = model_path_of(
        context.model_path,
        context.version_path,
        name or default,
        field,
        where=f"model '{context.config.name}' version {context.version}",
    )
    if not path.is_file():
        raise ModelLoadError(
            f"model '{context.config.name}' version {context.version}: {path} not found"
        )
    return str(path)
