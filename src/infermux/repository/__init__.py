"""The model repository: Triton layout on disk, config files, versions and the loaded models."""

from infermux.repository.config_file import load_model_config, parse_config_text
from infermux.repository.layout import ModelSource, discover_models, list_versions
from infermux.repository.loader import LoadedModel
from infermux.repository.manager import ModelRepository
from infermux.repository.placement import ONLY, Shard
from infermux.repository.state import ControlMode, LoadObserver

__all__ = [
    "ONLY",
    "ControlMode",
    "LoadObserver",
    "LoadedModel",
    "ModelRepository",
    "ModelSource",
    "Shard",
    "discover_models",
    "list_versions",
    "load_model_config",
    "parse_config_text",
]
