"""What the benchmark serves, torch-free: tensor names, shapes and dtypes, and the fixed inputs.

The orchestrator, the load-generator processes and the peer servers import this module; only the
exporter (``models.py``) and the raw measurement (``raw.py``) import torch, so no process that does
not run the model ever creates a CUDA context.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

MODELS = ("resnet50", "bert")
SEQ = 128
SEED = 0
_V2 = {"uint8": "UINT8", "int64": "INT64", "float16": "FP16", "float32": "FP32"}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor without its batch dimension, named as Triton's libtorch backend expects."""

    name: str
    dtype: str  # numpy dtype name
    dims: tuple[int, ...]

    @property
    def datatype(self) -> str:
        """The KServe V2 datatype (``UINT8``, ``FP16``, ...)."""
        return _V2[self.dtype]

    @property
    def config_type(self) -> str:
        """The ``config.pbtxt`` data type (``TYPE_UINT8``, ...)."""
        return f"TYPE_{self.datatype}"

    @property
    def item_bytes(self) -> int:
        """Bytes of one batch item."""
        return int(np.prod(self.dims)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    inputs: tuple[TensorSpec, ...]
    output: TensorSpec
    max_batch_size: int


def model_spec(name: str, tiny: bool) -> ModelSpec:
    """The served signature; ``tiny`` keeps the wire format and shrinks only the network."""
    if name == "resnet50":
        side = 64 if tiny else 224
        net = "ResNet-18 at 64x64" if tiny else "ResNet-50 at 224x224"
        return ModelSpec(
            name,
            f"{net}, uint8 HWC in (normalised on the device), FP16 logits out",
            (TensorSpec("INPUT__0", "uint8", (side, side, 3)),),
            TensorSpec("OUTPUT__0", "float16", (1000,)),
            128,
        )
    if name == "bert":
        hidden = 64 if tiny else 768
        net = "BERT 2 layers, hidden 64" if tiny else "BERT-base"
        return ModelSpec(
            name,
            f"{net}, seq {SEQ}, INT64 ids + mask in, FP16 pooled [CLS] out",
            (TensorSpec("INPUT__0", "int64", (SEQ,)), TensorSpec("INPUT__1", "int64", (SEQ,))),
            TensorSpec("OUTPUT__0", "float16", (hidden,)),
            64,
        )
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def graphs_line(batch_sizes: tuple[int, ...] = ()) -> str:
    """The config's CUDA graph line: infermux's own buckets, or exactly ``batch_sizes``
    (``graph_spec``; e.g. the powers of two of infermux before its padding sizes)."""
    if not batch_sizes:
        return "optimization { cuda { graphs: true } }\n"
    spec_text = ", ".join(f"{{ batch_size: {b} }}" for b in batch_sizes)
    return f"optimization {{ cuda {{ graphs: true graph_spec [ {spec_text} ] }} }}\n"


def with_graphs(config_text: str, batch_sizes: tuple[int, ...] = ()) -> str:
    """``config_text`` (as ``models.config_text`` writes it) with its CUDA graph line
    replaced: a run's bucket variants share one export."""
    kept = [
        line
        for line in config_text.splitlines(keepends=True)
        if not line.startswith("optimization {")
    ]
    return "".join(kept) + graphs_line(batch_sizes)


def reference_inputs(spec: ModelSpec) -> dict[str, npt.NDArray[np.generic]]:
    """One batch-1 request, fixed seed: every client sends it, so every answer can be checked."""
    rng = np.random.default_rng(SEED)
    if spec.name == "resnet50":
        image = rng.integers(0, 256, size=(1, *spec.inputs[0].dims), dtype=np.uint8)
        return {spec.inputs[0].name: image}
    ids = rng.integers(1000, 30000, size=(1, SEQ), dtype=np.int64)
    ids[0, 0] = 101  # [CLS]
    # A realistic request is padded: 100 real tokens, 28 masked ones.
    mask = np.zeros((1, SEQ), dtype=np.int64)
    mask[0, :100] = 1
    return {spec.inputs[0].name: ids, spec.inputs[1].name: mask}


def reference_path(ref_dir: Path, model: str) -> Path:
    """Where ``raw.py`` leaves the reference input and the model's output for it."""
    return ref_dir / f"{model}.npz"


def load_reference(
    ref_dir: Path, spec: ModelSpec
) -> tuple[dict[str, npt.NDArray[np.generic]], npt.NDArray[np.float16]]:
    with np.load(reference_path(ref_dir, spec.name)) as data:
        inputs = {t.name: data[t.name] for t in spec.inputs}
        output = data[spec.output.name].astype(np.float16)
    return inputs, output


def output_error(got: npt.NDArray[np.generic], expected: npt.NDArray[np.generic]) -> float:
    """Largest absolute difference relative to the reference's largest magnitude.

    The servers run the model at whatever batch size they formed, and FP16 kernels differ by batch
    size, so an exact match is not expected; a scale-relative error of a few 1e-3 is.
    """
    a = got.astype(np.float32).reshape(-1)
    b = expected.astype(np.float32).reshape(-1)
    if a.shape != b.shape or not np.all(np.isfinite(a)):
        return float("inf")
    scale = max(1.0, float(np.max(np.abs(b))))
    return float(np.max(np.abs(a - b))) / scale


TOLERANCE = 2e-2  # output_error above this is a wrong answer
