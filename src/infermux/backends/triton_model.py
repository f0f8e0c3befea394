"""A Triton Python-backend model served unchanged: ``class TritonPythonModel`` in ``model.py``.

The model runs in the server process like an infermux ``Model`` (on its instance's thread, its
tensors passed without a copy), through the ``triton_python_backend_utils`` API
(:mod:`infermux.backends.pb_utils`): ``initialize(args)`` gets Triton's ``args`` dict,
``execute`` one ``InferenceRequest`` per client request and returns one ``InferenceResponse``
per request, ``finalize()`` runs when the instance closes. An ``async def execute`` runs on an
event loop of the instance's own, so that it can await BLS calls (``async_exec``) which the
server's loop serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any, TypeVar

from infermux.backends import pb_utils, server_calls
from infermux.backends.base import ExecuteResult, ModelContext, ModelRequest
from infermux.backends.pb_utils.custom_metrics import CUSTOM_METRICS
from infermux.errors import InternalError, ModelLoadError

TRITON_CLASS = "TritonPythonModel"

T = TypeVar("T")
_owners = itertools.count()


def initialize_args(context: ModelContext) -> dict[str, str]:
    """Triton's ``initialize(args)``: every value a string, the config as Triton's JSON."""
    on_gpu = context.device.startswith("cuda")
    return {
        "model_config": json.dumps(context.config.to_json_dict()),
        "model_instance_kind": "GPU" if on_gpu else "CPU",
        "model_instance_name": context.instance_name,
        "model_instance_device_id": context.device.partition(":")[2] if on_gpu else "0",
        "model_repository": str(context.model_path),
        "model_version": str(context.version),
        "model_name": context.config.name,
    }


def load(module: ModuleType, context: ModelContext, source: str) -> TritonInstance:
    """Build and initialise the module's ``TritonPythonModel``; raises ModelLoadError."""
    cls = getattr(module, TRITON_CLASS)
    if not callable(getattr(cls, "execute", None)):
        raise ModelLoadError(f"{source}: class '{TRITON_CLASS}' has no execute(requests) method")
    instance = TritonInstance(cls(), context, source)
    initialize = getattr(instance.model, "initialize", None)
    if initialize is not None:
        try:
            instance.call(initialize, initialize_args(context))
        except Exception as exc:
            instance.close(finalize=False)
            raise ModelLoadError(
                f"{source}: {TRITON_CLASS}.initialize failed: {type(exc).__name__}: {exc}"
            ) from exc
    return instance


class TritonInstance:
    """One instance of a ``TritonPythonModel``."""

    def __init__(self, model: Any, context: ModelContext, source: str) -> None:
        self.model = model
        self._context = context
        self._source = source
        self._owner = f"{context.config.name}/{context.version}/{context.instance_name}"
        self._owner += f"#{next(_owners)}"  # a replacement instance is another owner
        self._loop: asyncio.AbstractEventLoop | None = None  # for an async execute

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        given = [self._request(r) for r in requests]
        responses = self.call(self.model.execute, given)
        if self._context.config.decoupled:
            # The answers go through each request's sender, now or later (Triton's semantics).
            if responses is None:
                return [{} for _ in requests]
            return [
                InternalError(
                    f"{self._source}: execute() of a decoupled model returns None and sends "
                    "its responses through request.get_response_sender()"
                )
                for _ in requests
            ]
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            got = len(responses) if isinstance(responses, (list, tuple)) else type(responses)
            raise InternalError(
                f"{self._source}: execute() must return one InferenceResponse per request "
                f"({len(requests)} requests, got {getattr(got, '__name__', got)})"
            )
        return [self._result(response, i) for i, response in enumerate(responses)]

    def close(self, *, finalize: bool = True) -> None:
        try:
            method = getattr(self.model, "finalize", None)
            if finalize and method is not None:
                self.call(method)
        finally:
            CUSTOM_METRICS.release(self._owner)
            if self._loop is not None:
                self._loop.close()
                self._loop = None

    def call(self, method: Callable[..., Any], *args: Any) -> Any:
        """Call one of the model's methods as Triton would: with this instance's server for BLS
        and its metrics owner set, a coroutine run to its end on the instance's own loop."""
        with self._scope():
            result = method(*args)
            if inspect.isawaitable(result):
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                result = self._loop.run_until_complete(_awaited(result))
            return result

    @contextlib.contextmanager
    def _scope(self) -> Iterator[None]:
        calls = server_calls.set_current(self._context.server)
        owner = CUSTOM_METRICS.set_owner(self._owner)
        try:
            yield
        finally:
            CUSTOM_METRICS.set_owner(owner)
            server_calls.set_current(calls)

    def _request(self, request: ModelRequest) -> pb_utils.InferenceRequest:
        correlation = request.parameters.get("sequence_id", 0)
        given = pb_utils.InferenceRequest(
            request_id=request.id,
            correlation_id=correlation if isinstance(correlation, (int, str)) else 0,
            inputs=[pb_utils.Tensor(name, array) for name, array in request.inputs.items()],
            requested_output_names=list(request.requested_outputs),
            model_name=self._context.config.name,
            model_version=self._context.version,
            parameters=dict(request.parameters),
        )
        stream = request.responses
        # request.is_cancelled(): the server sets request.cancelled when the client gives up
        # (or, decoupled, closes the stream); read on the model's threads, a plain bool.
        given._cancelled = lambda: request.cancelled
        if stream is not None:

            def send(response: pb_utils.InferenceResponse | None, final: bool) -> None:
                stream.send(None if response is None else self._result(response, 0), final=final)

            def cancelled() -> bool:
                return stream.cancelled or request.cancelled

            given._sender = pb_utils.InferenceResponseSender(send, cancelled)
            given._cancelled = cancelled
        return given

    def _result(self, response: object, index: int) -> ExecuteResult:
        if not isinstance(response, pb_utils.InferenceResponse):
            return InternalError(
                f"{self._source}: execute() returned {type(response).__name__} for request "
                f"{index}, not an InferenceResponse"
            )
        error = response.error()
        if error is not None:
            return error.as_exception()
        outputs: dict[str, Any] = {}
        tensors: list[object] = list(response.output_tensors())  # whatever the model put there
        for tensor in tensors:
            if not isinstance(tensor, pb_utils.Tensor):
                return InternalError(
                    f"{self._source}: response {index} holds a {type(tensor).__name__}, not a "
                    "pb_utils.Tensor"
                )
            outputs[tensor.name()] = tensor.as_numpy()
        return outputs


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
