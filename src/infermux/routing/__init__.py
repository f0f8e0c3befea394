"""Version routing: which served version answers a request (pinned, canary weights, sticky keys)
and which one shadows it; the traffic policies that say so, and the admin operations on them."""

from infermux.routing.router import (
    ROUTING_KEY_HEADER,
    ROUTING_KEY_PARAMETER,
    Router,
    TrafficReport,
)
from infermux.routing.shadow import ShadowStats
from infermux.traffic_policy import CONFIG_PARAMETER, ShadowPolicy, TrafficPolicy, parse_policy

__all__ = [
    "CONFIG_PARAMETER",
    "ROUTING_KEY_HEADER",
    "ROUTING_KEY_PARAMETER",
    "Router",
    "ShadowPolicy",
    "ShadowStats",
    "TrafficPolicy",
    "TrafficReport",
    "parse_policy",
]
