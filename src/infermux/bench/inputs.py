"""The tensors ``infermux bench`` sends, made from the model's V2 metadata: zeros, random values,
or the contents of a ``.npz`` / ``.json`` file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from infermux.types import numpy_dtype

Array = npt.NDArray[Any]


def _dtype(datatype: str) -> np.dtype[Any]:
    return numpy_dtype(datatype)


def make_inputs(
    metadata: dict[str, Any],
    batched: bool,
    batch_size: int,
    data: str,
    shapes: dict[str, tuple[int, ...]],
) -> dict[str, tuple[str, Array]]:
    """Input name -> (datatype, array) for one request; raises ValueError naming what is
    missing (a variable dimension without --shape, an input the file lacks)."""
    if data not in ("zero", "random"):
        return _from_file(Path(data), metadata)
    rng = np.random.default_rng(0)
    result = {}
    for spec in metadata["inputs"]:
        name, datatype = spec["name"], spec["datatype"]
        dims = [int(d) for d in spec["shape"]]
        if batched:
            dims = dims[1:]
        if name in shapes:
            dims = list(shapes[name])
        if any(d < 0 for d in dims):
            raise ValueError(
                f"input '{name}' has variable dimensions {dims}: give --shape {name}:..."
            )
        shape = (batch_size, *dims) if batched else tuple(dims)
        result[name] = (datatype, _values(datatype, shape, data, rng))
    return result


def _values(datatype: str, shape: tuple[int, ...], data: str, rng: np.random.Generator) -> Array:
    dtype = _dtype(datatype)
    if datatype == "BYTES":
        fill = b"0" * 8 if data == "zero" else None
        flat = [fill or rng.bytes(8).hex().encode() for _ in range(int(np.prod(shape)))]
        return np.array(flat, dtype=object).reshape(shape)
    if data == "zero":
        return np.zeros(shape, dtype=dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 64, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _from_file(path: Path, metadata: dict[str, Any]) -> dict[str, tuple[str, Array]]:
    if not path.is_file():
        raise ValueError(f"--input-data {path}: not zero, random or a file")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    elif path.suffix == ".json":
        arrays = json.loads(path.read_text())
        if not isinstance(arrays, dict):
            raise ValueError(f"--input-data {path}: expected an object of input name -> values")
    else:
        raise ValueError(f"--input-data {path}: expected a .npz or .json file")
    result = {}
    for spec in metadata["inputs"]:
        name, datatype = spec["name"], spec["datatype"]
        if name not in arrays:
            raise ValueError(f"--input-data {path}: no values for input '{name}'")
        values = arrays[name]
        if datatype == "BYTES":
            array = np.array(
                [v.encode() if isinstance(v, str) else v for v in np.ravel(values)], dtype=object
            )
            result[name] = (datatype, array.reshape(np.shape(values)))
        else:
            result[name] = (datatype, np.asarray(values, dtype=_dtype(datatype)))
    return result
