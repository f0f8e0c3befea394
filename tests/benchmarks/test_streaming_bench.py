"""The streaming benchmark (``benchmarks/streaming/``): its figures from hand-made records, and a
tiny run (one stream, three responses per request) against a real ``infermux serve``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).parents[2] / "benchmarks" / "streaming"


def load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"streaming_{name}", HERE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_figures_from_records() -> None:
    client = load("client")
    ms = 1_000_000
    # Two requests of three responses on one process's record, a third sent after the window.
    record = {
        "req_send": np.array([0, 20 * ms, 200 * ms]),
        "req_exec": np.array([1 * ms, 21 * ms, 201 * ms]),
        "req_first": np.array([0, 3, 6]),
        "req_count": np.array([3, 3, 3]),
        # arrivals: 2 ms after send, then 10 ms apart; the model sent each 1 ms before.
        "arrival": np.array([2, 12, 22, 22, 32, 42, 202, 212, 222]) * ms,
        "sent": np.array([1, 11, 21, 21, 31, 41, 201, 211, 221]) * ms,
    }
    figures = client.figures([record], (0, 100 * ms), 3)
    assert figures["requests"] == 2
    assert figures["responses_per_s"] == 60.0  # six arrivals inside the 0.1 s window
    assert figures["ttfr_us"]["p50"] == 2000.0
    assert figures["to_model_us"]["p50"] == 1000.0
    assert figures["gap_us"] == {**figures["gap_us"], "n": 4, "p50": 10000.0, "max": 10000.0}
    assert figures["gap_minus_model_gap_us"]["max"] == 0.0
    assert figures["delivery_us"]["p99"] == 1000.0
    # A request that did not finish is not a sample.
    record["req_count"] = np.array([3, -1, 3])
    assert client.figures([record], (0, 100 * ms), 3)["requests"] == 1


@pytest.mark.e2e
def test_a_tiny_run_against_infermux(tmp_path: Path) -> None:
    command = [
        sys.executable, str(HERE / "bench.py"), "--servers", "infermux", "--frontends", "1",
        "--concurrency", "1", "--tokens", "3", "--delays-ms", "0,1", "--warmup", "0.1",
        "--window", "0.5", "--deadline", "100", "--out", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "estimated" in done.stdout.splitlines()[0]
    doc = json.loads((tmp_path / "streaming.json").read_text())
    assert doc["servers"]["infermux-f1"]["state"] == "ready"
    assert [(p["c"], p["delay_us"]) for p in doc["points"]] == [(1, 0), (1, 1000)]
    for point in doc["points"]:
        assert point["ok"], point
        assert point["requests"] > 0
        assert point["incomplete_requests"] == 0
        assert point["gap_us"]["n"] == 2 * point["requests"]
        assert point["ttfr_us"]["p50"] > 0
    # The model's own pause shows in its send stamps.
    assert doc["points"][1]["model_gap_us"]["p50"] >= 1000
    summary = (tmp_path / "streaming.md").read_text()
    assert "| 1 | infermux-f1 |" in summary
