"""How a PyTorch model's arguments and results meet the config's tensors, as in Triton's libtorch
backend: inputs named ``<name>__<index>`` go to that positional argument, other inputs go
positionally in config order, or as keyword arguments by name under ``INPUT_BY_NAME``; outputs
named ``<name>__<index>`` pick that element of a returned tuple or list, others are taken in config
order; a single returned tensor is the single output, and a returned dict maps by name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infermux.errors import InternalError, InvalidArgumentError, ModelLoadError
from infermux.model_config import ModelConfig, TensorConfig

_INDEXED = re.compile(r"^.+__(\d+)$")  # Triton's <name>__<index> naming convention


@dataclass(frozen=True)
class Signature:
    """How config tensors map to the model's arguments and results."""

    config: ModelConfig
    by_name: bool
    input_order: tuple[str, ...]
    output_index: Mapping[str, int]

    @classmethod
    def of(cls, config: ModelConfig) -> Signature:
        inputs = _indices(config, config.inputs, "input")
        if inputs is not None and sorted(inputs.values()) != list(range(len(inputs))):
            raise ModelLoadError(
                f"model '{config.name}': inputs named <name>__<index> must number 0.."
                f"{len(inputs) - 1} without gaps, got {sorted(inputs.values())}"
            )
        order = (
            sorted(inputs, key=inputs.__getitem__) if inputs else [t.name for t in config.inputs]
        )
        # Output indices may skip elements: a config can serve a subset of what forward returns.
        outputs = _indices(config, config.outputs, "output")
        if outputs is None:
            outputs = {t.name: i for i, t in enumerate(config.outputs)}
        return cls(config, flag(config, "INPUT_BY_NAME"), tuple(order), outputs)

    def arguments(self, tensors: Mapping[str, Any]) -> tuple[Sequence[Any], Mapping[str, Any]]:
        """The model's positional and keyword arguments for input tensors by name."""
        if self.by_name:
            return (), tensors
        args = []
        for key in self.input_order:
            if key not in tensors:
                break
            args.append(tensors[key])
        if len(args) < len(tensors):
            missing = self.input_order[len(args)]
            raise InvalidArgumentError(
                f"model '{self.config.name}': optional input '{missing}' can only be left out "
                "when no input after it (by position) is sent"
            )
        return args, {}

    def outputs(self, result: object) -> dict[str, Any]:
        """The model's return value as output tensors by config name."""
        config = self.config
        if isinstance(result, Mapping):
            return {key: result[key] for key in self.output_index if key in result}
        if isinstance(result, (tuple, list)):
            outputs = {}
            for key, index in self.output_index.items():
                if index >= len(result):
                    raise InternalError(
                        f"model '{config.name}' returned {len(result)} values, but output '{key}' "
                        f"is element {index}"
                    )
                outputs[key] = result[index]
            return outputs
        if len(config.outputs) == 1:
            return {config.outputs[0].name: result}
        raise InternalError(
            f"model '{config.name}' returned one {type(result).__name__}, but the config declares "
            f"{len(config.outputs)} outputs; return a tuple, list or dict"
        )


def flag(config: ModelConfig, key: str) -> bool:
    """A true/false config parameter (absent: false)."""
    value = config.parameters.get(key, "").strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("", "false", "0", "no", "off"):
        return False
    raise ModelLoadError(
        f'model \'{config.name}\': parameter {key} must be "true" or "false", got {value!r}'
    )


def _indices(
    config: ModelConfig, tensors: Sequence[TensorConfig], kind: str
) -> dict[str, int] | None:
    """``name -> index`` when every tensor follows ``<name>__<index>``, else None."""
    matches = [_INDEXED.match(t.name) for t in tensors]
    if not matches or not all(matches):
        return None
    indices = {t.name: int(m.group(1)) for t, m in zip(tensors, matches, strict=True) if m}
    if len(set(indices.values())) != len(indices):
        raise ModelLoadError(f"model '{config.name}': two {kind}s share one __<index>")
    return indices
