"""``simple``: element-wise sum and difference of two INT32 tensors.

Shows the batched contract: the requests of one batch are stacked, computed in one numpy call and
split back, one result per request (``infermux.stack`` / ``infermux.split``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import infermux


class Model:
    def execute(self, requests: list[infermux.ModelRequest]) -> Sequence[infermux.ExecuteResult]:
        inputs = infermux.stack(requests)  # the config's dims are fixed: shapes always match
        # INT32 by the config; asarray only tells the type checker (no copy).
        a = np.asarray(inputs["INPUT0"], dtype=np.int32)
        b = np.asarray(inputs["INPUT1"], dtype=np.int32)
        outputs = {"OUTPUT0": a + b, "OUTPUT1": a - b}
        return infermux.split(outputs, [request.batch_size for request in requests])
