"""``infermux bench`` pieces: flags, input tensors, windows and stability, server breakdown,
CSV (runs against a real server: tests/e2e/test_bench.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from infermux.bench.inputs import make_inputs
from infermux.bench.measure import Window, server_breakdown, server_totals, stable, summarize
from infermux.bench.options import BenchOptions, parse_options
from infermux.bench.report import csv_text

METADATA = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "TEXT", "datatype": "BYTES", "shape": [-1, -1]},
    ]
}


def test_flags() -> None:
    options = parse_options(
        ["simple", "-i", "grpc", "--concurrency-range", "1:8", "--shape", "TEXT:3", "-b", "2"]
    )
    assert options.concurrency == (1, 2, 4, 8)
    assert options.address == "localhost:8001"
    assert options.shapes == {"TEXT": (3,)}
    assert not options.open_loop
    rates = parse_options(
        ["m", "--request-rate-range", "100:300:100", "--request-distribution", "poisson"]
    )
    assert rates.levels == [100.0, 200.0, 300.0]
    assert rates.open_loop
    assert parse_options(["m", "--concurrency-range", "2:6:2"]).concurrency == (2, 4, 6)


@pytest.mark.parametrize(
    "args",
    [["m", "--concurrency-range", "0"], ["m", "--concurrency-range", "4:2"],
     ["m", "--concurrency-range", "1.5"], ["m", "--shape", "X:a"], ["m", "-b", "0"]],
)  # fmt: skip
def test_bad_flags_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_options(args)
    assert exited.value.code == 2
    assert "error" in capsys.readouterr().err


def test_inputs_follow_the_metadata(tmp_path: Path) -> None:
    made = make_inputs(METADATA, True, 4, "random", {"TEXT": (3,)})
    assert made["INPUT0"][1].shape == (4, 16)
    assert made["INPUT0"][1].dtype == np.int32
    assert made["TEXT"][1].shape == (4, 3)
    assert isinstance(made["TEXT"][1][0, 0], bytes)
    zeros = make_inputs(METADATA, True, 1, "zero", {"TEXT": (1,)})
    assert not zeros["INPUT0"][1].any()
    with pytest.raises(ValueError, match="give --shape TEXT"):
        make_inputs(METADATA, True, 1, "random", {})
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"INPUT0": [list(range(16))], "TEXT": [["a", "b"]]}))
    from_file = make_inputs(METADATA, True, 1, str(path), {})
    assert from_file["INPUT0"][1].tolist() == [list(range(16))]
    assert from_file["TEXT"][1].tolist() == [[b"a", b"b"]]
    np.savez(tmp_path / "data.npz", INPUT0=np.ones((2, 16), np.int32))
    with pytest.raises(ValueError, match="no values for input 'TEXT'"):
        make_inputs(METADATA, True, 1, str(tmp_path / "data.npz"), {})


def test_stability_and_summary() -> None:
    def window(start: float, latency: float, count: int) -> Window:
        return Window(start, start + 1, [latency] * count)

    steady = [window(0, 0.010, 100), window(1, 0.0102, 104), window(2, 0.0099, 98)]
    assert stable(steady, 0.10)
    assert not stable(steady[:2], 0.10)
    assert not stable([window(0, 0.010, 100), window(1, 0.010, 150), window(2, 0.010, 100)], 0.10)
    level = summarize(4, steady, batch_size=2, cpu_s=0.5, wall_s=2.0, server={}, is_stable=True)
    assert level.requests_per_s == pytest.approx(302 / 3)
    assert level.inferences_per_s == pytest.approx(2 * 302 / 3)
    assert level.latency_us["p50"] == pytest.approx(10_000)
    assert level.client_cpu_cores == 0.25


def test_server_breakdown_from_http_and_grpc_documents() -> None:
    def document(count: int, grpc: bool) -> dict[str, object]:
        stats = {
            "success": {"count": count, "ns": count * 5000},
            ("computeInfer" if grpc else "compute_infer"): {
                "count": str(count),
                "ns": str(count * 2000),
            },
            "queue": {"count": count, "ns": count * 1000},
        }
        key = "modelStats" if grpc else "model_stats"
        return {key: [{"version": "1", ("inferenceStats" if grpc else "inference_stats"): stats}]}

    for grpc in (False, True):
        before = server_totals(document(10, grpc), "")
        after = server_totals(document(30, grpc), "1")
        result = server_breakdown(before, after)
        assert result["requests"] == 20
        assert result["queue_us"] == pytest.approx(1.0)
        assert result["compute_infer_us"] == pytest.approx(2.0)
        assert math.isnan(result["compute_output_us"]) is False


def test_csv_has_perf_analyzers_columns() -> None:
    level = summarize(
        2,
        [Window(0, 1, [0.001] * 10)] * 3,
        batch_size=1,
        cpu_s=0.1,
        wall_s=1,
        server={
            "queue_us": 100.0,
            "compute_input_us": 10.0,
            "compute_infer_us": 300.0,
            "compute_output_us": 20.0,
        },
        is_stable=True,
    )
    text = csv_text(BenchOptions("m"), [level])
    header, row = text.splitlines()
    assert header.split(",")[:3] == ["Concurrency", "Inferences/Second", "Client Send"]
    assert header.endswith("p50 latency,p90 latency,p95 latency,p99 latency")
    values = row.split(",")
    assert values[0] == "2"
    assert values[4:8] == ["100", "10", "300", "20"]
    assert values[3] == str(1000 - 430)  # the rest of the average latency
