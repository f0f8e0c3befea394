"""The peers' models on Ray Serve, same JSON as the FastAPI baseline: `simple` on /predict, the
MLP on /mlp batched with @serve.batch (32, 0.5 ms).  argv: HTTP port, -, -, MLP TorchScript file."""

import sys
import time

import numpy as np
import ray
import torch
from ray import serve
from starlette.requests import Request


@serve.deployment(num_replicas=1)
class Simple:
    async def __call__(self, request: Request) -> dict[str, list[int]]:
        body = await request.json()
        a, b = np.asarray(body["a"], np.int32), np.asarray(body["b"], np.int32)
        return {"sum": (a + b).tolist(), "diff": (a - b).tolist()}


@serve.deployment(num_replicas=1)
class Mlp:
    def __init__(self, path: str) -> None:
        self.net = torch.jit.load(path).eval()

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.0005)
    async def classify(self, rows: list[list[float]]) -> list[list[float]]:
        with torch.inference_mode():
            return self.net(torch.tensor(rows)).tolist()

    async def __call__(self, request: Request) -> dict[str, list[float]]:
        return {"y": await self.classify((await request.json())["x"])}


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
    serve.run(Simple.bind(), name="simple", route_prefix="/predict")
    serve.run(Mlp.bind(sys.argv[4]), name="mlp", route_prefix="/mlp")
    while True:
        time.sleep(3600)
