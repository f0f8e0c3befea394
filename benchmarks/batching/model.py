"""Benchmark model for ``benchmarks/batching.py``: a small FP32 numpy MLP, 512 -> 1024 -> 1024 -> 10.

Copied verbatim as ``<model>/1/model.py`` into the temporary repository (``backend: "python"``) and
imported by the benchmark itself to compute expected outputs and the raw in-process ceiling.
``execute`` stacks every request of a batch into one matrix multiply and splits the result, like the
built-in ``simple`` example. Weights come from a fixed seed, so every process builds the same model.
Numpy's BLAS thread count is set by the benchmark through the environment (OMP_NUM_THREADS=1 ...).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt

INPUT_DIM = 512
HIDDEN_DIM = 1024
OUTPUT_DIM = 10
SEED = 20240611

Weights = tuple[npt.NDArray[np.float32], ...]


def build_weights(seed: int = SEED) -> Weights:
    """(W1, b1, W2, b2, W3, b3), scaled by 1/sqrt(fan_in) so activations stay O(1)."""
    rng = np.random.default_rng(seed)
    dims = [INPUT_DIM, HIDDEN_DIM, HIDDEN_DIM, OUTPUT_DIM]
    weights: list[npt.NDArray[np.float32]] = []
    for fan_in, fan_out in itertools.pairwise(dims):
        w = rng.standard_normal((fan_in, fan_out), dtype=np.float32) / np.float32(np.sqrt(fan_in))
        b = rng.standard_normal(fan_out, dtype=np.float32) * np.float32(0.01)
        weights += [np.ascontiguousarray(w), b]
    return tuple(weights)


def forward(weights: Weights, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``x``: [rows, 512] float32 -> [rows, 10] float32 (ReLU between layers)."""
    w1, b1, w2, b2, w3, b3 = weights
    h = np.maximum(x @ w1 + b1, np.float32(0))
    h = np.maximum(h @ w2 + b2, np.float32(0))
    out: npt.NDArray[np.float32] = h @ w3 + b3
    return out


class Model:
    def __init__(self) -> None:
        self.weights = build_weights()

    def execute(self, requests: list[Any]) -> list[Any]:
        # One stacked [rows, 512] matrix for the whole batch, one forward pass, split per request.
        inputs = [r.inputs["INPUT0"] for r in requests]
        x = inputs[0] if len(inputs) == 1 else np.concatenate(inputs)
        y = forward(self.weights, x)
        results: list[Any] = []
        start = 0
        for request in requests:
            end = start + request.batch_size
            results.append({"OUTPUT0": y[start:end]})
            start = end
        return results
