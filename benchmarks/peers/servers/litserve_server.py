"""The peers' models on LitServe, same JSON as the FastAPI baseline: `simple` unbatched on
/predict, the MLP batched (32, 0.5 ms) on /mlp.  argv: HTTP port, -, -, MLP TorchScript file."""

import sys

import litserve as ls
import numpy as np
import torch


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


class Mlp(ls.LitAPI):
    def setup(self, device: str) -> None:
        self.net = torch.jit.load(sys.argv[4]).eval()

    def decode_request(self, request: dict) -> torch.Tensor:
        return torch.tensor(request["x"], dtype=torch.float32)

    def batch(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(inputs)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.net(x)

    def unbatch(self, y: torch.Tensor) -> list[torch.Tensor]:
        return list(y)

    def encode_response(self, y: torch.Tensor) -> dict[str, list[float]]:
        return {"y": y.tolist()}


if __name__ == "__main__":
    apis = [
        Simple(api_path="/predict"),
        Mlp(api_path="/mlp", max_batch_size=32, batch_timeout=0.0005),
    ]
    server = ls.LitServer(apis, accelerator="cpu", workers_per_device=1)
    server.run(host="127.0.0.1", port=int(sys.argv[1]), generate_client_file=False)
