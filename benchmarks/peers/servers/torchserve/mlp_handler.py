"""The peers' MLP as a TorchServe handler (batched by TorchServe: batchSize 32, maxBatchDelay
1 ms, its smallest): {"x": [64 floats]} -> {"y": [10 floats]}."""

import json
import os

import torch

_LOADED: dict[str, torch.jit.ScriptModule] = {}


def handle(data, context):  # TorchServe's module-level handler protocol
    if not _LOADED:
        model_dir = context.system_properties["model_dir"]
        net = torch.jit.load(os.path.join(model_dir, context.manifest["model"]["serializedFile"]))
        _LOADED["net"] = net.eval()
    if data is None:
        return None
    rows = []
    for row in data:
        body = row.get("body") or row.get("data")
        rows.append((json.loads(body) if isinstance(body, (bytes, bytearray)) else body)["x"])
    with torch.inference_mode():
        return [{"y": y} for y in _LOADED["net"](torch.tensor(rows)).tolist()]
