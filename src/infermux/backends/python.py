"""The Python backend: ``backend: "python"`` with a ``<version>/model.py`` written by the user.

The author contract (documented in ``docs/python-models.md``)::

    class Model:
        def initialize(self, context: infermux.ModelContext) -> None: ...      # optional
        def execute(self, requests: list[infermux.ModelRequest]) -> list[dict | Exception]: ...
        def finalize(self) -> None: ...                                         # optional

Unlike Triton's Python backend, the model runs in the server process on its instance's thread:
tensors reach it without an IPC copy. A model that may crash the process can opt into a worker
process of its own (``isolation: process``, ``backends/python_process.py``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from infermux.backends.base import ExecuteResult, ModelContext, ModelRequest, model_file

# Imported with this module (when the registry first resolves the backend, on the event loop's
# thread), not lazily in load(): instances load on worker threads, next to threads executing
# user model files, and CI saw that lazy first import fail twice with python_worker missing from
# sys.modules halfway through its own import (Python 3.11; not reproduced on demand).
from infermux.backends.python_process import ProcessInstance
from infermux.errors import InternalError, ModelLoadError

MODEL_CLASS = "Model"
DEFAULT_FILENAME = "model.py"
ISOLATION_PARAMETER = "isolation"
ISOLATION_MODES = ("thread", "process")  # thread: in the server process (the default)

_module_ids = itertools.count()


class PythonBackend:
    """Loads ``model.py`` and wraps its ``Model`` class."""

    name = "python"
    stacks_inputs = False  # execute() receives the list of requests; the model may stack them

    def load(self, context: ModelContext) -> PythonInstance | ProcessInstance:
        isolation = context.config.parameters.get(ISOLATION_PARAMETER) or "thread"
        if isolation not in ISOLATION_MODES:
            raise ModelLoadError(
                f"model '{context.config.name}': parameters.{ISOLATION_PARAMETER} must be one of "
                f"{', '.join(ISOLATION_MODES)}, got {isolation!r}"
            )
        if isolation == "process":
            model_file(context, DEFAULT_FILENAME)  # a missing file is said here, not by a worker
            return ProcessInstance(context)
        return self.load_here(context)

    def load_here(self, context: ModelContext) -> PythonInstance:
        """Load the model into this process (a worker process calls this too)."""
        path = Path(model_file(context, DEFAULT_FILENAME))
        module = _import_file(path, context)
        cls = getattr(module, MODEL_CLASS, None)
        if not inspect.isclass(cls):
            raise ModelLoadError(f"{path}: must define a class named '{MODEL_CLASS}'")
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
        return PythonInstance(model, str(path))


class PythonInstance:
    """One instance of a user's ``Model``."""

    def __init__(self, model: Any, source: str) -> None:
        self._model = model
        self._source = source

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        results = self._model.execute(list(requests))
        if not isinstance(results, (list, tuple)) or len(results) != len(requests):
            got = len(results) if isinstance(results, (list, tuple)) else type(results).__name__
            raise InternalError(
                f"{self._source}: execute() must return one result per request "
                f"({len(requests)} requests, got {got})"
            )
        return results

    def close(self) -> None:
        finalize = getattr(self._model, "finalize", None)
        if finalize is not None:
            finalize()


def _import_file(path: Path, context: ModelContext) -> ModuleType:
    # A fresh module per instance: authors may keep state at module level, and versions of the same
    # model must not share it.
    name = f"infermux_models.{context.config.name}.v{context.version}.m{next(_module_ids)}"
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
