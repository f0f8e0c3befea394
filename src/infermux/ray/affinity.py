"""Replica affinity on a request key: Ray Serve's load-aware choice, unless the request carries a
routing key, in which case the replicas are ranked by rendezvous hashing of (key, replica).

The first-ranked replica takes the key's requests while it has room (``max_ongoing_requests``);
when it is full Ray Serve tries the next rank, so a hot key spills over instead of queueing
behind one replica. Replicas joining or leaving move only the keys whose top replica changed,
the property that keeps a sticky canary (infermux's own router, the same policy on every
replica) and a replica's caches warm for the same clients.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, RunningReplica

KEY_ARGUMENT = "routing_key"  # the keyword the ingress passes to ModelReplica.infer


def rank(key: str, replicas: Iterable[str]) -> list[str]:
    """``replicas`` best first for ``key`` (highest rendezvous score first)."""

    def score(replica: str) -> int:
        digest = hashlib.blake2b(f"{replica}\0{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    return sorted(replicas, key=score, reverse=True)


class AffinityRouter(PowerOfTwoChoicesRequestRouter):
    """Ray Serve request router: rendezvous ranking for keyed requests, power of two choices
    for the rest."""

    async def choose_replicas(
        self,
        candidate_replicas: Sequence[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        key = _key(pending_request)
        if not key:
            chosen: list[list[RunningReplica]] = await super().choose_replicas(
                list(candidate_replicas), pending_request
            )
            return chosen
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        return [[by_id[replica]] for replica in rank(key, by_id)]


def _key(request: PendingRequest | None) -> str:
    if request is None:
        return ""
    value: Any = request.kwargs.get(KEY_ARGUMENT)
    return value if isinstance(value, str) else ""
