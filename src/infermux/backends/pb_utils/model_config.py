"""The config as a Triton Python model reads it (a dict of Triton's JSON) and completes it
(``auto_complete_config`` receives a :class:`ModelConfig` to fill in before the server
validates it), with Triton's helpers over that dict."""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import json_format

from infermux.backends.pb_utils.errors import TritonModelException
from infermux.model_config import message_to_json_dict, pb

TRITON_STRING_TO_NUMPY: dict[str, type[Any]] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def triton_string_to_numpy(triton_type_string: str) -> type[Any]:
    """The numpy type of a config ``data_type`` (``"TYPE_FP32"`` -> ``np.float32``)."""
    try:
        return TRITON_STRING_TO_NUMPY[triton_type_string]
    except KeyError:
        raise TritonModelException(f"unknown data_type {triton_type_string!r}") from None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``input`` entry named ``name`` of a config dict, or None."""
    return _named(model_config.get("input", ()), name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``output`` entry named ``name`` of a config dict, or None."""
    return _named(model_config.get("output", ()), name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether a config dict says ``model_transaction_policy { decoupled: true }`` (a model
    checks it in ``initialize`` when it only works one way or the other)."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


def _named(entries: Any, name: str) -> dict[str, Any] | None:
    for entry in entries:
        if entry.get("name") == name:
            return dict(entry)
    return None


class ModelConfig:
    """What ``auto_complete_config`` receives and returns: the config read from the repository
    (possibly almost empty), which the model completes. The result is validated as any config."""

    def __init__(self, message: pb.ModelConfig) -> None:
        self._config = message_to_json_dict(message)

    def as_dict(self) -> dict[str, Any]:
        """The config as Triton's JSON dict (read it; change it through the setters)."""
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if not isinstance(max_batch_size, int) or max_batch_size < 0:
            raise TritonModelException(f"max_batch_size must be an int >= 0, got {max_batch_size}")
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Turn the dynamic batcher on with its defaults (kept as they are if it is on)."""
        if not self._config.get("dynamic_batching"):
            self._config["dynamic_batching"] = {}

    def set_model_transaction_policy(self, policy: dict[str, Any]) -> None:
        unknown = set(policy) - {"decoupled"}
        if unknown:
            raise TritonModelException(f"unknown model_transaction_policy keys: {sorted(unknown)}")
        self._config["model_transaction_policy"] = dict(policy)

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def _add(self, kind: str, tensor: dict[str, Any]) -> None:
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise TritonModelException(f"auto-complete: {kind} {tensor!r} has no '{key}'")
        entries: list[dict[str, Any]] = self._config.setdefault(kind, [])
        for entry in entries:
            if entry.get("name") != tensor["name"]:
                continue
            for key in ("data_type", "dims"):
                if _same(entry.get(key), tensor[key]) or _unset(entry.get(key)):
                    continue
                raise TritonModelException(
                    f"auto-complete: {kind} '{tensor['name']}' {key} is {entry.get(key)!r} in "
                    f"the config, not {tensor[key]!r}"
                )
            entry.update(tensor)
            return
        entries.append(dict(tensor))

    def to_message(self) -> pb.ModelConfig:
        """The completed config as Triton's message (raises naming what does not parse)."""
        try:
            return json_format.ParseDict(self._config, pb.ModelConfig())
        except json_format.ParseError as exc:
            raise TritonModelException(f"auto-complete gave an invalid config: {exc}") from exc


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return [int(x) for x in a] == [int(x) for x in b]
    return bool(a == b)


def _unset(value: Any) -> bool:
    return value in (None, "", "TYPE_INVALID", [], ())
