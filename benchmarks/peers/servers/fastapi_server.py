"""The peers' models as a plain FastAPI app: the no-framework baseline (no batching).
POST /predict {"a": [16 ints], "b": [16 ints]} -> {"sum": [...], "diff": [...]};
POST /mlp {"x": [64 floats]} -> {"y": [10 floats]}.  argv: HTTP port, gRPC port (unused),
metrics port (unused), MLP TorchScript file."""

import sys

import numpy as np
import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

app = FastAPI()
mlp = torch.jit.load(sys.argv[4]).eval()


class Pair(BaseModel):
    a: list[int]
    b: list[int]


class Features(BaseModel):
    x: list[float]


@app.post("/predict")
def predict(pair: Pair) -> dict[str, list[int]]:
    a, b = np.asarray(pair.a, np.int32), np.asarray(pair.b, np.int32)
    return {"sum": (a + b).tolist(), "diff": (a - b).tolist()}


@app.post("/mlp")
def classify(features: Features) -> dict[str, list[float]]:
    with torch.inference_mode():
        return {"y": mlp(torch.tensor([features.x]))[0].tolist()}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
