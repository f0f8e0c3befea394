"""The GPU benchmark's batch readings (``benchmarks/gpu/readings.py``, ``report_tables.py``):
executions by batch size over a window from two statistics answers, and what padding them up
to the CUDA graph buckets costs -- the figure that says whether finer buckets would pay."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parents[2] / "benchmarks" / "gpu"


def load(name: str) -> Any:
    # The GPU bench's modules import their siblings by name, and benchkit from benchmarks/.
    for folder in (HERE, HERE.parent):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(f"gpu_bench_{name}", HERE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def stats_document(batches: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """A statistics-extension answer whose only news is ``batch_stats``."""
    return {
        "model_stats": [
            {
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": {"count": count, "ns": 0},
                        "compute_infer": {"count": count, "ns": ns},
                        "compute_output": {"count": count, "ns": 0},
                    }
                    for size, (count, ns) in batches.items()
                ]
            }
        ]
    }


def test_the_window_counts_only_its_own_executions() -> None:
    readings = load("readings")
    before = readings.batch_counters(stats_document({1: (5, 5_000_000), 32: (10, 80_000_000)}))
    after = readings.batch_counters(
        stats_document({1: (5, 5_000_000), 32: (14, 120_000_000), 36: (2, 18_000_000)})
    )
    delta = readings.batch_delta(before, after)
    # Size 1 ran nothing in the window; 32 ran 4 more (10 ms each), 36 appeared (9 ms each).
    assert delta == {
        "batch_sizes": {"32": 4, "36": 2},
        "compute_infer_us_by_batch": {"32": 10_000.0, "36": 9_000.0},
    }


@pytest.mark.parametrize(
    ("sizes", "buckets", "padded"),
    [
        ({"32": 4}, [1, 2, 4, 8, 16, 32, 64], 0.0),  # every batch fills its graph
        ({"33": 1}, [1, 2, 4, 8, 16, 32, 64], 48.4),  # 33 rows replay the 64-row graph
        ({"34": 3, "40": 1}, [32, 40, 48], 11.2),  # 3 x 6 padded of 4 x 40 run
        ({"200": 2}, [8, 128], 0.0),  # past the largest bucket: eager, unpadded
    ],
)
def test_padding_is_the_share_of_graph_rows_that_were_not_requests(
    sizes: dict[str, int], buckets: list[int], padded: float
) -> None:
    readings = load("readings")
    assert readings.padding(sizes, buckets) == {"padded_rows_pct": padded}


def test_no_padding_figure_without_graphs_or_batches() -> None:
    readings = load("readings")
    assert readings.padding({"8": 3}, []) is None
    assert readings.padding({}, [8, 16]) is None


def test_the_report_lists_the_common_sizes_and_the_padding() -> None:
    tables = load("report_tables")
    point = {
        "protocol": "pa_grpc_shm",
        "concurrency": 256,
        "items_per_s": 100.0,
        "batch_sizes": {"34": 30, "40": 10, "2": 1},
        "compute_infer_us_by_batch": {"34": 10_300.0, "40": 10_900.0, "2": 1_500.0},
        "padded_rows_pct": 11.2,
    }
    entry = {"servers": {"infermux": {"points": [point, {**point, "concurrency": 64}]}}}
    (line,) = tables.batches(entry, 256)
    assert "41 executions" in line
    assert "2 x1 (1,500 µs), 34 x30 (10,300 µs), 40 x10 (10,900 µs)" in line
    assert "graph padding 11.2% of the rows run" in line
