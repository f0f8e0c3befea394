"""The Python backend: ``backend: "python"`` with a ``<version>/model.py`` written by the user.

The author contract (documented in ``docs/python-models.md``)::

    class Model:
        def initialize(self, context: infermux.ModelContext) -> None: ...      # optional
        def execute(self, requests: list[infermux.ModelRequest]) -> list[dict | Exception]: ...
        def finalize(self) -> None: ...                                         # optional

A Triton Python-backend ``model.py`` (``class TritonPythonModel``) is served too, unchanged
(``backends/triton_model.py``, with ``triton_python_backend_utils`` from ``backends/pb_utils``).

Unlike Triton's Python backend, the model runs in the server process on its instance's thread:
tensors reach it without an IPC copy. A model that may crash the process can opt into a worker
process of its own (``isolation: process``, ``backends/python_process.py``). The loading itself
is ``backends/python_model.py``, which the worker imports without this module.
"""

from __future__ import annotations

from pathlib import Path

from infermux.backends import pb_utils
from infermux.backends.base import BackendInstance, ModelContext, model_file

# Imported with this module (when the registry first resolves the backend, on the event loop's
# thread), not lazily in load(): instances load on worker threads, next to threads executing
# user model files, and CI saw that lazy first import fail twice with python_worker missing from
# sys.modules halfway through its own import (Python 3.11; not reproduced on demand).
from infermux.backends.python_model import DEFAULT_FILENAME, import_model_file, load_in_process
from infermux.backends.python_process import ProcessInstance
from infermux.backends.triton_model import TRITON_CLASS
from infermux.errors import ModelLoadError
from infermux.model_config import pb

ISOLATION_PARAMETER = "isolation"
ISOLATION_MODES = ("thread", "process")  # thread: in the server process (the default)


class PythonBackend:
    """Loads ``model.py`` and wraps its ``Model`` class."""

    name = "python"
    stacks_inputs = False  # execute() receives the list of requests; the model may stack them
    decoupled = True  # in this process; a worker process refuses it (isolation: process)

    def load(self, context: ModelContext) -> BackendInstance:
        isolation = context.config.parameters.get(ISOLATION_PARAMETER) or "thread"
        if isolation not in ISOLATION_MODES:
            raise ModelLoadError(
                f"model '{context.config.name}': parameters.{ISOLATION_PARAMETER} must be one of "
                f"{', '.join(ISOLATION_MODES)}, got {isolation!r}"
            )
        if isolation == "process":
            if context.config.decoupled:
                raise ModelLoadError(
                    f"model '{context.config.name}': model_transaction_policy.decoupled needs "
                    f"parameters.{ISOLATION_PARAMETER} 'thread' (a worker process answers "
                    "once per request)"
                )
            model_file(context, DEFAULT_FILENAME)  # a missing file is said here, not by a worker
            return ProcessInstance(context)
        return self.load_here(context)

    def load_here(self, context: ModelContext) -> BackendInstance:
        """Load the model into this process."""
        return load_in_process(context)

    def complete_config(self, message: pb.ModelConfig, model_dir: Path) -> None:
        """Triton's auto-complete: a ``TritonPythonModel`` with a static
        ``auto_complete_config(config)`` fills in the config (inputs, outputs, batching) before
        it is validated. Its highest version's ``model.py`` is imported for it, as Triton does
        in a process of its own; nothing else of that import is kept."""
        versions = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
        if not versions:
            return  # the load says there is no version
        version_dir = max(versions, key=lambda p: int(p.name))
        path = version_dir / (message.default_model_filename or DEFAULT_FILENAME)
        if not path.is_file() or path.resolve().parent != version_dir.resolve():
            return  # the load says what is wrong with the file
        try:
            if "auto_complete_config" not in path.read_text(encoding="utf-8", errors="replace"):
                return  # most models: not imported twice
            module = import_model_file(path, message.name, int(version_dir.name))
        except (OSError, ModelLoadError):
            return  # the load of each version says why it cannot be imported
        cls = getattr(module, TRITON_CLASS, None)
        complete = getattr(cls, "auto_complete_config", None)
        if complete is None:
            return
        config = pb_utils.ModelConfig(message)
        try:
            result = complete(config)
            completed = (result if result is not None else config).to_message()
        except Exception as exc:
            raise ModelLoadError(
                f"{path}: {TRITON_CLASS}.auto_complete_config failed: {type(exc).__name__}: {exc}"
            ) from exc
        message.CopyFrom(completed)
