"""The peers' second model: a small MLP, 64 -> 256 -> 256 -> 10 with ReLU, FP32, fixed seed,
saved once as TorchScript so that every server loads the very same file and runs it with
torch on the CPU. V2 names follow Triton's libtorch convention (``INPUT__0`` / ``OUTPUT__0``);
servers with their own JSON take ``{"x": [64 floats]}`` and answer ``{"y": [10 floats]}``.

Run by ``run.py`` in the project's venv (torch is a test extra); the servers import nothing from
here, only the saved file."""

from __future__ import annotations

from pathlib import Path

FEATURES = 64
CLASSES = 10
MAX_BATCH = 32

CONFIG = f"""# Written by benchmarks/peers/mlp.py: the peers' small MLP.
name: "mlp"
platform: "pytorch_libtorch"
max_batch_size: {MAX_BATCH}
input [ {{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ {FEATURES} ] }} ]
output [ {{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ {CLASSES} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 500 }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""


def build(path: Path) -> Path:
    """Write the TorchScript MLP to ``path`` (seeded: the same weights on every run)."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, CLASSES),
    ).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(net).save(str(path))
    return path


def infermux_repository(folder: Path, simple: Path) -> Path:
    """A model repository with the example ``simple`` and the MLP, for ``infermux serve``."""
    import shutil

    shutil.copytree(simple, folder / "simple", dirs_exist_ok=True)
    build(folder / "mlp" / "1" / "model.pt")
    (folder / "mlp" / "config.pbtxt").write_text(CONFIG)
    return folder
