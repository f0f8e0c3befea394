"""Triton's classification extension: an output requested with the parameter
``classification: N`` (gRPC tritonclient's ``class_count``) is answered with its top N classes
instead of its values, as BYTES strings ``"<value>:<index>"``, or ``"<value>:<index>:<label>"``
when the output's ``label_filename`` has a label on that line (read at load,
``repository/loader.py``).

As Triton's ``classification.cc``: the classes of each batch row (a model that batches; else of
the whole output, flattened), highest value first, shape ``[batch, min(N, classes)]`` (or
``[min(N, classes)]``); values printed as C++'s ``std::to_string`` prints them (floats with six
decimals, integers as they are); numeric datatypes only (BOOL, BYTES, FP16 and BF16 are refused,
as there). Ties, which Triton's unstable sort leaves in no set order, go lowest index first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from infermux.errors import InvalidArgumentError
from infermux.model_config import ModelConfig
from infermux.types import RequestedOutput, Tensor, uses_shared_memory

CLASSIFICATION = "classification"
"""The requested output's parameter naming how many classes to return."""

CLASSIFIABLE = frozenset(
    {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"}
)


def wanted_classes(config: ModelConfig, outputs: Sequence[RequestedOutput]) -> dict[str, int]:
    """Output name -> class count of the outputs requested as classifications ({} for most
    requests). Raises InvalidArgumentError naming the output before anything runs."""
    wanted: dict[str, int] = {}
    for output in outputs:
        count = output.parameters.get(CLASSIFICATION)
        if count is None:
            continue
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise InvalidArgumentError(
                f"output '{output.name}': parameter '{CLASSIFICATION}' must be an integer >= 0, "
                f"got {count!r}"
            )
        if count == 0:  # tritonclient's default: no classification
            continue
        if uses_shared_memory(output.parameters):
            raise InvalidArgumentError(
                f"output '{output.name}': a classification cannot be placed in shared memory"
            )
        spec = next((t for t in config.outputs if t.name == output.name), None)
        if spec is not None and spec.datatype not in CLASSIFIABLE:
            raise InvalidArgumentError(
                "class result not available for output due to unsupported type "
                f"'{spec.datatype}' (output '{output.name}')"
            )
        wanted[output.name] = count
    return wanted


def classified(
    outputs: list[Tensor],
    wanted: Mapping[str, int],
    *,
    batched: bool,
    labels: Mapping[str, Sequence[str]],
) -> list[Tensor]:
    """``outputs`` with those in ``wanted`` replaced by their top classes."""
    return [
        Tensor(t.name, "BYTES", *_top(t, wanted[t.name], batched, labels.get(t.name, ())))
        if t.name in wanted
        else t
        for t in outputs
    ]


def _top(
    tensor: Tensor, count: int, batched: bool, labels: Sequence[str]
) -> tuple[tuple[int, ...], npt.NDArray[np.object_]]:
    data = np.asarray(tensor.data)
    rows = data.reshape(data.shape[0], -1) if batched and data.ndim > 0 else data.reshape(1, -1)
    classes = rows.shape[1]
    keep = min(count, classes)
    floats = data.dtype.kind == "f"
    result = np.empty((rows.shape[0], keep), dtype=np.object_)
    for r, row in enumerate(rows):
        # Descending, ties lowest index first: a stable ascending sort of the reversed row,
        # read backwards.
        order = (classes - 1 - np.argsort(row[::-1], kind="stable")[::-1])[:keep]
        for k, index in enumerate(order.tolist()):
            value = row[index]
            text = f"{float(value):f}" if floats else str(int(value))
            text += f":{index}"
            if index < len(labels) and labels[index]:
                text += f":{labels[index]}"
            result[r, k] = text.encode()
    shape = (rows.shape[0], keep) if batched and data.ndim > 0 else (keep,)
    return shape, result.reshape(shape)
