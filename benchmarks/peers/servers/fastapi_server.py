"""`simple` (INT32 add/sub of two 16-vectors) as a plain FastAPI app: the no-framework baseline.
POST /predict {"a": [16 ints], "b": [16 ints]} -> {"sum": [...], "diff": [...]}."""

import sys

import numpy as np
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

app = FastAPI()


class Pair(BaseModel):
    a: list[int]
    b: list[int]


@app.post("/predict")
def predict(pair: Pair) -> dict[str, list[int]]:
    a, b = np.asarray(pair.a, np.int32), np.asarray(pair.b, np.int32)
    return {"sum": (a + b).tolist(), "diff": (a - b).tolist()}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
