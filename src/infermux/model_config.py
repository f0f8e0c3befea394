"""The one typed, validated model configuration object the rest of infermux reads.

It is built from Triton's ``ModelConfig`` protobuf message (parsed from ``config.pbtxt`` or
``config.yaml`` by :mod:`infermux.repository.config_file`) and keeps that message for the
``/config`` endpoint, so clients such as perf_analyzer see exactly Triton's JSON.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tritonclient.grpc import model_config_pb2 as pb

from infermux.errors import ConfigError
from infermux.protobuf_json import message_to_json_dict

__all__ = [
    "DynamicBatchingConfig",
    "InstanceGroupConfig",
    "ModelConfig",
    "QueuePolicyConfig",
    "TensorConfig",
    "VersionPolicy",
    "check_supported",
    "config_datatype",
    "message_to_json_dict",
    "pb",
]

_TYPE_PREFIX = "TYPE_"


def config_datatype(type_name: str) -> str:
    """Map a config ``TYPE_*`` enum name to its V2 datatype (``TYPE_STRING`` is ``BYTES``)."""
    name = type_name.removeprefix(_TYPE_PREFIX)
    return "BYTES" if name == "STRING" else name


@dataclass(frozen=True, slots=True)
class TensorConfig:
    """An input or output as declared in the config. ``dims`` excludes the batch dimension."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    allow_ragged_batch: bool = False


@dataclass(frozen=True, slots=True)
class InstanceGroupConfig:
    """``instance_group``: ``count`` instances of ``kind`` (KIND_CPU, KIND_GPU, ...) on ``gpus``."""

    name: str
    kind: str
    count: int
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class QueuePolicyConfig:
    """``ModelQueuePolicy``: what happens to requests that wait too long, and the queue's bound.

    ``default_timeout_microseconds`` 0 and ``max_queue_size`` 0 mean unlimited.
    """

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True, slots=True)
class DynamicBatchingConfig:
    """``dynamic_batching`` with Triton's meaning (level 1 is the highest priority)."""

    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicyConfig = QueuePolicyConfig()
    priority_queue_policy: Mapping[int, QueuePolicyConfig] = dataclasses.field(default_factory=dict)

    def policy(self, level: int) -> QueuePolicyConfig:
        """The queue policy of priority ``level``."""
        return self.priority_queue_policy.get(level, self.default_queue_policy)


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """Which of the versions found on disk are served (Triton's ``version_policy``)."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: Sequence[int]) -> list[int]:
        """The versions to serve out of ``available``, ascending."""
        found = sorted(set(available))
        if self.kind == "all":
            return found
        if self.kind == "specific":
            return [v for v in found if v in self.versions]
        return found[-self.num_versions :] if self.num_versions > 0 else []


@dataclass(frozen=True)
class ModelConfig:
    """A validated model configuration. Build it with :meth:`from_proto`."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    version_policy: VersionPolicy
    instance_groups: tuple[InstanceGroupConfig, ...]
    dynamic_batching: DynamicBatchingConfig | None
    parameters: Mapping[str, str]
    default_model_filename: str
    proto: pb.ModelConfig = dataclasses.field(repr=False, compare=False)

    @property
    def decoupled(self) -> bool:
        """``model_transaction_policy { decoupled: true }``: zero or more responses per
        request, then a final flag; served only by backends that implement it."""
        return bool(self.proto.model_transaction_policy.decoupled)

    @property
    def batching(self) -> bool:
        """True when the first dimension of every input/output is a batch dimension."""
        return self.max_batch_size > 0

    def input(self, name: str) -> TensorConfig | None:
        """The input named ``name``, or None."""
        return self._inputs_by_name.get(name)

    def output(self, name: str) -> TensorConfig | None:
        """The output named ``name``, or None."""
        return self._outputs_by_name.get(name)

    # Looked up for every tensor of every request: a dict, not a scan (cached_property writes
    # the instance's __dict__ directly, which a frozen dataclass allows).
    @functools.cached_property
    def _inputs_by_name(self) -> dict[str, TensorConfig]:
        return {t.name: t for t in reversed(self.inputs)}  # the first of a name wins, as before

    @functools.cached_property
    def _outputs_by_name(self) -> dict[str, TensorConfig]:
        return {t.name: t for t in reversed(self.outputs)}

    def full_shape(self, tensor: TensorConfig) -> tuple[int, ...]:
        """The shape a client sees: ``[-1] + dims`` when batching, else ``dims``."""
        return ((-1,) if self.batching else ()) + tensor.dims

    def to_json_dict(self) -> dict[str, Any]:
        """The config as Triton's ``/config`` JSON: snake_case, every field, int64 as numbers."""
        return message_to_json_dict(self.proto)

    @classmethod
    def from_proto(cls, message: pb.ModelConfig, source: str = "") -> ModelConfig:
        """Validate ``message`` and build the typed config; errors name ``source`` and the field."""
        return _build(message, source)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        # Pickled as its protobuf bytes (the generated message class does not pickle by
        # reference): a process-isolated Python model's worker receives its config this way.
        return _from_bytes, (self.proto.SerializeToString(),)


