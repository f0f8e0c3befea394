"""p99 latency during version swaps versus steady state, under continuous load (issue 9).

Three runs against a real ``infermux serve``, each with ``--clients`` closed-loop HTTP clients
(tritonclient, one thread each) sending a small numpy MLP (64 -> 256 -> 64, a Python model whose
output is scaled by its version number, so every answer says which version made it):

- poll: ``--model-control-mode poll``; every ``--every`` seconds a new version directory appears
  (version policy latest 1), is loaded beside the old one and swapped in;
- explicit: ``--model-control-mode explicit``; every ``--every`` seconds a forced reload
  (``POST /v2/repository/models/m/load``) of the unchanged model builds new instances;
- canary: two versions served; every second the traffic weights move (admin API).

Each run first measures ``--steady`` seconds without changes. A swap's window runs from the
change until 0.5 s after the clients see its effect (the new version's answers, or the reload
call's return). Reported: requests, failures, p50/p99 in steady state and inside swap windows,
and their ratio (target: p99 during swaps <= 2x steady). Results in
``benchmarks/results/lifecycle/swap.{json,md}``.

    python benchmarks/lifecycle/swap.py [--clients 4] [--swaps 5] [--every 3] [--steady 10]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import stop_group

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"ready: HTTP on http://([^:]+):(\d+)")

MODEL = """
from typing import Any

import numpy as np

rng = np.random.default_rng(0)
W1 = rng.standard_normal((64, 256)).astype(np.float32) / 8
W2 = rng.standard_normal((256, 64)).astype(np.float32) / 16


class Model:
    def execute(self, requests: list[Any]) -> list[Any]:
        out = []
        for r in requests:
            x = r.inputs["INPUT0"]
            hidden = np.maximum(x @ W1, 0)
            out.append({{"OUTPUT0": (hidden @ W2) * 0 + x[:, :64] * 0 + {version}}})
        return out
"""
CONFIG = """name: "m"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 64 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 64 ] }} ]
dynamic_batching {{ }}
{extra}
"""


def write_version(repo: Path, version: int) -> None:
    folder = repo / "m" / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL.format(version=version))


class Clients:
    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.records: list[
            tuple[float, float, float]
        ] = []  # (start, latency s, answer; nan=failed)
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=60)
        x = np.ones((1, 64), dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", [1, 64], "FP32").set_data_from_numpy(x)
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                answer = float(client.infer("m", [tensor]).as_numpy("OUTPUT0")[0, 0])
            except Exception:
                answer = float("nan")
            with self.lock:
                self.records.append((start, time.monotonic() - start, answer))
        client.close()

    def wait_for(self, answer: float, since: float, timeout: float = 60) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for start, latency, value in reversed(self.records[-50:]):
                    if value == answer and start >= since:
                        return start + latency
            time.sleep(0.02)
        raise RuntimeError(f"answers never switched to {answer}")

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def serve(repo: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "infermux", "serve", "--model-repository", str(repo)]
    command += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *args]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stderr is not None
    for line in process.stderr:
        match = READY.search(line)
        if match:
            threading.Thread(
                target=lambda: [None for _ in process.stderr or ()], daemon=True
            ).start()
            return process, f"{match.group(1)}:{match.group(2)}"
    raise RuntimeError("server did not start")


def percentiles(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"n": 0, "p50_ms": float("nan"), "p99_ms": float("nan")}
    values = np.array(latencies) * 1000
    return {
        "n": len(values),
        "p50_ms": float(np.percentile(values, 50)),
        "p99_ms": float(np.percentile(values, 99)),
    }


def summarize(
    name: str, clients: Clients, steady_end: float, windows: list[tuple[float, float]]
) -> dict[str, Any]:
    records = clients.records
    steady = [lat for start, lat, _ in records if start < steady_end]
    inside = [lat for start, lat, _ in records if any(a <= start <= b for a, b in windows)]
    failures = sum(1 for _, _, value in records if math.isnan(value))
    result = {
        "run": name,
        "requests": len(records),
        "failures": failures,
        "swaps": len(windows),
        "steady": percentiles(steady),
        "during_swaps": percentiles(inside),
    }
    result["p99_ratio"] = result["during_swaps"]["p99_ms"] / result["steady"]["p99_ms"]
    return result


def run(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    repo = Path(tempfile.mkdtemp(prefix=f"swap-{kind}-"))
    (repo / "m").mkdir()
    extra = "version_policy: { all { } }" if kind == "canary" else ""
    (repo / "m" / "config.pbtxt").write_text(CONFIG.format(extra=extra))
    write_version(repo, 1)
    if kind == "canary":
        write_version(repo, 2)
    flags = {
        "poll": ["--model-control-mode", "poll", "--repository-poll-secs", "0.5"],
        "explicit": ["--model-control-mode", "explicit", "--load-model", "m"],
        "canary": [],
    }[kind]
    process, url = serve(repo, "--frontends", str(args.frontends), *flags)
    base = f"http://{url}/v2"
    clients = Clients(url, args.clients)
    windows: list[tuple[float, float]] = []
    try:
        time.sleep(args.steady)
        steady_end = time.monotonic()
        if kind == "poll":
            for version in range(2, 2 + args.swaps):
                began = time.monotonic()
                write_version(repo, version)
                seen = clients.wait_for(float(version), began)
                windows.append((began, seen + 0.5))
                time.sleep(max(0.0, args.every - (time.monotonic() - began)))
        elif kind == "explicit":
            for _ in range(args.swaps):
                began = time.monotonic()
                reply = httpx.post(f"{base}/repository/models/m/load", json={}, timeout=60)
                reply.raise_for_status()
                windows.append((began, time.monotonic() + 0.5))
                time.sleep(max(0.0, args.every - (time.monotonic() - began)))
        else:
            for step in range(args.swaps * 2):
                began = time.monotonic()
                version = 1 + step % 2
                weights = {str(version): 90, str(3 - version): 10}
                httpx.post(f"{base}/models/m/traffic", json={"weights": weights}).raise_for_status()
                windows.append((began, began + 0.5))
                time.sleep(1.0)
        time.sleep(1.0)
    finally:
        clients.close()
        stop_group(process, 60)
        shutil.rmtree(repo, ignore_errors=True)
    return summarize(kind, clients, steady_end, windows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--swaps", type=int, default=5)
    p.add_argument("--every", type=float, default=3.0)
    p.add_argument("--steady", type=float, default=10.0)
    p.add_argument("--frontends", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "lifecycle")
    args = p.parse_args()
    results = [run(kind, args) for kind in ("poll", "explicit", "canary")]
    doc = {
        "cpus": os.cpu_count(),
        "clients": args.clients,
        "frontends": args.frontends,
        "runs": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "swap.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        f"# p99 during version swaps vs steady state ({os.cpu_count()} cores, {args.clients} "
        f"closed-loop HTTP clients, numpy MLP Python model, --frontends {args.frontends})",
        "",
        "| run | requests | failed | changes | steady p50 ms | steady p99 ms | swap p50 ms | swap p99 ms | p99 swap / steady |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s, d = r["steady"], r["during_swaps"]
        lines.append(
            f"| {r['run']} | {r['requests']:,} | {r['failures']} | {r['swaps']} | {s['p50_ms']:.2f} | "
            f"{s['p99_ms']:.2f} | {d['p50_ms']:.2f} | {d['p99_ms']:.2f} | {r['p99_ratio']:.2f} |"
        )
    (args.out / "swap.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
