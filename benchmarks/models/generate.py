"""Writes Triton-format model repositories for the GPU benchmarks (no downloads: random weights).

    python benchmarks/models/generate.py OUT_DIR [--models resnet50,bert_base] [--device gpu|cpu]
                                         [--formats torchscript,onnx] [--tiny]

- ``resnet50``: torchvision's ResNet-50 with random weights, FP32 input ``[3, 224, 224]``.
- ``bert_base``: transformers' BertModel with a random-initialised bert-base config, INT64 token
  ids and attention mask of length 128, pooled output ``[768]``.

Each model is written as TorchScript (``pytorch_libtorch``, ``INPUT__n``/``OUTPUT__n`` names) and
ONNX (``onnxruntime_onnx``), with dynamic batching and a KIND_GPU (or KIND_CPU) instance group.
``--tiny`` shrinks both models (for smoke tests on a CPU machine). torchvision and transformers are
needed only for the models asked for.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Spec:
    name: str
    build: Callable[[bool], torch.nn.Module]
    inputs: list[tuple[str, str, list[int]]]  # name, TYPE_*, dims (no batch)
    outputs: list[tuple[str, str, list[int]]]
    example: Callable[[int], tuple[torch.Tensor, ...]]
    max_batch_size: int


def _resnet50(tiny: bool) -> torch.nn.Module:
    import torchvision

    if tiny:
        return torchvision.models.resnet18(weights=None, num_classes=10)
    return torchvision.models.resnet50(weights=None)


class _BertPooled(torch.nn.Module):
    def __init__(self, tiny: bool) -> None:
        super().__init__()
        import transformers

        config = (
            transformers.BertConfig()
            if not tiny
            else transformers.BertConfig(
                hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
            )
        )
        self.bert = transformers.BertModel(config)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pooled: torch.Tensor = self.bert(input_ids=ids, attention_mask=mask).pooler_output
        return pooled


SEQ = 128


def specs(tiny: bool) -> dict[str, Spec]:
    image = 64 if tiny else 224
    hidden = 64 if tiny else 768
    return {
        "resnet50": Spec(
            "resnet50",
            _resnet50,
            [("INPUT__0", "TYPE_FP32", [3, image, image])],
            [("OUTPUT__0", "TYPE_FP32", [10 if tiny else 1000])],
            lambda n: (torch.randn(n, 3, image, image),),
            128,
        ),
        "bert_base": Spec(
            "bert_base",
            _BertPooled,
            [("INPUT__0", "TYPE_INT64", [SEQ]), ("INPUT__1", "TYPE_INT64", [SEQ])],
            [("OUTPUT__0", "TYPE_FP32", [hidden])],
            lambda n: (torch.randint(0, 1000, (n, SEQ)), torch.ones(n, SEQ, dtype=torch.int64)),
            64,
        ),
    }


def _config(name: str, platform: str, spec: Spec, device: str) -> str:
    def tensors(items: list[tuple[str, str, list[int]]]) -> str:
        rows = [f'  {{ name: "{n}", data_type: {t}, dims: {d} }}' for n, t, d in items]
        return "[\n" + ",\n".join(rows) + "\n]"

    kind = "KIND_GPU" if device == "gpu" else "KIND_CPU"
    return (
        f'name: "{name}"\nplatform: "{platform}"\nmax_batch_size: {spec.max_batch_size}\n'
        f"input {tensors(spec.inputs)}\noutput {tensors(spec.outputs)}\n"
        "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
        f"instance_group [ {{ count: 1, kind: {kind} }} ]\n"
    )


def write(out: Path, spec: Spec, formats: list[str], device: str, tiny: bool) -> list[Path]:
    torch.manual_seed(0)
    module: Any = spec.build(tiny).eval()
    example = spec.example(2)
    written = []
    with torch.no_grad():
        if "torchscript" in formats:
            target = out / f"{spec.name}_torchscript"
            (target / "1").mkdir(parents=True, exist_ok=True)
            # Trace on the device the model will serve on: tracing bakes tensors created inside
            # forward (e.g. BERT's attention bias) with the tracing device, which map_location
            # does not move.
            where = "cuda" if device == "gpu" and torch.cuda.is_available() else "cpu"
            traced = torch.jit.trace(module.to(where), tuple(t.to(where) for t in example))
            module = module.cpu()
            traced.save(str(target / "1" / "model.pt"))
            (target / "config.pbtxt").write_text(
                _config(target.name, "pytorch_libtorch", spec, device)
            )
            written.append(target)
        if "onnx" in formats:
            target = out / f"{spec.name}_onnx"
            (target / "1").mkdir(parents=True, exist_ok=True)
            names = [n for n, _, _ in spec.inputs]
            outputs = [n for n, _, _ in spec.outputs]
            torch.onnx.export(
                module,
                example,
                str(target / "1" / "model.onnx"),
                input_names=names,
                output_names=outputs,
                dynamic_axes={n: {0: "batch"} for n in names + outputs},
                dynamo=False,
            )
            (target / "config.pbtxt").write_text(
                _config(target.name, "onnxruntime_onnx", spec, device)
            )
            written.append(target)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", default="resnet50,bert_base")
    parser.add_argument("--formats", default="torchscript,onnx")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    table = specs(args.tiny)
    for name in args.models.split(","):
        for path in write(args.out, table[name], args.formats.split(","), args.device, args.tiny):
            print(path)


if __name__ == "__main__":
    main()