def check_supported(config: ModelConfig, source: str = "") -> None:
    """Refuse a config that asks for what infermux does not do yet, naming the field.

    Each of these fields changes what a model means (how requests reach it, what it answers):
    served without it, the model would run and answer otherwise than the config says. So a load
    fails with ``<field> is not supported yet`` rather than ignoring the field. What only tunes
    or describes a model (``optimization``, ``metric_tags``, ``label_filename``, ...) is not
    here. :class:`ModelConfig` itself still parses every field (``/config`` shows them all).
    """
    field = _unsupported_field(config.proto)
    if field is not None:
        raise ConfigError(source, field, f"{field} is not supported yet")


def _unsupported_field(message: pb.ModelConfig) -> str | None:
    if message.platform == "ensemble" or message.HasField("ensemble_scheduling"):
        return "ensemble_scheduling"
    if message.HasField("sequence_batching"):
        return "sequence_batching"
    if message.response_cache.enable:
        return "response_cache"
    for i, group in enumerate(message.instance_group):
        if group.HasField("rate_limiter"):
            return f"instance_group[{i}].rate_limiter"
        if group.passive:
            return f"instance_group[{i}].passive"
    for kind, tensors in (("input", message.input), ("output", message.output)):
        for i, tensor in enumerate(tensors):
            if kind == "input" and tensor.allow_ragged_batch:
                return f"input[{i}].allow_ragged_batch"
            if tensor.is_shape_tensor:
                return f"{kind}[{i}].is_shape_tensor"
    if message.batch_input:
        return "batch_input"
    if message.batch_output:
        return "batch_output"
    if message.model_repository_agents.agents:
        return "model_repository_agents"
    return None


def _from_bytes(data: bytes) -> ModelConfig:
    return ModelConfig.from_proto(pb.ModelConfig.FromString(data))


def _build(parsed: pb.ModelConfig, source: str) -> ModelConfig:
    def fail(field: str, problem: str) -> ConfigError:
        return ConfigError(source, field, problem)

    message = pb.ModelConfig()
    message.CopyFrom(parsed)

    if not message.name:
        raise fail("name", "must not be empty")
    if message.max_batch_size < 0:
        raise fail("max_batch_size", f"must be >= 0, got {message.max_batch_size}")

    inputs = tuple(
        _tensor(t, f"input[{i}]", fail, allow_optional=True) for i, t in enumerate(message.input)
    )
    outputs = tuple(
        _tensor(t, f"output[{i}]", fail, allow_optional=False) for i, t in enumerate(message.output)
    )
    for kind, tensors in (("input", inputs), ("output", outputs)):
        seen: set[str] = set()
        for i, tensor in enumerate(tensors):
            if tensor.name in seen:
                raise fail(f"{kind}[{i}].name", f"duplicate {kind} name '{tensor.name}'")
            seen.add(tensor.name)

    dynamic: DynamicBatchingConfig | None = None
    if message.HasField("dynamic_batching"):
        dynamic = _dynamic_batching(message.dynamic_batching, message.max_batch_size, fail)

    # Filled in as Triton completes a config, so that /config shows what is really served.
    if not message.instance_group:
        message.instance_group.add()
    groups = []
    for i, group in enumerate(message.instance_group):
        if group.count < 0:
            raise fail(f"instance_group[{i}].count", f"must be >= 1, got {group.count}")
        if any(g < 0 for g in group.gpus):
            raise fail(f"instance_group[{i}].gpus", "GPU ids must be >= 0")
        group.name = group.name or f"{message.name}_{i}"
        group.count = group.count or 1
        if group.kind == pb.ModelInstanceGroup.KIND_AUTO:
            group.kind = (
                pb.ModelInstanceGroup.KIND_GPU if group.gpus else pb.ModelInstanceGroup.KIND_CPU
            )
        groups.append(
            InstanceGroupConfig(
                name=group.name,
                kind=pb.ModelInstanceGroup.Kind.Name(group.kind),
                count=group.count,
                gpus=tuple(group.gpus),
            )
        )

    parameters: dict[str, str] = {}
    for key, value in message.parameters.items():
        parameters[key] = value.string_value

    return ModelConfig(
        name=message.name,
        platform=message.platform,
        backend=message.backend,
        max_batch_size=message.max_batch_size,
        inputs=inputs,
        outputs=outputs,
        version_policy=_version_policy(message, fail),
        instance_groups=tuple(groups),
        dynamic_batching=dynamic,
        parameters=parameters,
        default_model_filename=message.default_model_filename,
        proto=message,
    )


