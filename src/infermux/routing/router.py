"""Which served version of a model answers a request: the version it pins, or one picked by the
model's traffic policy (canary weights, sticky keys); and the shadow it mirrors to.

Each model's policy comes from its config (``traffic_policy`` parameter) unless the admin API
set one; an admin policy stays until cleared (``DELETE``), and every change (set, clear,
promote) can be undone by :meth:`Router.rollback`, all effective for the next request.

Sticky keys use weighted rendezvous hashing: each version scores ``w / -ln(u)`` with ``u`` a
hash of (key, version) in (0, 1), and the best score wins. A key's version changes only when
its own winner's standing changes, so moving a weight by a few percent moves about that share
of keys, and removing a version moves only that version's keys.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from infermux.errors import InvalidArgumentError, NotFoundError
from infermux.repository import LoadedModel, ModelRepository
from infermux.routing.policy import (
    CONFIG_PARAMETER,
    EMPTY,
    TrafficPolicy,
    parse_policy,
)
from infermux.types import InferRequest

from .shadow import Mirror, ShadowStats

ROUTING_KEY_PARAMETER = "routing_key"
"""The request parameter holding a sticky key when the policy names none (front ends also put
the ``Infermux-Routing-Key`` header / ``infermux-routing-key`` gRPC metadata here)."""

ROUTING_KEY_HEADER = "infermux-routing-key"
"""The HTTP header and gRPC metadata key front ends copy into :data:`ROUTING_KEY_PARAMETER`."""

HISTORY = 32  # policy changes a model remembers for rollback


class TrafficReport(msgspec.Struct, frozen=True):
    """What ``GET /v2/models/{name}/traffic`` answers."""

    model: str
    source: str  # "config", "admin" or "none"
    policy: dict[str, object]
    served_versions: list[int]
    shadow: dict[str, object] | None
    rollback_depth: int


@dataclass(slots=True)
class _Model:
    override: TrafficPolicy | None = None
    history: list[TrafficPolicy | None] = field(default_factory=list)
    config_text: str = ""  # the config's policy as last parsed (re-parsed when it changes)
    config_policy: TrafficPolicy = EMPTY
    shadows: dict[int, ShadowStats] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Route:
    """The router's one decision for a request."""

    model: LoadedModel  # the version that answers
    policy: TrafficPolicy  # in force for the model (micro-batches refuse weights and shadows)
    shadow: Mirror | None  # where a copy of the request also runs, compared and never answered


