"""Reads a model's ``config.pbtxt`` (protobuf text) or ``config.yaml`` (same fields, snake_case).

Both become Triton's ``ModelConfig`` message and then the typed :class:`ModelConfig`; every error
names the file and, where the parser tells us, the field.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import (
    # Imported here, on the importing (main) thread: protobuf imports descriptor_pb2 lazily the
    # first time a parse meets a map-like field, and the repository parses its models' configs
    # in worker threads at once. On Python 3.11 several threads making one first import at the
    # same moment can fail one of them with KeyError: 'google.protobuf.descriptor_pb2' (seen in
    # CI: a server that never started, 46 tests erroring on its fixture).
    descriptor_pb2,  # noqa: F401
    json_format,
    text_format,
)

from infermux.errors import ConfigError
from infermux.model_config import ModelConfig, check_supported, pb

PBTXT = "config.pbtxt"
YAML_NAMES = ("config.yaml", "config.yml")


def config_path(model_dir: Path) -> Path:
    """The config file of ``model_dir``; raises if there is none or more than one."""
    found = [model_dir / n for n in (PBTXT, *YAML_NAMES) if (model_dir / n).is_file()]
    if not found:
        raise ConfigError(
            str(model_dir), PBTXT, f"no {PBTXT} or {YAML_NAMES[0]} in the model directory"
        )
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ConfigError(str(model_dir), found[1].name, f"found {names}: keep exactly one")
    return found[0]


Complete = Callable[[pb.ModelConfig, Path], None]
"""Fills in a parsed config in place before it is validated (a backend's auto-complete)."""


def load_model_config(
    model_dir: Path,
    override_json: str | None = None,
    complete: Complete | None = None,
    *,
    name: str | None = None,
) -> ModelConfig:
    """Read, parse and validate the config of the model in ``model_dir``, refusing the fields
    infermux does not support yet (:func:`~infermux.model_config.check_supported`).

    ``override_json`` (a ModelConfig as JSON, as in the repository load API) replaces the file.
    A config without a name takes the model's (``name``, else the directory's); a different name
    is an error, as in Triton. ``complete`` may fill in what the file leaves out (inputs,
    outputs, batching) first.
    """
    model_name = model_dir.name if name is None else name
    if override_json is not None:
        source = f"{model_name} (config override)"
        message = _parse_json(override_json, source)
    else:
        path = config_path(model_dir)
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(source, "*", f"cannot read the file: {exc}") from exc
        message = parse_config_text(text, source, yaml_format=path.name != PBTXT)
    if not message.name:
        message.name = model_name
    elif message.name != model_name:
        raise ConfigError(
            source,
            "name",
            f"'{message.name}' does not match the model directory name '{model_name}'",
        )
    if complete is not None:
        complete(message, model_dir)
    config = ModelConfig.from_proto(message, source)
    check_supported(config, source)
    return config


def parse_config_text(text: str, source: str, *, yaml_format: bool = False) -> pb.ModelConfig:
    """Parse config text into Triton's ``ModelConfig`` message (no semantic validation)."""
    if not yaml_format:
        try:
            return text_format.Parse(text, pb.ModelConfig())
        except text_format.ParseError as exc:
            # ParseError's text is "line:col : message", which names the offending field.
            raise ConfigError(source, _field_from_error(str(exc)), str(exc)) from exc
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, "*", f"invalid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, "*", "the top level must be a mapping of config fields")
    return _parse_dict(data, source)


def _parse_json(text: str, source: str) -> pb.ModelConfig:
    if not text.lstrip().startswith("{"):
        raise ConfigError(source, "config", "must be a ModelConfig JSON object")
    try:
        return json_format.Parse(text, pb.ModelConfig())
    except json_format.ParseError as exc:
        raise ConfigError(source, _field_from_error(str(exc)), str(exc)) from exc


def _parse_dict(data: dict[str, Any], source: str) -> pb.ModelConfig:
    try:
        return json_format.ParseDict(data, pb.ModelConfig())
    except json_format.ParseError as exc:
        raise ConfigError(source, _field_from_error(str(exc)), str(exc)) from exc


def _field_from_error(message: str) -> str:
    # protobuf names the field in both parsers' messages, e.g. 'Failed to parse dims field' or
    # 'Message type "inference.ModelInput" has no field named "dimz"'.
    for marker in ('field named "', 'no field named "', "Failed to parse "):
        if marker in message:
            rest = message.split(marker, 1)[1]
            return rest.split('"', 1)[0].split(" ", 1)[0]
    return "*"