def _tensor(
    t: pb.ModelInput | pb.ModelOutput,
    field: str,
    fail: Any,
    *,
    allow_optional: bool,
) -> TensorConfig:
    if not t.name:
        raise fail(f"{field}.name", "must not be empty")
    where = f"{field} '{t.name}'"
    if t.data_type == pb.TYPE_INVALID:
        raise fail(f"{where}.data_type", "must be set to a TYPE_* value")
    dims = tuple(int(d) for d in t.dims)
    if not dims:
        raise fail(f"{where}.dims", "must have at least one dimension")
    if any(d == 0 or d < -1 for d in dims):
        raise fail(f"{where}.dims", f"each dim must be > 0 or -1, got {list(dims)}")
    reshape = tuple(int(d) for d in t.reshape.shape) if t.HasField("reshape") else None
    return TensorConfig(
        name=t.name,
        datatype=config_datatype(pb.DataType.Name(t.data_type)),
        dims=dims,
        optional=bool(getattr(t, "optional", False)) if allow_optional else False,
        reshape=reshape,
        allow_ragged_batch=bool(getattr(t, "allow_ragged_batch", False)),
    )


def _dynamic_batching(
    db: pb.ModelDynamicBatching, max_batch_size: int, fail: Any
) -> DynamicBatchingConfig:
    if max_batch_size == 0:
        raise fail("dynamic_batching", "requires max_batch_size > 0")
    for size in db.preferred_batch_size:
        if size <= 0 or size > max_batch_size:
            raise fail(
                "dynamic_batching.preferred_batch_size",
                f"{size} must be in [1, max_batch_size={max_batch_size}]",
            )
    if db.priority_levels and not 1 <= db.default_priority_level <= db.priority_levels:
        raise fail(
            "dynamic_batching.default_priority_level",
            f"{db.default_priority_level} must be in [1, priority_levels={db.priority_levels}]",
        )
    per_level = {}
    for level, policy in db.priority_queue_policy.items():
        if not 1 <= level <= db.priority_levels:
            raise fail(
                f"dynamic_batching.priority_queue_policy[{level}]",
                f"priority level must be in [1, priority_levels={db.priority_levels}]",
            )
        per_level[int(level)] = _queue_policy(policy)
    return DynamicBatchingConfig(
        preferred_batch_sizes=tuple(sorted(set(db.preferred_batch_size))),
        max_queue_delay_microseconds=db.max_queue_delay_microseconds,
        preserve_ordering=db.preserve_ordering,
        priority_levels=db.priority_levels,
        default_priority_level=db.default_priority_level,
        default_queue_policy=_queue_policy(db.default_queue_policy),
        priority_queue_policy=per_level,
    )


def _queue_policy(policy: pb.ModelQueuePolicy) -> QueuePolicyConfig:
    return QueuePolicyConfig(
        timeout_action="DELAY" if policy.timeout_action == pb.ModelQueuePolicy.DELAY else "REJECT",
        default_timeout_microseconds=policy.default_timeout_microseconds,
        allow_timeout_override=policy.allow_timeout_override,
        max_queue_size=policy.max_queue_size,
    )


def _version_policy(message: pb.ModelConfig, fail: Any) -> VersionPolicy:
    if not message.HasField("version_policy"):
        message.version_policy.latest.num_versions = 1  # Triton's default, made explicit
        return VersionPolicy()
    policy = message.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return VersionPolicy(kind="all")
    if choice == "specific":
        versions = tuple(int(v) for v in policy.specific.versions)
        if not versions or any(v <= 0 for v in versions):
            raise fail("version_policy.specific.versions", "must list positive version numbers")
        return VersionPolicy(kind="specific", versions=versions)
    num = policy.latest.num_versions if choice == "latest" else 1
    if num == 0:
        raise fail("version_policy.latest.num_versions", "must be >= 1")
    return VersionPolicy(kind="latest", num_versions=num)
