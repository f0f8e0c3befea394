"""Builds the benchmark's models (random weights, fixed seed, no downloads) and exports them to a
Triton-layout repository: ``<repo>/<name>/config.pbtxt`` + ``<repo>/<name>/1/model.pt``.

Imported only by ``raw.py``, in a subprocess: building and tracing on the GPU creates a CUDA
context, which must be gone before the servers start and their GPU memory is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from specs import ModelSpec, graphs_line, reference_inputs

# ImageNet statistics, as torchvision's weights expect them.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class ImageClassifier(torch.nn.Module):
    """uint8 ``[N, H, W, 3]`` in, FP16 logits out: decoding clients send raw pixels (a quarter of
    FP32's bytes) and the normalisation runs on the device, fused into one multiply-add."""

    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(self, net: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.net = net.to(dtype)
        std = torch.tensor(STD).view(1, 3, 1, 1)
        mean = torch.tensor(MEAN).view(1, 3, 1, 1)
        # (x / 255 - mean) / std == x * scale + shift
        self.register_buffer("scale", (1.0 / (255.0 * std)).to(dtype))
        self.register_buffer("shift", (-mean / std).to(dtype))
        self.dtype = dtype

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image.permute(0, 3, 1, 2).to(self.dtype) * self.scale + self.shift
        logits: torch.Tensor = self.net(x.contiguous(memory_format=torch.channels_last))
        return logits.half()


class PooledBert(torch.nn.Module):
    """Token ids and attention mask in, the FP16 pooled ``[CLS]`` vector out."""

    def __init__(self, tiny: bool, dtype: torch.dtype) -> None:
        super().__init__()
        import transformers

        config = (
            transformers.BertConfig(
                hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
            )
            if tiny
            else transformers.BertConfig()  # bert-base-uncased's shape
        )
        self.bert = transformers.BertModel(config).to(dtype)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pooled: torch.Tensor = self.bert(input_ids=ids, attention_mask=mask).pooler_output
        return pooled.half()


def compute_dtype(device: str) -> torch.dtype:
    """FP16 on the GPU; FP32 on the CPU, whose FP16 convolutions are ~20x slower reference code.
    The wire format (uint8 or int64 in, FP16 out) is the same either way."""
    return torch.float16 if device == "cuda" else torch.float32


def build(spec: ModelSpec, tiny: bool, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    if spec.name == "resnet50":
        import torchvision

        net = torchvision.models.resnet18() if tiny else torchvision.models.resnet50()
        # channels_last is what cuDNN's FP16 tensor-core convolutions want.
        return ImageClassifier(net.to(memory_format=torch.channels_last), dtype).eval()
    return PooledBert(tiny, dtype).eval()


def example_inputs(spec: ModelSpec, batch: int, seed: int) -> tuple[torch.Tensor, ...]:
    """A batch for tracing; BERT's mask has padding so that no all-ones shortcut is traced in."""
    rng = np.random.default_rng(seed)
    if spec.name == "resnet50":
        dims = spec.inputs[0].dims
        return (torch.from_numpy(rng.integers(0, 256, size=(batch, *dims), dtype=np.uint8)),)
    seq = spec.inputs[0].dims[0]
    ids = torch.from_numpy(rng.integers(1000, 30000, size=(batch, seq), dtype=np.int64))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    for row in range(batch):
        mask[row, seq - 1 - (row * 7) % (seq // 2) :] = 0
    return ids, mask


def config_text(
    spec: ModelSpec,
    *,
    device: str,
    instances: int,
    queue_delay_us: int,
    cuda_graphs: bool,
    gpus: str = "",
    graph_batch_sizes: tuple[int, ...] = (),
) -> str:
    def tensor(name: str, config_type: str, dims: tuple[int, ...]) -> str:
        return (
            f'{{ name: "{name}", data_type: {config_type}, dims: [ {", ".join(map(str, dims))} ] }}'
        )

    inputs = ",\n  ".join(tensor(t.name, t.config_type, t.dims) for t in spec.inputs)
    out = spec.output
    kind = "KIND_GPU" if device == "cuda" else "KIND_CPU"
    # count instances on *each* listed GPU, as in Triton
    placement = f", gpus: [ {gpus} ]" if gpus and device == "cuda" else ""
    text = (
        f'name: "{spec.name}"\n'
        'platform: "pytorch_libtorch"\n'
        f"max_batch_size: {spec.max_batch_size}\n"
        f"input [\n  {inputs}\n]\n"
        f"output [\n  {tensor(out.name, out.config_type, out.dims)}\n]\n"
        f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}\n"
        f"instance_group [ {{ count: {instances}, kind: {kind}{placement} }} ]\n"
    )
    if cuda_graphs:
        text += graphs_line(graph_batch_sizes)
    return text


@dataclass
class Exported:
    model_file: Path
    config_file: Path
    trace_check_error: float  # traced vs eager on an input the trace never saw


def export(
    spec: ModelSpec,
    repo: Path,
    *,
    tiny: bool,
    device: str,
    instances: int,
    queue_delay_us: int,
    cuda_graphs: bool,
    gpus: str = "",
    graph_batch_sizes: tuple[int, ...] = (),
) -> Exported:
    """Trace on the serving device (tracing bakes device-side constants, such as BERT's mask
    fill, on the device it ran on; ``map_location`` does not move them) and write the folder."""
    from specs import output_error

    target = repo / spec.name
    (target / "1").mkdir(parents=True, exist_ok=True)
    module = build(spec, tiny, compute_dtype(device)).to(device)
    example = tuple(t.to(device) for t in example_inputs(spec, 2, seed=1))
    with torch.no_grad():
        traced: Any = torch.jit.trace(module, example, check_trace=False)
        unseen = tuple(t.to(device) for t in example_inputs(spec, 3, seed=2))
        error = output_error(traced(*unseen).cpu().numpy(), module(*unseen).cpu().numpy())
    model_file = target / "1" / "model.pt"
    traced.save(str(model_file))
    config_file = target / "config.pbtxt"
    config_file.write_text(
        config_text(
            spec,
            device=device,
            instances=instances,
            queue_delay_us=queue_delay_us,
            cuda_graphs=cuda_graphs,
            gpus=gpus,
            graph_batch_sizes=graph_batch_sizes,
        )
    )
    return Exported(model_file, config_file, error)


def reference_output(model: Any, spec: ModelSpec, device: str) -> dict[str, np.ndarray]:
    """The reference request and what the exported file answers for it (batch 1, eager)."""
    inputs = reference_inputs(spec)
    with torch.no_grad():
        tensors = [torch.from_numpy(inputs[t.name]).to(device) for t in spec.inputs]
        output = model(*tensors).cpu().numpy()
    return {**inputs, spec.output.name: output}
