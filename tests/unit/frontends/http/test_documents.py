from __future__ import annotations

from infermux.frontends.http import documents
from infermux.types import Duration, ModelStats


def test_statistics_carry_response_stats_as_json_numbers() -> None:
    stats = ModelStats(
        name="m",
        version="1",
        last_inference=0,
        inference_count=0,
        execution_count=0,
        inference_stats={},
        batch_stats=(),
        response_stats={"0": {"success": Duration(2, 40), "cancel": Duration()}},
    )
    (entry,) = documents.statistics([stats])["model_stats"]
    assert entry["response_stats"] == {
        "0": {"success": {"count": 2, "ns": 40}, "cancel": {"count": 0, "ns": 0}}
    }
