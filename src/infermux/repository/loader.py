"""Builds one served model version: instances per instance group, warm-up, scheduler, statistics."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from infermux.backends import stacking
from infermux.backends.base import BackendInstance, ModelContext
from infermux.backends.outputs import to_output_tensors
from infermux.backends.registry import BackendRegistry
from infermux.model_config import ModelConfig
from infermux.repository.placement import ONLY, Placement, Shard, placements
from infermux.repository.warmup import warm_up
from infermux.runtime.memory import describe, instance_memory, total_by_device
from infermux.scheduling import DynamicBatcher, Scheduler
from infermux.statistics import ModelStatistics

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    """One served model version."""

    config: ModelConfig
    version: int
    scheduler: Scheduler
    stats: ModelStatistics
    accepts_device_inputs: bool = False
    """Its backend reads inputs in GPU memory in place (CUDA shared memory)."""
    instances: Sequence[BackendInstance] = ()
    """In the order of ``stats.instances`` (what each holds in memory feeds the metrics)."""

    @property
    def name(self) -> str:
        return self.config.name


async def build_version(
    registry: BackendRegistry,
    config: ModelConfig,
    path: Path,
    version: int,
    *,
    histograms: bool = False,
    shard: Shard = ONLY,
) -> LoadedModel:
    """Create, warm up and schedule the instances of ``version`` that ``shard`` holds (every
    instance with one executor); raises the load error. ``histograms``: keep the latency
    histograms the metrics publish."""
    backend = registry.get(config)
    mine = placements(config, shard)
    instances = await asyncio.to_thread(
        _create_instances, backend.load, config, path, version, mine
    )
    uses = instance_memory(instances)
    if uses:
        logger.info("model '%s' version %d memory: %s", config.name, version, describe(uses))
    stats = ModelStatistics(
        config.name,
        version,
        memory=lambda: total_by_device(instance_memory(instances)),
        instances=[p.name for p in mine],
        histograms=histograms,
    )
    scheduler = DynamicBatcher(
        f"{config.name}_v{version}",
        instances,
        finish=functools.partial(to_output_tensors, config),
        batching=config.dynamic_batching,
        max_batch_size=config.max_batch_size,
        compatible=stacking.compatible if backend.stacks_inputs else None,
        stats=stats,
    )
    device_inputs = bool(getattr(backend, "accepts_device_inputs", False))
    return LoadedModel(config, version, scheduler, stats, device_inputs, instances)


def _create_instances(
    load: Callable[[ModelContext], BackendInstance],
    config: ModelConfig,
    path: Path,
    version: int,
    mine: list[Placement],
) -> list[BackendInstance]:
    instances: list[BackendInstance] = []
    try:
        for placement in mine:
            context = ModelContext(
                config=config,
                version=version,
                model_path=path,
                version_path=path / str(version),
                instance_name=placement.name,
                device=placement.device,
            )
            instances.append(load(context))
            warm_up(config, path, instances[-1])  # READY only after every instance warmed up
    except BaseException:
        for instance in instances:
            instance.close()
        raise
    return instances
