"""`simple` (INT32 add/sub of two 16-vectors) on LitServe, same JSON as the FastAPI baseline."""

import sys

import litserve as ls
import numpy as np


class Simple(ls.LitAPI):
    def setup(self, device: str) -> None:
        pass

    def decode_request(self, request: dict) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(request["a"], np.int32), np.asarray(request["b"], np.int32)

    def predict(self, pair: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        a, b = pair
        return a + b, a - b

    def encode_response(self, out: tuple[np.ndarray, np.ndarray]) -> dict[str, list[int]]:
        return {"sum": out[0].tolist(), "diff": out[1].tolist()}


if __name__ == "__main__":
    server = ls.LitServer(Simple(), accelerator="cpu", workers_per_device=1)
    server.run(host="127.0.0.1", port=int(sys.argv[1]), generate_client_file=False)
