"""``simple``: element-wise sum and difference of two INT32 tensors.

Shows the batched contract: the requests of one batch are stacked, computed in one numpy call and
split back, one result per request.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import infermux


class Model:
    def execute(self, requests: list[infermux.ModelRequest]) -> list[Any]:
        a = np.concatenate([r.inputs["INPUT0"] for r in requests])
        b = np.concatenate([r.inputs["INPUT1"] for r in requests])
        total, difference = a + b, a - b
        results = []
        start = 0
        for request in requests:
            end = start + request.batch_size
            results.append({"OUTPUT0": total[start:end], "OUTPUT1": difference[start:end]})
            start = end
        return results
