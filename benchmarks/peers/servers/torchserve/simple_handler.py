"""`simple` (INT32 add/sub of two 16-vectors) as a TorchServe handler, same JSON as the FastAPI
baseline: {"a": [...], "b": [...]} -> {"sum": [...], "diff": [...]}."""

import json

import numpy as np


def handle(data, context):  # TorchServe's module-level handler protocol
    if data is None:  # the load-time call
        return None
    answers = []
    for row in data:
        body = row.get("body") or row.get("data")
        body = json.loads(body) if isinstance(body, (bytes, bytearray)) else body
        a, b = np.asarray(body["a"], np.int32), np.asarray(body["b"], np.int32)
        answers.append({"sum": (a + b).tolist(), "diff": (a - b).tolist()})
    return answers
