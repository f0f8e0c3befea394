"""Finds the backend for a model: built-ins plus the ``infermux.backends`` entry-point group.

Third-party backends are ordinary packages that declare
``[project.entry-points."infermux.backends"] name = "pkg.module:BackendClass"``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

from infermux.backends.base import Backend
from infermux.errors import ModelLoadError
from infermux.model_config import ModelConfig, pb

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "infermux.backends"

# Built-ins are listed here too so that infermux works from a source tree without installed
# metadata; an entry point with the same name (a third-party override) wins.
_BUILTINS: dict[str, str] = {
    "python": "infermux.backends.python:PythonBackend",
    "pytorch": "infermux.backends.pytorch:PyTorchBackend",
    "onnxruntime": "infermux.backends.onnxruntime:OnnxRuntimeBackend",
    "tensorrt": "infermux.backends.tensorrt:TensorRTBackend",
}

# Triton platform names -> the backend that serves them.
_PLATFORMS: dict[str, str] = {
    "pytorch_libtorch": "pytorch",
    "torch_export": "pytorch",
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
}


def backend_name(config: ModelConfig | pb.ModelConfig) -> str:
    """The backend a config asks for: ``backend`` if set, else the one mapped from ``platform``."""
    if config.backend:
        return config.backend
    if config.platform in _PLATFORMS:
        return _PLATFORMS[config.platform]
    return config.platform


def _field(config: ModelConfig) -> str:
    """The config field that chose the backend, as an error names it."""
    if config.backend:
        return f"backend '{config.backend}'"
    return f"platform '{config.platform}'"


class BackendRegistry:
    """Resolves backend names to :class:`Backend` objects, creating each backend once."""

    def __init__(self, extra: dict[str, Callable[[], Backend]] | None = None) -> None:
        self._factories: dict[str, Callable[[], Backend]] = {}
        for name, target in _BUILTINS.items():
            self._factories[name] = _lazy(target)
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            self._factories[ep.name] = _lazy(ep.value)
        self._factories.update(extra or {})
        self._backends: dict[str, Backend] = {}

    @property
    def names(self) -> list[str]:
        """Every backend name that can be resolved."""
        return sorted(self._factories)

    def complete_config(self, message: pb.ModelConfig, model_dir: Path) -> None:
        """Let the config's backend fill in what the config leaves out, before validation
        (a backend with a ``complete_config(message, model_dir)`` method; the others leave it
        as it is). An unknown backend is left for the load to report."""
        name = backend_name(message)
        if name not in self._factories:
            return
        try:
            backend = self._backend(name)
        except ModelLoadError:
            return  # not importable: the load says so, as for a model that does not complete
        complete = getattr(backend, "complete_config", None)
        if complete is not None:
            complete(message, model_dir)

    def get(self, config: ModelConfig) -> Backend:
        """The backend for ``config``; raises :class:`ModelLoadError` naming the field (``platform``
        or ``backend``) that asks for what is missing."""
        name = backend_name(config)
        if not name:
            raise ModelLoadError(
                f"model '{config.name}': config sets neither 'backend' nor 'platform'"
            )
        if name not in self._factories:
            raise ModelLoadError(
                f"model '{config.name}': {_field(config)} is not supported: no backend "
                f"'{name}' is installed (available: {', '.join(self.names)})"
            )
        backend = self._backend(name)
        if config.backend and config.platform and _PLATFORMS.get(config.platform) != name:
            # Triton refuses the pair too; serving it would silently ignore the platform.
            raise ModelLoadError(
                f"model '{config.name}': platform '{config.platform}' is not supported with "
                f"backend '{config.backend}'"
            )
        return backend

    def _backend(self, name: str) -> Backend:
        if name not in self._backends:
            self._backends[name] = self._factories[name]()
        return self._backends[name]


def _lazy(target: str) -> Callable[[], Backend]:
    def load() -> Backend:
        module_name, _, attr = target.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ModelLoadError(f"backend '{target}' cannot be imported: {exc}") from exc
        backend: Backend = cls()
        return backend

    return load
