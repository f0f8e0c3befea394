"""Where a model version's instances go: devices from the instance groups, and, when the server
runs several executor processes (``--executors N``), which of them each instance belongs to.

Why several executors: one Python process drives one GIL, and at a few thousand requests per
second the executor's own per-request work saturates it long before a GPU is busy (measured on
the H200s, ``docs/benchmarks.md``). Splitting by device keeps each GPU's instances, streams and
weights in one process, so nothing GPU-side crosses processes:

- an instance on GPU ``g`` belongs to executor ``g % N``;
- the ``k``-th CPU instance of the model (in config order) belongs to executor ``k % N``, so a
  Python model with ``count: 4`` gets four GILs' worth of CPU over four executors.

An executor that owns none of a model's instances does not host it; the front ends send each
request to a hosting executor (``dataplane.remote``).
"""

from __future__ import annotations

from dataclasses import dataclass

from infermux.model_config import ModelConfig


@dataclass(frozen=True, slots=True)
class Shard:
    """This executor's position among ``count`` executors (the one-process server is 0 of 1)."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"executor shard {self.index} of {self.count}")


ONLY = Shard()
"""The one executor of a server that runs one."""


@dataclass(frozen=True, slots=True)
class Placement:
    device: str
    """``cpu`` or ``cuda:N``."""
    name: str
    """Unique over the model version, whichever executor holds the instance."""


def visible_gpu_count() -> int:
    """CUDA devices torch sees (``CUDA_VISIBLE_DEVICES`` applied); 0 without torch or CUDA.
    Called only for a KIND_GPU group without ``gpus``, whose backend needs torch anyway."""
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def all_placements(config: ModelConfig, gpu_count: int | None = None) -> list[Placement]:
    """Every instance the instance groups ask for, on every executor. A KIND_GPU group without
    ``gpus`` means one ``count`` on each visible GPU, as in Triton (GPU 0 when none is visible,
    so that the backend's load error says why)."""
    placements = []
    for group in config.instance_groups:  # never empty: the config fills in the default group
        if group.kind != "KIND_GPU":
            devices = ["cpu"]
        elif group.gpus:
            devices = [f"cuda:{g}" for g in group.gpus]
        else:
            count = visible_gpu_count() if gpu_count is None else gpu_count
            devices = [f"cuda:{g}" for g in range(max(1, count))]
        for device in devices:
            for i in range(group.count):
                placements.append(Placement(device, f"{group.name}_{device.replace(':', '')}_{i}"))
    return placements


def placements(
    config: ModelConfig, shard: Shard = ONLY, gpu_count: int | None = None
) -> list[Placement]:
    """The instances executor ``shard`` holds (all of them with one executor)."""
    every = all_placements(config, gpu_count)
    if shard.count == 1:
        return every
    mine = []
    cpu_seen = 0
    for placement in every:
        if placement.device == "cpu":
            owner = cpu_seen % shard.count
            cpu_seen += 1
        else:
            owner = int(placement.device.split(":")[1]) % shard.count
        if owner == shard.index:
            mine.append(placement)
    return mine
