"""A user's ``model.py`` loaded into this process: the module imported fresh, its ``Model``
class built and initialised, and the instance the scheduler drives (in the server process, or in
a worker process of its own with ``isolation: process``, ``backends/python_worker.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from infermux.backends import decoupled, pb_utils, triton_model
from infermux.backends.base import (
    BackendInstance,
    ExecuteResult,
    ModelContext,
    ModelRequest,
    model_file,
)
from infermux.errors import InternalError, ModelLoadError

MODEL_CLASS = "Model"
DEFAULT_FILENAME = "model.py"

_module_ids = itertools.count()


def load_in_process(context: ModelContext) -> BackendInstance:
    """Load the model into this process (the server's, or a worker's): an infermux ``Model``,
    or a Triton ``TritonPythonModel`` (``backends/triton_model.py``)."""
    path = Path(model_file(context, DEFAULT_FILENAME))
    module = import_model_file(path, context.config.name, context.version)
    cls = getattr(module, MODEL_CLASS, None)
    if cls is None and inspect.isclass(getattr(module, triton_model.TRITON_CLASS, None)):
        return triton_model.load(module, context, str(path))
    if not inspect.isclass(cls):
        raise ModelLoadError(
            f"{path}: must define a class named '{MODEL_CLASS}' "
            f"(or Triton's '{triton_model.TRITON_CLASS}')"
        )
    if not callable(getattr(cls, "execute", None)):
        raise ModelLoadError(f"{path}: class '{MODEL_CLASS}' has no execute(requests) method")
    try:
        model = cls()
        initialize = getattr(model, "initialize", None)
        if initialize is not None:
            initialize(context)
    except Exception as exc:
        raise ModelLoadError(
            f"{path}: {MODEL_CLASS}.initialize failed: {type(exc).__name__}: {exc}"
        ) from exc
    return PythonInstance(model, str(path), decoupled=context.config.decoupled)


class PythonInstance:
    """One instance of a user's ``Model``; for a decoupled model, ``execute`` returns an
    iterator of results per request, which ``backends/decoupled.py`` sends."""

    def __init__(self, model: Any, source: str, *, decoupled: bool = False) -> None:
        self._model = model
        self._source = source
        self._decoupled = decoupled
        self._loop: asyncio.AbstractEventLoop | None = None  # for async iterators

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        results = self._model.execute(list(requests))
        if not isinstance(results, (list, tuple)) or len(results) != len(requests):
            got = len(results) if isinstance(results, (list, tuple)) else type(results).__name__
            raise InternalError(
                f"{self._source}: execute() must return one result per request "
                f"({len(requests)} requests, got {got})"
            )
        if not self._decoupled:
            return results
        if self._loop is None and any(hasattr(r, "__aiter__") for r in results):
            self._loop = asyncio.new_event_loop()
        return decoupled.drive(requests, results, self._source, self._loop)

    def close(self) -> None:
        try:
            finalize = getattr(self._model, "finalize", None)
            if finalize is not None:
                finalize()
        finally:
            if self._loop is not None:
                self._loop.close()
                self._loop = None


def import_model_file(path: Path, model: str, version: int) -> ModuleType:
    """Import ``path`` as a fresh module; raises ModelLoadError saying why it failed.

    A fresh module per instance: authors may keep state at module level, and versions of the
    same model must not share it. Triton's ``triton_python_backend_utils`` is importable from
    then on (registered under that name, unless the process already has one).
    """
    sys.modules.setdefault(pb_utils.MODULE_NAME, pb_utils)
    name = f"infermux_models.{model}.v{version}.m{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    # The version directory goes on sys.path while the module executes so that the model can import
    # helper modules shipped beside it.
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ModelLoadError(f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(path.parent))
    return module
