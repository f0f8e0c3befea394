"""Rendezvous ranking of replicas for a routing key."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("ray.serve", reason="the affinity router subclasses Ray Serve's")

from infermux.ray.affinity import rank

REPLICAS = [f"replica-{i}" for i in range(4)]


def test_a_key_ranks_every_replica_the_same_way_each_time() -> None:
    assert rank("user-7", REPLICAS) == rank("user-7", reversed(REPLICAS))
    assert sorted(rank("user-7", REPLICAS)) == sorted(REPLICAS)


def test_keys_spread_over_replicas() -> None:
    tops = Counter(rank(f"user-{i}", REPLICAS)[0] for i in range(4000))
    assert set(tops) == set(REPLICAS)
    assert min(tops.values()) > 4000 / len(REPLICAS) * 0.8


def test_losing_a_replica_moves_only_its_own_keys() -> None:
    keys = [f"user-{i}" for i in range(2000)]
    before = {k: rank(k, REPLICAS)[0] for k in keys}
    after = {k: rank(k, REPLICAS[:3])[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved
    assert all(before[k] == "replica-3" for k in moved)
    # ...and each moved key goes to its second choice from before.
    assert all(after[k] == rank(k, REPLICAS)[1] for k in moved)
