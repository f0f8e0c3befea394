"""Triton's ``model_warmup``: run each instance on synthetic requests before it is READY.

A sample has a batch size, a count and, per input, zero data, random data or a file from the
model's ``warmup/`` directory (raw tensor bytes, BYTES length-prefixed). A failing sample fails the
load with a reason naming the sample, so a version that cannot run is never served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from infermux.backends.base import BackendInstance, ModelRequest
from infermux.backends.paths import model_path_of
from infermux.errors import ModelLoadError
from infermux.model_config import ModelConfig, config_datatype, pb
from infermux.tensor_bytes import tensor_from_bytes
from infermux.types import element_count, numpy_dtype

_RNG = np.random.default_rng(0)


def warm_up(config: ModelConfig, model_path: Path, instance: BackendInstance) -> None:
    """Run every ``model_warmup`` sample on ``instance``; raise ModelLoadError if one fails."""
    for index, sample in enumerate(config.proto.model_warmup):
        label = sample.name or f"#{index}"
        request = _request(config, model_path, sample, label)
        for _ in range(max(1, sample.count)):
            try:
                (result,) = instance.execute([request])
            except Exception as exc:
                raise ModelLoadError(
                    f"model '{config.name}': warm-up sample '{label}' failed: {exc}"
                ) from exc
            if isinstance(result, Exception):
                raise ModelLoadError(
                    f"model '{config.name}': warm-up sample '{label}' failed: {result}"
                )


def _request(config: ModelConfig, model_path: Path, sample: Any, label: str) -> ModelRequest:
    batch = sample.batch_size
    if config.batching and not 1 <= batch <= config.max_batch_size:
        raise ModelLoadError(
            f"model '{config.name}': warm-up sample '{label}' batch_size {batch} must be in "
            f"[1, max_batch_size={config.max_batch_size}]"
        )
    inputs: dict[str, npt.NDArray[np.generic]] = {}
    for name, spec in sample.inputs.items():
        datatype = config_datatype(pb.DataType.Name(spec.data_type))
        shape = ((batch,) if config.batching else ()) + tuple(int(d) for d in spec.dims)
        where = f"model '{config.name}': warm-up sample '{label}' input '{name}'"
        inputs[name] = _data(
            model_path, where, name=name, datatype=datatype, shape=shape, spec=spec
        )
    outputs = tuple(t.name for t in config.outputs)
    return ModelRequest(inputs, outputs, {}, f"warmup-{label}")


def _data(
    model_path: Path,
    where: str,
    *,
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    spec: Any,
) -> npt.NDArray[np.generic]:
    kind = spec.WhichOneof("input_data_type")
    count = element_count(shape)
    if kind == "input_data_file":
        path = model_path_of(
            model_path, model_path / "warmup", spec.input_data_file, "input_data_file", where=where
        )
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ModelLoadError(f"{where}: cannot read {path}: {exc.strerror}") from None
        return tensor_from_bytes(name, datatype, shape, raw)
    if datatype == "BYTES":
        words = [b"" if kind != "random_data" else _RNG.bytes(8) for _ in range(count)]
        return np.array(words, dtype=np.object_).reshape(shape)
    dtype = numpy_dtype(datatype)
    if kind == "random_data":
        if dtype.kind in "iu":
            return _RNG.integers(0, 100, shape).astype(dtype)
        if dtype.kind == "b":
            return _RNG.integers(0, 2, shape).astype(dtype)
        return _RNG.random(shape).astype(dtype)  # uniform [0, 1): valid for most inputs
    return np.zeros(shape, dtype=dtype)
