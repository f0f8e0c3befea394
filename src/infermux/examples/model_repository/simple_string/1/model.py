"""``simple_string``: sum and difference of decimal integers carried as BYTES.

A request whose strings are not integers fails alone with an INVALID_ARG error (HTTP 400); the
other requests of the batch are unaffected.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

import infermux


def _as_int(name: str, values: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    try:
        return np.array([int(v) for v in values.reshape(-1)], dtype=np.int64).reshape(values.shape)
    except ValueError:
        raise infermux.InvalidArgumentError(
            f"input '{name}' must hold decimal integers as strings"
        ) from None


def _as_strings(values: npt.NDArray[np.int64]) -> npt.NDArray[np.object_]:
    out = np.array([str(v).encode() for v in values.reshape(-1)], dtype=np.object_)
    return out.reshape(values.shape)


class Model:
    def execute(self, requests: list[infermux.ModelRequest]) -> list[Any]:
        results: list[Any] = []
        for request in requests:
            try:
                a = _as_int("INPUT0", request.inputs["INPUT0"])
                b = _as_int("INPUT1", request.inputs["INPUT1"])
            except infermux.InvalidArgumentError as exc:
                results.append(exc)
                continue
            results.append({"OUTPUT0": _as_strings(a + b), "OUTPUT1": _as_strings(a - b)})
        return results
