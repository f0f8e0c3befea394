"""`simple` (INT32 add/sub of two 16-vectors) on Ray Serve, same JSON as the FastAPI baseline."""

import sys
import time

import numpy as np
import ray
from ray import serve
from starlette.requests import Request


@serve.deployment(num_replicas=1)
class Simple:
    async def __call__(self, request: Request) -> dict[str, list[int]]:
        body = await request.json()
        a, b = np.asarray(body["a"], np.int32), np.asarray(body["b"], np.int32)
        return {"sum": (a + b).tolist(), "diff": (a - b).tolist()}


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
    serve.run(Simple.bind(), route_prefix="/predict")
    while True:
        time.sleep(3600)
