"""The peers' models on Triton through PyTriton: `simple` (INT32 add/sub, max_batch_size 8) and
the MLP (max_batch_size 32, 0.5 ms queue delay), both dynamically batched.
argv: HTTP port, gRPC port, metrics port, MLP TorchScript file."""

import sys

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

NET = torch.jit.load(sys.argv[4]).eval()


@batch
def simple(INPUT0: np.ndarray, INPUT1: np.ndarray) -> dict[str, np.ndarray]:
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


@batch
def mlp(INPUT__0: np.ndarray) -> dict[str, np.ndarray]:
    with torch.inference_mode():
        return {"OUTPUT__0": NET(torch.from_numpy(INPUT__0)).numpy()}


if __name__ == "__main__":
    http, grpc, metrics = (int(p) for p in sys.argv[1:4])
    config = TritonConfig(
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
    )
    with Triton(
        config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])
    ) as triton:
        triton.bind(
            model_name="simple",
            infer_func=simple,
            inputs=[
                Tensor(name="INPUT0", dtype=np.int32, shape=(16,)),
                Tensor(name="INPUT1", dtype=np.int32, shape=(16,)),
            ],
            outputs=[
                Tensor(name="OUTPUT0", dtype=np.int32, shape=(16,)),
                Tensor(name="OUTPUT1", dtype=np.int32, shape=(16,)),
            ],
            config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher()),
        )
        triton.bind(
            model_name="mlp",
            infer_func=mlp,
            inputs=[Tensor(name="INPUT__0", dtype=np.float32, shape=(64,))],
            outputs=[Tensor(name="OUTPUT__0", dtype=np.float32, shape=(10,))],
            config=ModelConfig(
                max_batch_size=32, batcher=DynamicBatcher(max_queue_delay_microseconds=500)
            ),
        )
        triton.serve()
