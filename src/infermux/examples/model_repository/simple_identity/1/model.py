"""``simple_identity``: OUTPUT0 = INPUT0 (BYTES)."""

from __future__ import annotations

from typing import Any

import infermux


class Model:
    def execute(self, requests: list[infermux.ModelRequest]) -> list[Any]:
        return [{"OUTPUT0": request.inputs["INPUT0"]} for request in requests]
