"""A model's traffic policy: how requests that name no version are spread over its versions.

Written as JSON, in the model's config (``parameters { key: "traffic_policy" value:
{ string_value: "..." } }``) or through the admin API (``POST /v2/models/{name}/traffic``)::

    {"weights": {"1": 90, "2": 10},          # canary: share of requests per served version
     "sticky_key": "user_id",                # keep one key on one version (consistent hashing)
     "shadow": {"version": 3, "fraction": 0.5,   # mirror half the requests to version 3
                "atol": 1e-5, "rtol": 1e-5,      # and compare its answers within tolerances
                "outputs": {"OUTPUT0": {"atol": 0.01, "rtol": 0}}}}

Every field is optional; an empty policy routes to the highest served version, as without one.
Errors name the field (``traffic policy field 'weights.2': ...``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from infermux.errors import InvalidArgumentError

CONFIG_PARAMETER = "traffic_policy"
"""The model config parameter that holds a model's policy."""

DEFAULT_TOLERANCE = 1e-5


class Tolerance(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``|candidate - primary| <= atol + rtol * |primary|`` elementwise (numpy's allclose)."""

    atol: float = DEFAULT_TOLERANCE
    rtol: float = DEFAULT_TOLERANCE


class ShadowPolicy(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Mirror ``fraction`` of the routed requests to ``version``, whose answers are compared with
    the primary's and counted, never returned."""

    version: int
    fraction: float = 1.0
    atol: float = DEFAULT_TOLERANCE
    rtol: float = DEFAULT_TOLERANCE
    outputs: dict[str, Tolerance] = {}

    def tolerance(self, output: str) -> Tolerance:
        return self.outputs.get(output) or Tolerance(self.atol, self.rtol)


class TrafficPolicy(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    weights: dict[int, float] = {}
    sticky_key: str = ""
    shadow: ShadowPolicy | None = None

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = msgspec.to_builtins(self, str_keys=True)
        return result


EMPTY = TrafficPolicy()


def parse_policy(document: str | bytes | Mapping[str, Any]) -> TrafficPolicy:
    """A validated policy from JSON text or a decoded JSON object; InvalidArgumentError naming
    the field otherwise."""
    try:
        if isinstance(document, (str, bytes)):
            policy = msgspec.json.decode(document, type=TrafficPolicy, strict=False)
        else:
            policy = msgspec.convert(dict(document), TrafficPolicy, strict=False)
    except msgspec.ValidationError as exc:
        raise InvalidArgumentError(f"traffic policy: {_where(str(exc))}") from None
    except msgspec.DecodeError as exc:
        raise InvalidArgumentError(f"traffic policy is not valid JSON: {exc}") from None
    for version, weight in policy.weights.items():
        if version < 1:
            raise InvalidArgumentError(f"traffic policy field 'weights.{version}': not a version")
        if not math.isfinite(weight) or weight < 0:
            raise InvalidArgumentError(
                f"traffic policy field 'weights.{version}': must be a finite weight >= 0"
            )
    if policy.weights and not any(policy.weights.values()):
        raise InvalidArgumentError("traffic policy field 'weights': every weight is 0")
    shadow = policy.shadow
    if shadow is not None:
        if shadow.version < 1:
            raise InvalidArgumentError("traffic policy field 'shadow.version': not a version")
        if not 0 <= shadow.fraction <= 1:
            raise InvalidArgumentError(
                "traffic policy field 'shadow.fraction': must be between 0 and 1"
            )
        tolerances = [("shadow", Tolerance(shadow.atol, shadow.rtol))]
        tolerances += [(f"shadow.outputs.{k}", t) for k, t in shadow.outputs.items()]
        for field, tolerance in tolerances:
            if not (tolerance.atol >= 0 and tolerance.rtol >= 0):
                raise InvalidArgumentError(
                    f"traffic policy field '{field}': atol and rtol must be >= 0"
                )
    return policy


def _where(message: str) -> str:
    # msgspec: "Expected `float`, got `str` - at `$.weights[...]`": name the field first.
    text, _, path = message.partition(" - at `$.")
    if not path:
        return message
    field = path.rstrip("`").replace("[", ".").replace("]", "")
    return f"field '{field}': {text}"
