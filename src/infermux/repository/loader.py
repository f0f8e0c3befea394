"""Builds one served model version: instances per instance group, warm-up, scheduler, statistics."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infermux.backends import stacking
from infermux.backends.base import BackendInstance, ModelContext
from infermux.backends.paths import model_path_of
from infermux.backends.precision import CALIBRATION_DATA
from infermux.backends.registry import BackendRegistry
from infermux.backends.server_calls import ServerCalls
from infermux.errors import ModelLoadError
from infermux.model_config import ModelConfig
from infermux.observability.statistics import ModelStatistics
from infermux.repository.placement import ONLY, Placement, Shard, placements
from infermux.repository.warmup import warm_up
from infermux.runtime import garbage
from infermux.runtime.memory import describe, instance_memory, total_by_device
from infermux.scheduling import DynamicBatcher, Scheduler

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
    stacks_inputs: bool = False
    """Its backend runs one kernel over the stacked batch (so requests sent stacked together
    are, to it, the same as requests it stacked itself)."""
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Output name -> its ``label_filename``'s lines (classification, Triton's extension)."""

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
    execution_timeout_ms: int = 0,
    server: ServerCalls | None = None,
) -> LoadedModel:
    """Create, warm up and schedule the instances of ``version`` that ``shard`` holds (every
    instance with one executor); raises the load error. ``histograms``: keep the latency
    histograms the metrics publish. ``execution_timeout_ms``: the server's bound on one
    ``execute`` (0: none), which the model's ``execution_timeout_ms`` parameter overrides.
    ``server``: what the instances call the server through (BLS; None: they cannot)."""
    backend = registry.get(config)
    if config.decoupled and not getattr(backend, "decoupled", False):
        raise ModelLoadError(
            f"model '{config.name}': model_transaction_policy.decoupled is not supported by "
            f"the '{backend.name}' backend (only Python models answer decoupled)"
        )
    timeout_ms = execution_timeout(config, execution_timeout_ms)
    labels = await asyncio.to_thread(read_labels, config, path)
    mine = placements(config, shard)
    makers = instance_makers(backend.load, config, path, version, mine, server=server)
    instances = await asyncio.to_thread(_create_instances, makers)
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
    scheduler = DynamicBatcher.for_model(
        config,
        f"{config.name}_v{version}",
        instances,
        compatible=stacking.compatible if backend.stacks_inputs else None,
        stats=stats,
        execution_timeout_s=timeout_ms / 1000 if timeout_ms else None,
        reloads=makers,
        replaced=instances.__setitem__,  # the memory reading above sees replacements
    )
    device_inputs = bool(getattr(backend, "accepts_device_inputs", False))
    return LoadedModel(
        config, version, scheduler, stats, device_inputs, instances, backend.stacks_inputs, labels
    )


def read_labels(config: ModelConfig, model_dir: Path) -> dict[str, tuple[str, ...]]:
    """Each output's labels, one per line of its ``label_filename`` (in the model directory).
    Raises ModelLoadError naming the field when a file cannot be read, as Triton fails such a
    load."""
    labels: dict[str, tuple[str, ...]] = {}
    for output in config.proto.output:
        if not output.label_filename:
            continue
        field_name = f"output '{output.name}' label_filename"
        where = f"model '{config.name}'"
        path = model_path_of(model_dir, model_dir, output.label_filename, field_name, where=where)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(
                f"{where}: {field_name} {output.label_filename!r} cannot be read: {exc}"
            ) from None
        labels[output.name] = tuple(text.splitlines())
    return labels


