"""``identity_fp32``: OUTPUT0 = INPUT0 (FP32)."""

from __future__ import annotations

from collections.abc import Sequence

import infermux


class Model:
    def execute(self, requests: list[infermux.ModelRequest]) -> Sequence[infermux.ExecuteResult]:
        return [{"OUTPUT0": request.inputs["INPUT0"]} for request in requests]
