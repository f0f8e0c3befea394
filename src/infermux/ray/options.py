"""How one model becomes a Ray Serve deployment: replicas, resources, autoscaling, backpressure.

Pure functions of the model's config (no Ray import), so that CI checks them without a cluster.
A replica holds every instance of the model's ``instance_group`` on its node, so its resources
are what those instances need: one CPU per CPU instance and one GPU per distinct GPU (a
``KIND_GPU`` group without ``gpus`` means one GPU per replica; Ray makes it the replica's GPU 0).
Model ``parameters`` override (``docs/scale-out.md``):

=============================  ================================================================
``ray_num_replicas``           fixed replica count (default 1), or ``auto`` for autoscaling
``ray_min_replicas`` / ``max``  autoscaling bounds (either turns autoscaling on)
``ray_target_ongoing_requests``  autoscaling target: requests queued or running per replica
``ray_max_ongoing_requests``   requests a replica takes at once (default: what its batcher can
                               hold: max_batch_size x instances x 2, at least 8)
``ray_max_queued_requests``    requests waiting for a replica beyond that; more get 503
                               (default -1: unbounded, as Ray)
``ray_num_cpus`` / ``ray_num_gpus``  a replica's resources, overriding the instance groups'
``ray_resources``              extra custom resources, ``name=amount[,name=amount]``
=============================  ================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infermux.errors import ConfigError
from infermux.model_config import ModelConfig

PREFIX = "ray_"
KNOWN = {
    "ray_num_replicas",
    "ray_min_replicas",
    "ray_max_replicas",
    "ray_target_ongoing_requests",
    "ray_max_ongoing_requests",
    "ray_max_queued_requests",
    "ray_num_cpus",
    "ray_num_gpus",
    "ray_resources",
}


@dataclass(frozen=True)
class DeploymentOptions:
    """Keyword arguments for ``serve.deployment(...)``, as plain values."""

    num_replicas: int | None = 1
    autoscaling: dict[str, Any] | None = None
    max_ongoing_requests: int = 8
    max_queued_requests: int = -1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)

    def as_kwargs(self) -> dict[str, Any]:
        actor: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            actor["resources"] = dict(self.resources)
        kwargs: dict[str, Any] = {
            "ray_actor_options": actor,
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": self.max_queued_requests,
        }
        if self.autoscaling is not None:
            kwargs["autoscaling_config"] = dict(self.autoscaling)
        else:
            kwargs["num_replicas"] = self.num_replicas
        return kwargs


FRACTIONAL = {"ray_num_cpus", "ray_num_gpus", "ray_target_ongoing_requests"}


def deployment_options(config: ModelConfig) -> DeploymentOptions:
    """The deployment of ``config``; raises ConfigError naming a bad ``ray_*`` parameter."""
    params = {k: v.strip() for k, v in config.parameters.items() if k.startswith(PREFIX)}
    source = f"model '{config.name}'"
    for key in params:
        if key not in KNOWN:
            known = ", ".join(sorted(KNOWN))
            raise ConfigError(source, f"parameters.{key}", f"unknown Ray setting ({known})")

    def number(key: str, default: float, minimum: float) -> float:
        return _number(source, key, params.get(key), default, minimum)

    cpus, gpus, instances = _instance_resources(config)
    ongoing = int(
        number("ray_max_ongoing_requests", max(8, config.max_batch_size * instances * 2), 1)
    )
    options: dict[str, Any] = {
        "num_cpus": number("ray_num_cpus", cpus, 0),
        "num_gpus": number("ray_num_gpus", gpus, 0),
        "max_ongoing_requests": ongoing,
        "max_queued_requests": int(number("ray_max_queued_requests", -1, -1)),
        "resources": _resources(source, params.get("ray_resources", "")),
    }
    replicas = params.get("ray_num_replicas", "1")
    if replicas == "auto" or {"ray_min_replicas", "ray_max_replicas"} & params.keys():
        low = int(number("ray_min_replicas", 1, 0))
        high = int(number("ray_max_replicas", max(low, 1) * 4, 1))
        if high < low:
            raise ConfigError(source, "parameters.ray_max_replicas", f"is below {low}, the minimum")
        options["autoscaling"] = {
            "min_replicas": low,
            "max_replicas": high,
            "target_ongoing_requests": number("ray_target_ongoing_requests", ongoing / 2, 0.001),
        }
        options["num_replicas"] = None
    else:
        options["num_replicas"] = int(number("ray_num_replicas", 1, 1))
    return DeploymentOptions(**options)


def _instance_resources(config: ModelConfig) -> tuple[int, int, int]:
    """(CPUs, GPUs, instances) the model's instance groups ask for on one replica."""
    if not config.instance_groups:
        return 1, 0, 1
    cpus = instances = 0
    devices: set[int] = set()
    any_gpu = False
    for group in config.instance_groups:
        count = max(1, group.count)
        if group.kind == "KIND_GPU":
            any_gpu = True
            devices.update(group.gpus)
            instances += count * max(1, len(group.gpus))
        else:
            cpus += count
            instances += count
    return cpus, (max(1, len(devices)) if any_gpu else 0), max(1, instances)


def _number(source: str, key: str, raw: str | None, default: float, minimum: float) -> float:
    if raw is None:
        return default
    field = f"parameters.{key}"
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(source, field, f"must be a number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(source, field, f"must be >= {minimum:g}, got {raw!r}")
    if key not in FRACTIONAL and not value.is_integer():
        raise ConfigError(source, field, f"must be a whole number, got {raw!r}")
    return value


def _resources(source: str, raw: str) -> dict[str, float]:
    resources: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, amount = (part.strip() for part in item.partition("="))
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        if not name or not value >= 0:
            problem = f"expected name=amount[,name=amount], got {item!r}"
            raise ConfigError(source, "parameters.ray_resources", problem)
        resources[name] = value
    return resources