def check_config_paths(config: ModelConfig, path: Path, versions: Sequence[int]) -> None:
    """Refuse a config naming a file outside the model directory ``path``, naming the field,
    before any backend runs. Where a file is opened it is checked again by the same helper;
    this catches the fields nothing opens yet (``label_filename``) and fails the whole load
    once, in the same words, rather than once per version and instance."""
    where = f"model '{config.name}'"
    checks: list[tuple[Path, str, str]] = []
    if config.default_model_filename:
        checks += [
            (path / str(v), config.default_model_filename, "default_model_filename")
            for v in versions
        ]
    checks += [
        (path, t.label_filename, f"output '{t.name}' label_filename")
        for t in config.proto.output
        if t.label_filename
    ]
    if config.parameters.get(CALIBRATION_DATA, "").strip():
        checks.append((path, config.parameters[CALIBRATION_DATA].strip(), CALIBRATION_DATA))
    for index, sample in enumerate(config.proto.model_warmup):
        for name, spec in sample.inputs.items():
            if spec.WhichOneof("input_data_type") == "input_data_file":
                label = sample.name or f"#{index}"  # as warm_up names it
                field = f"warm-up sample '{label}' input '{name}': input_data_file"
                checks.append((path / "warmup", spec.input_data_file, field))
    for base, value, field in checks:
        model_path_of(path, base, value, field, where=where)


EXECUTION_TIMEOUT_PARAMETER = "execution_timeout_ms"


def execution_timeout(config: ModelConfig, default_ms: int) -> int:
    """The model's bound on one ``execute`` in ms (0: none): its ``execution_timeout_ms``
    parameter, else the server's ``--execution-timeout-ms``. Raises ModelLoadError naming the
    parameter when it is not a whole number of milliseconds."""
    raw = config.parameters.get(EXECUTION_TIMEOUT_PARAMETER)
    if raw is None or raw == "":
        return default_ms
    if not raw.strip().isdigit():
        raise ModelLoadError(
            f"model '{config.name}': parameters.{EXECUTION_TIMEOUT_PARAMETER} must be a "
            f"whole number of milliseconds (0: no timeout), got {raw!r}"
        )
    return int(raw)


def instance_makers(
    load: Callable[[ModelContext], BackendInstance],
    config: ModelConfig,
    path: Path,
    version: int,
    mine: Sequence[Placement],
    *,
    server: ServerCalls | None = None,
) -> list[Callable[[], BackendInstance]]:
    """One blocking maker per placement: loads and warms up that instance (again, to replace
    one that overran the execution timeout)."""
    return [
        functools.partial(_create_one, load, config, path, version, p, server=server) for p in mine
    ]


def _create_one(
    load: Callable[[ModelContext], BackendInstance],
    config: ModelConfig,
    path: Path,
    version: int,
    placement: Placement,
    *,
    server: ServerCalls | None,
) -> BackendInstance:
    context = ModelContext(
        config=config,
        version=version,
        model_path=path,
        version_path=path / str(version),
        instance_name=placement.name,
        device=placement.device,
        server=server,
    )
    instance = load(context)
    try:
        warm_up(config, path, instance)  # READY only after every instance warmed up
    except BaseException:
        instance.close()
        raise
    return instance


def _create_instances(makers: Sequence[Callable[[], BackendInstance]]) -> list[BackendInstance]:
    instances: list[BackendInstance] = []
    try:
        for make in makers:
            instances.append(make())
    except BaseException:
        for instance in instances:
            instance.close()
        raise
    return instances


async def retire(models: list[LoadedModel]) -> None:
    """Close ``models`` (emptying the list: the repository's last references to them) and
    collect the garbage they leave. A model's objects often sit in reference cycles (a
    module's classes and functions, torch modules, a model keeping itself in a callback),
    which refcounting alone never frees: without a collection here an unloaded model's
    memory waits for the next automatic one, which allocation-light serving may not trigger
    for a long time. What a model keeps reachable itself (module globals, caches in the
    libraries it used) stays: see docs/reliability.md."""
    if not models:
        return
    await asyncio.gather(*(m.scheduler.close() for m in models))
    names = [(m.name, m.version) for m in models]
    models.clear()
    # Off the loop: gc holds the GIL, but finalizers that free device memory or close files
    # release it, and the loop then keeps serving.
    found = await asyncio.to_thread(garbage.collect)  # frozen objects too
    for name, version in names:
        logger.info("unloaded model '%s' version %d", name, version)
    logger.debug("garbage collection after unloading: %d unreachable objects", found)
