"""Fault isolation: how fast a process-isolated Python model is back after a crash, what the
isolation costs per request, and how fast a hanging model's request is cut (issue 11; target:
restart in < 2 s, in-flight requests failing fast with 503).

One ``infermux serve`` holds the same Python model twice: ``isolated`` (``isolation: process``,
``execution_timeout_ms`` 1000) and ``inprocess``. The client (tritonclient HTTP, one request at a
time):

* steady state: N requests to each, latency p50/p99 and the ratio isolated / in-process;
* crashes: ``--crashes`` times, one request that makes the worker ``os._exit``; the time until
  the failing request's 503 came back, then until the model answered again (polling every 5 ms);
* hangs: ``--hangs`` times, one request that sleeps forever; the time until its 503.

    python benchmarks/faults/restart.py [--crashes 20] [--hangs 3] [--requests 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import stop_group

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"ready: HTTP on http://([^:]+):(\d+)")
MODEL = """
import os
import time

import numpy as np


class Model:
    def execute(self, requests):
        mode = int(requests[0].inputs["INPUT0"][0])
        if mode == 1:
            os._exit(1)
        if mode == 2:
            time.sleep(3600)
        return [{"OUTPUT0": r.inputs["INPUT0"]} for r in requests]
"""


def repository() -> Path:
    root = Path(tempfile.mkdtemp(prefix="faults-"))
    for name, extra in (
        ("isolated", 'parameters { key: "isolation" value: { string_value: "process" } }\n'
         'parameters { key: "execution_timeout_ms" value: { string_value: "1000" } }\n'),
        ("inprocess", ""),
    ):  # fmt: skip
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            'input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 1 ] } ]\n' + extra
        )
    return root


def inputs(mode: int) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([mode], dtype=np.int32))
    return [tensor]


def summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "n": len(ordered),
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def latencies(client: httpclient.InferenceServerClient, model: str, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        client.infer(model, inputs(0))
        times.append(time.perf_counter() - start)
    return times


def fault(client: httpclient.InferenceServerClient, mode: int) -> tuple[float, float, str]:
    """Seconds until the faulting request failed, until the model answered again; its status."""
    start = time.perf_counter()
    status = "answered"
    try:
        client.infer("isolated", inputs(mode))
    except InferenceServerException as exc:
        status = str(exc.status())
    failed = time.perf_counter() - start
    while True:
        try:
            client.infer("isolated", inputs(0))
            return failed, time.perf_counter() - start, status
        except InferenceServerException:
            time.sleep(0.005)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--crashes", type=int, default=20)
    p.add_argument("--hangs", type=int, default=3)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "faults")
    args = p.parse_args()
    command = [sys.executable, "-m", "infermux", "serve", "--model-repository", str(repository())]
    command += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--frontends", "1"]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert server.stderr is not None
        for line in server.stderr:
            match = READY.search(line)
            if match:
                break
        else:
            raise SystemExit("the server did not start")
        client = httpclient.InferenceServerClient(f"{match.group(1)}:{match.group(2)}")
        latencies(client, "isolated", 200)  # warm-up
        latencies(client, "inprocess", 200)
        isolated = summary(latencies(client, "isolated", args.requests))
        inprocess = summary(latencies(client, "inprocess", args.requests))
        crashes = [fault(client, 1) for _ in range(args.crashes)]
        hangs = [fault(client, 2) for _ in range(args.hangs)]
    finally:
        stop_group(server, 30)
    result: dict[str, Any] = {
        "cores": len(os.sched_getaffinity(0)),
        "steady": {
            "isolated": isolated,
            "inprocess": inprocess,
            "p50_ratio": isolated["p50_ms"] / inprocess["p50_ms"],
        },
        "crash": {
            "statuses": sorted({s for _, _, s in crashes}),
            "failed": summary([f for f, _, _ in crashes]),
            "answering_again": summary([a for _, a, _ in crashes]),
        },
        "hang": {
            "statuses": sorted({s for _, _, s in hangs}),
            "failed": summary([f for f, _, _ in hangs]),
            "answering_again": summary([a for _, a, _ in hangs]),
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "restart.json").write_text(json.dumps(result, indent=2) + "\n")
    rows = [
        "| measure | p50 | p99 | max | n |",
        "|---|---|---|---|---|",
    ]
    for label, s in (
        ("request, isolated (ms)", isolated),
        ("request, in-process (ms)", inprocess),
        ("crash: failing request's 503 (ms)", result["crash"]["failed"]),
        ("crash: until answering again (ms)", result["crash"]["answering_again"]),
        ("hang: request cut at 1000 ms timeout (ms)", result["hang"]["failed"]),
        ("hang: until answering again (ms)", result["hang"]["answering_again"]),
    ):
        rows.append(
            f"| {label} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | {s['max_ms']:.2f} | {s['n']} |"
        )
    rows.append("")
    rows.append(
        f"Isolation costs {result['steady']['p50_ratio']:.2f}x the in-process p50 per request "
        f"(one tensor copy each way through a pipe). Statuses of the faulting requests: "
        f"crash {result['crash']['statuses']}, hang {result['hang']['statuses']}. "
        f"{result['cores']} cores."
    )
    (args.out / "restart.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
