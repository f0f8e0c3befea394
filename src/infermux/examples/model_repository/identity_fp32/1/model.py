"""``identity_fp32``: OUTPUT0 = INPUT0 (FP32)."""

from __future__ import annotations

from typing import Any

import infermux


class Model:
    def execute(self, requests: list[infermux.ModelRequest]) -> list[Any]:
        return [{"OUTPUT0": request.inputs["INPUT0"]} for request in requests]
