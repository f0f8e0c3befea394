from __future__ import annotations

from infermux.observability.statistics import ModelStatistics
from infermux.types import INFER_STAT_KEYS, RESPONSE_STAT_KEYS


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


def test_response_statistics_follow_triton_per_response_semantics() -> None:
    stats = ModelStatistics("m", 1, histograms=True)
    assert stats.snapshot().response_stats == {}  # a model that never streamed: none
    stats.record_response(0, "success", 100, 10)
    stats.record_response(1, "fail", 200, 0)  # an error response: no outputs made
    stats.record_response(2, "empty_response", 5, 0)  # the final flag alone
    stats.record_response(0, "success", 300, 30)  # the next request's first
    stats.record_response_cancel(1, 70)  # it was given up awaiting its second
    snap = stats.snapshot().response_stats
    assert list(snap) == ["0", "1", "2"]
    assert list(snap["0"]) == list(RESPONSE_STAT_KEYS)
    first = {key: (d.count, d.ns) for key, d in snap["0"].items()}
    assert first == {
        "compute_infer": (2, 400),
        "compute_output": (2, 40),
        "success": (2, 440),
        "fail": (0, 0),
        "empty_response": (0, 0),
        "cancel": (0, 0),
    }
    second = {key: (d.count, d.ns) for key, d in snap["1"].items()}
    assert second["compute_infer"] == (1, 200)
    assert second["compute_output"] == (0, 0)
    assert (second["fail"], second["cancel"]) == ((1, 200), (1, 70))
    assert (snap["2"]["empty_response"].count, snap["2"]["compute_infer"].count) == (1, 1)
    assert stats.histograms is not None
    assert stats.histograms.response_interval.count == 2  # gaps: responses after the first
    stats.record_response(0, "success", 1, 1)
    assert snap["0"]["success"].count == 2  # the snapshot is a copy


def test_first_response_is_observed_in_tritons_whole_milliseconds() -> None:
    stats = ModelStatistics("m", 1, histograms=True)
    stats.record_first_response(250_000_000)  # 250 ms
    stats.record_first_response(99_999_999)  # 99.99 ms counts as 99, as Triton truncates
    assert stats.histograms is not None
    assert stats.histograms.first_response_ms.counts == [1, 1, 0, 0, 0]
    assert stats.histograms.first_response_ms.sum == 349
    assert stats.histograms.first_response.count == 2
    ModelStatistics("m", 1).record_first_response(1)  # metrics off: nothing to observe


def test_a_micro_batch_recorded_at_once_counts_as_its_requests_one_by_one() -> None:
    # The data plane records a micro-batch's requests in one call (they share every figure).
    one_by_one = ModelStatistics("m", 1, histograms=True)
    at_once = ModelStatistics("m", 1, histograms=True)
    figures = {"request_ns": 2_500_000, "queue_ns": 40, "input_ns": 10, "infer_ns": 90}
    for rows in (1, 2, 1):
        one_by_one.record_first_response(2_500_000)
        one_by_one.record_success(batch_size=rows, output_ns=5, **figures)
    at_once.record_first_response(2_500_000, 3)
    at_once.record_success(batch_size=4, output_ns=5, requests=3, **figures)
    a, b = one_by_one.snapshot(), at_once.snapshot()
    assert (a.inference_count, a.inference_stats) == (b.inference_count, b.inference_stats)
    assert a.inference_stats["success"].count == 3
    first, second = one_by_one.histograms, at_once.histograms
    assert first is not None
    assert second is not None
    for name in ("request", "queue", "first_response", "first_response_ms"):
        one, other = getattr(first, name), getattr(second, name)
        assert (one.counts, one.sum) == (other.counts, other.sum), name
