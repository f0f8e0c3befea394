"""The Python backend: ``backend: "python"`` with a ``<version>/model.py`` written by the user.

The author contract (documented in ``docs/python-models.md``)::

    class Model:
        def initialize(self, context: infermux.ModelContext) -> None: ...      # optional
        def execute(self, requests: list[infermux.ModelRequest]) -> list[dict | Exception]: ...
        def finalize(self) -> None: ...                                         # optional

Unlike Triton's Python backend, the model runs in the server process on its instance's thread:
tensors reach it without an IPC copy. A model that may crash the process can opt into a worker
process of its own (``isolation: process``, ``backends/python_process.py``). The loading itself
is ``backends/python_model.py``, which the worker imports without this module.
"""

from __future__ import annotations

from infermux.backends.base import BackendInstance, ModelContext, model_file

# Imported with this module (when the registry first resolves the backend, on the event loop's
# thread), not lazily in load(): instances load on worker threads, next to threads executing
# user model files, and CI saw that lazy first import fail twice with python_worker missing from
# sys.modules halfway through its own import (Python 3.11; not reproduced on demand).
from infermux.backends.python_model import DEFAULT_FILENAME, load_in_process
from infermux.backends.python_process import ProcessInstance
from infermux.errors import ModelLoadError

ISOLATION_PARAMETER = "isolation"
ISOLATION_MODES = ("thread", "process")  # thread: in the server process (the default)


class PythonBackend:
    """Loads ``model.py`` and wraps its ``Model`` class."""

    name = "python"
    stacks_inputs = False  # execute() receives the list of requests; the model may stack them

    def load(self, context: ModelContext) -> BackendInstance:
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

    def load_here(self, context: ModelContext) -> BackendInstance:
        """Load the model into this process."""
        return load_in_process(context)
