"""The peer servers, each serving the same TorchScript file as infermux; ``run.py`` starts them as
subprocesses in their own process group.

    python benchmarks/gpu/peers.py litserve --model resnet50 --model-file M.pt --port P [--device cuda]
    python benchmarks/gpu/peers.py fastapi  --model resnet50 --model-file M.pt --port P [--device cuda]

Wire format, the same for both: ``POST /predict`` with a JSON body ``{"INPUT__0": "<base64>", ...}``
holding each input's raw little-endian bytes for one item, answered by ``{"OUTPUT__0": "<base64>"}``
(FP16 bytes). JSON + base64 because LitServe hands ``decode_request`` a parsed JSON (or form) body
and has no raw-bytes path; FastAPI gets the same format so that the two differ only in serving.

- ``litserve``: LitServe's batching loop (``max_batch_size``, ``batch_timeout``), ``--workers``
  inference worker processes on the device (each loads its own copy of the model), and LitServe's
  default of one API-server process per worker.
- ``fastapi``: one uvicorn process, a plain ``def`` endpoint (FastAPI runs it on its thread pool),
  no batching: the "no serving framework" baseline.
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from specs import ModelSpec, model_spec


class TorchScriptModel:
    """Loads the exported file; runs a list of stacked numpy inputs, returns FP16 numpy."""

    def __init__(self, path: str, device: str) -> None:
        import torch

        self._torch = torch
        self.device = device
        self.module = torch.jit.load(path, map_location=device).eval()

    def __call__(self, inputs: list[npt.NDArray[Any]]) -> npt.NDArray[np.float16]:
        torch = self._torch
        with torch.inference_mode():
            tensors = [torch.from_numpy(a).to(self.device, non_blocking=False) for a in inputs]
            out: npt.NDArray[np.float16] = self.module(*tensors).cpu().numpy()
        return out

    def warm_up(self, spec: ModelSpec, batches: tuple[int, ...]) -> None:
        """TorchScript specialises during its first calls: do those before taking requests."""
        for batch in batches:
            inputs = [np.zeros((batch, *t.dims), dtype=t.dtype) for t in spec.inputs]
            for _ in range(3):
                self(inputs)


def decode(spec: ModelSpec, payload: dict[str, str]) -> list[npt.NDArray[Any]]:
    return [
        np.frombuffer(base64.b64decode(payload[t.name]), dtype=t.dtype).reshape(t.dims)
        for t in spec.inputs
    ]


def encode(spec: ModelSpec, output: npt.NDArray[Any]) -> dict[str, str]:
    return {spec.output.name: base64.b64encode(output.astype(np.float16).tobytes()).decode()}


try:
    import litserve as ls

    _LitAPI: Any = ls.LitAPI
except ImportError:  # the FastAPI peer still runs
    ls = None
    _LitAPI = object


class LitTorchScriptApi(_LitAPI):  # type: ignore[misc]
    """At module level: LitServe pickles the API into spawned worker processes by reference.
    (``spec`` is LitAPI's own attribute, hence ``served``.)"""

    def __init__(self, spec: ModelSpec, model_file: str, max_batch: int, timeout: float) -> None:
        super().__init__(max_batch_size=max_batch, batch_timeout=timeout)
        self.served = spec
        self.model_file = model_file
        self.warm_batches = (1, max_batch)

    def setup(self, device: str) -> None:
        self.model = TorchScriptModel(self.model_file, device)
        self.model.warm_up(self.served, self.warm_batches)

    def decode_request(self, request: dict[str, str]) -> list[npt.NDArray[Any]]:
        return decode(self.served, request)

    def batch(self, inputs: list[list[npt.NDArray[Any]]]) -> list[npt.NDArray[Any]]:
        return [np.stack([item[i] for item in inputs]) for i in range(len(self.served.inputs))]

    def predict(self, x: list[npt.NDArray[Any]]) -> npt.NDArray[np.float16]:
        return self.model(x)

    def unbatch(self, output: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
        return list(output)

    def encode_response(self, output: npt.NDArray[Any]) -> dict[str, str]:
        return encode(self.served, output)


def serve_litserve(args: argparse.Namespace, spec: ModelSpec) -> None:
    if ls is None:
        raise SystemExit("litserve is not installed")
    api = LitTorchScriptApi(spec, args.model_file, args.max_batch, args.batch_timeout)
    server = ls.LitServer(
        api,
        accelerator=args.device,
        devices=1,
        workers_per_device=args.workers,
        timeout=120,  # seconds per request: deep queues at high concurrency are expected
    )
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False, log_level="warning")


def serve_fastapi(args: argparse.Namespace, spec: ModelSpec) -> None:
    import uvicorn
    from fastapi import FastAPI

    model = TorchScriptModel(args.model_file, args.device)
    model.warm_up(spec, (1,))
    app = FastAPI()

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/predict")
    def predict(payload: dict[str, str]) -> dict[str, str]:
        inputs = [a[np.newaxis] for a in decode(spec, payload)]
        return encode(spec, model(inputs)[0])

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", choices=("litserve", "fastapi"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--model-file", required=True, type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--workers", type=int, default=4, help="LitServe workers per device")
    parser.add_argument("--max-batch", type=int, default=64, help="LitServe max_batch_size")
    parser.add_argument("--batch-timeout", type=float, default=0.005, help="LitServe, seconds")
    args = parser.parse_args()
    args.model_file = str(args.model_file.resolve())
    spec = model_spec(args.model, args.tiny)
    if args.server == "litserve":
        serve_litserve(args, spec)
    else:
        serve_fastapi(args, spec)


if __name__ == "__main__":
    main()
