from __future__ import annotations

from infermux.observability.statistics import ModelStatistics
from infermux.types import INFER_STAT_KEYS


def test_counts_follow_triton_semantics() -> None:
    stats = ModelStatistics("m", 3)
    empty = stats.snapshot()
    assert (empty.name, empty.version, empty.last_inference) == ("m", "3", 0)
    assert list(empty.inference_stats) == list(INFER_STAT_KEYS)
    stats.record_execution(4, 10, 100, 20)
    stats.record_execution(4, 10, 100, 20)
    stats.record_execution(1, 1, 50, 2)
    for rows in (3, 1):
        stats.record_success(
            batch_size=rows, request_ns=500, queue_ns=40, input_ns=10, infer_ns=100, output_ns=5
        )
    stats.record_failure(70)
    snap = stats.snapshot()
    assert snap.inference_count == 4
    assert snap.execution_count == 3
    assert snap.last_inference > 0
    assert (snap.inference_stats["success"].count, snap.inference_stats["success"].ns) == (2, 1000)
    assert (snap.inference_stats["fail"].count, snap.inference_stats["fail"].ns) == (1, 70)
    assert snap.inference_stats["queue"].ns == 80
    assert snap.inference_stats["cache_hit"].count == 0
    assert [
        (b.batch_size, b.compute_infer.count, b.compute_infer.ns) for b in snap.batch_stats
    ] == [
        (1, 1, 50),
        (4, 2, 200),
    ]
    # A snapshot is a copy: later records do not change it.
    stats.record_failure(1)
    assert snap.inference_stats["fail"].count == 1