class Router:
    """Routes requests of every model of ``repository``."""

    def __init__(self, repository: ModelRepository, *, rng: random.Random | None = None) -> None:
        self._repository = repository
        self._models: dict[str, _Model] = {}
        self._random = (rng or random.Random()).random

    # -- the request path -------------------------------------------------------------------------

    def route(self, request: InferRequest, *, mirror: bool = True) -> Route:
        """Where ``request`` goes: the version that answers it, the policy in force, and the
        shadow it is mirrored to (decided now, once; ``mirror=False``: none is sampled, for a
        caller that refuses policies with a shadow anyway). Raises like ``repository.get``
        when no version can answer."""
        policy = self.policy(request.model_name)
        model = self._version(request, policy)
        shadow = self._shadow(model, policy) if mirror else None
        return Route(model, policy, shadow)

    def _version(self, request: InferRequest, policy: TrafficPolicy) -> LoadedModel:
        name = request.model_name
        if request.model_version:
            return self._repository.get(name, request.model_version)
        if not policy.weights:
            return self._repository.get(name)
        serving = self._repository.serving(name)
        choices = [(v, w) for v, w in sorted(policy.weights.items()) if w > 0 and v in serving]
        if not choices:  # the weighted versions are not served (yet): the default one answers
            return self._repository.get(name)
        key = _sticky_key(request.parameters, policy.sticky_key)
        if key:
            return serving[_rendezvous(key, choices)]
        pick = self._random() * sum(w for _, w in choices)
        for version, weight in choices:
            pick -= weight
            if pick < 0:
                return serving[version]
        return serving[choices[-1][0]]

    def _shadow(self, model: LoadedModel, policy: TrafficPolicy) -> Mirror | None:
        """Where to mirror a request ``model`` answers under ``policy``, or None (no shadow, not
        this time, or the candidate is the primary or is not served)."""
        shadow = policy.shadow
        if shadow is None or shadow.version == model.version:
            return None
        entry = self._models.setdefault(model.name, _Model())
        if shadow.fraction < 1 and self._random() >= shadow.fraction:
            return None
        candidate = self._repository.serving(model.name).get(shadow.version)
        stats = entry.shadows.setdefault(shadow.version, ShadowStats())
        if candidate is None:
            stats.dropped += 1
            return None
        return shadow, candidate, stats

    def policy(self, name: str) -> TrafficPolicy:
        """The policy in force for ``name``: the admin's, else its config's, else none."""
        entry = self._models.get(name)
        if entry is not None and entry.override is not None:
            return entry.override
        text = self._config_text(name)
        if not text:
            return EMPTY
        if entry is None:
            entry = self._models[name] = _Model()
        if entry.config_text != text:  # a (re)loaded config: parse once, not per request
            try:
                entry.config_policy = parse_policy(text)
            except InvalidArgumentError:
                entry.config_policy = EMPTY  # refused at load (see check_config); never here
            entry.config_text = text
        return entry.config_policy

    def _config_text(self, name: str) -> str:
        serving = self._repository.serving(name)
        if not serving:
            return ""
        return serving[max(serving)].config.parameters.get(CONFIG_PARAMETER, "")

    # -- the admin API ----------------------------------------------------------------------------

    def report(self, name: str) -> TrafficReport:
        serving = self._served(name)
        entry = self._models.get(name) or _Model()
        policy = self.policy(name)
        source = "admin" if entry.override is not None else "config" if policy != EMPTY else "none"
        shadow = None
        if policy.shadow is not None:
            stats = entry.shadows.get(policy.shadow.version) or ShadowStats()
            shadow = {"version": policy.shadow.version, **stats.to_json()}
        return TrafficReport(
            name, source, policy.to_json(), sorted(serving), shadow, len(entry.history)
        )

    def set_policy(self, name: str, policy: TrafficPolicy | None) -> None:
        """Put ``policy`` in force for ``name`` (None: back to the config's)."""
        serving = self._served(name)
        if policy is not None:
            wanted = [v for v, w in policy.weights.items() if w > 0]
            if policy.shadow is not None:
                wanted.append(policy.shadow.version)
            missing = sorted({v for v in wanted if v not in serving})
            if missing:
                served = ", ".join(map(str, sorted(serving)))
                raise InvalidArgumentError(
                    f"traffic policy for '{name}' names versions that are not served: "
                    f"{', '.join(map(str, missing))} (served: {served})"
                )
        entry = self._models.setdefault(name, _Model())
        entry.history = [*entry.history, entry.override][-HISTORY:]
        entry.override = policy
        if policy is not None and policy.shadow is not None:
            entry.shadows.pop(policy.shadow.version, None)  # a new experiment counts afresh

    def promote(self, name: str, version: int) -> None:
        """All traffic to ``version`` (sticky key kept, shadow ended), in one step."""
        current = self.policy(name)
        self.set_policy(name, TrafficPolicy(weights={version: 1.0}, sticky_key=current.sticky_key))

    def rollback(self, name: str) -> None:
        """Undo the last :meth:`set_policy` or :meth:`promote` of ``name``."""
        self._served(name)
        entry = self._models.get(name)
        if entry is None or not entry.history:
            raise InvalidArgumentError(f"model '{name}' has no traffic policy change to roll back")
        entry.override = entry.history.pop()

    def shadow_stats(self) -> list[tuple[str, int, ShadowStats]]:
        """(model, candidate version, figures) of every shadow experiment so far."""
        return [
            (name, version, stats)
            for name, entry in sorted(self._models.items())
            for version, stats in sorted(entry.shadows.items())
        ]

    def _served(self, name: str) -> dict[int, LoadedModel]:
        self._repository.get(name)  # raises the precise not-found / unavailable error
        serving = self._repository.serving(name)
        if not serving:
            raise NotFoundError(f"model '{name}' has no served version")
        return serving


def _sticky_key(parameters: Mapping[str, object], name: str) -> str:
    value = parameters.get(name or ROUTING_KEY_PARAMETER)
    if value is None and name:
        value = parameters.get(ROUTING_KEY_PARAMETER)
    return "" if value is None or isinstance(value, bool) else str(value)


def _rendezvous(key: str, choices: list[tuple[int, float]]) -> int:
    best, best_score = choices[0][0], -math.inf
    encoded = key.encode()
    for version, weight in choices:
        digest = hashlib.blake2b(encoded, digest_size=8, salt=version.to_bytes(8, "little"))
        u = (int.from_bytes(digest.digest(), "little") + 0.5) / 2**64  # in (0, 1)
        score = weight / -math.log(u)
        if score > best_score:
            best, best_score = version, score
    return best
