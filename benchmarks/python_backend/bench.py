"""A Triton Python-backend ``model.py`` served by infermux (in process) and by real Triton
(tritonserver 2.51 from PyTriton 0.7.0's wheel: stub process + shared-memory copies), the same
repository directory unchanged, the same client (Triton's perf_analyzer): per-request latency at
concurrency 1 and throughput at concurrency 8 for a 1 MB FP32 input (262,144 floats), over gRPC,
gRPC + system shared memory and HTTP; servers alternate, the order reversed on odd rounds;
medians over rounds and the infermux/Triton ratios. Issue 27.

The model (``repository/pb_double``): ``OUTPUT0 = INPUT0 * 2``, ``max_batch_size: 0``, one CPU
instance; ``repository/pb_double_batched`` is the same ``model.py`` with ``max_batch_size: 8``
and dynamic batching. The floor is numpy's ``x * 2`` on the same 1 MB array, in process.

Triton needs its own venv (``/work/shared/reference/peers.md``, "Real tritonserver on a Triton
model repository"); the script copies the Python backend stub for the venv's Python into place
when it is missing and runs tritonserver with ``LD_LIBRARY_PATH`` = the interpreter's LIBDIR.

    python3 -m venv /tmp/pyt && /tmp/pyt/bin/pip install nvidia-pytriton==0.7.0 numpy
    PYTHONPATH=src python benchmarks/python_backend/bench.py [--rounds 2]

perf_analyzer runs under an address-space cap (``--pa-mem-gb``): over HTTP with this 1 MB
tensor at concurrency >= 4 it grows past 20 GB against either server and the kernel's OOM killer
ends it (seen here); with the cap it aborts with ``std::bad_alloc`` instead, and the point is
recorded as failed. HTTP's throughput is therefore also measured at concurrency 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import (
    cpu_seconds,
    free_port,
    group_pids,
    machine_info,
    stop_group,
    tritonserver_command,
)

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
REPOSITORY = HERE / "repository"
ELEMENTS = 262_144  # 1 MiB of FP32
SERVERS = ("infermux", "triton")


@dataclass(frozen=True)
class Point:
    model: str
    mode: str  # grpc, grpc_shm, http
    concurrency: int

    @property
    def key(self) -> str:
        return f"{self.model}|{self.mode}|c{self.concurrency}"


POINTS = [
    Point("pb_double", "grpc", 1),
    Point("pb_double", "grpc", 8),
    Point("pb_double", "grpc_shm", 1),
    Point("pb_double", "grpc_shm", 8),
    Point("pb_double", "http", 1),
    Point("pb_double", "http", 2),
    Point("pb_double", "http", 8),
    Point("pb_double_batched", "grpc", 8),
    Point("pb_double_batched", "grpc_shm", 8),
]
FIGURES = ("throughput", "p50_us", "p90_us", "p99_us", "avg_us", "server_cpu_ms_per_infer")


def floor(seconds: float = 2.0) -> dict[str, Any]:
    """numpy ``x * 2`` on a 1 MB FP32 array in this process: the model's own compute."""
    out: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    for name, x in (
        ("zeros", np.zeros(ELEMENTS, np.float32)),
        ("normal", rng.standard_normal(ELEMENTS, dtype=np.float32)),
    ):
        for _ in range(50):
            _ = x * 2
        samples = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter_ns()
            for _ in range(20):
                _ = x * 2
            samples.append((time.perf_counter_ns() - t0) / 20 / 1000)
        out[name] = {
            "median_us": round(statistics.median(samples), 2),
            "min_us": round(min(samples), 2),
            "loops": len(samples) * 20,
        }
    return out


def triton_command(venv: Path, ports: list[int]) -> tuple[list[str], dict[str, str]]:
    """tritonserver from PyTriton's wheel, as benchkit builds it (peers.md)."""
    return tritonserver_command(venv, REPOSITORY, ports)


def infermux_command(ports: list[int]) -> tuple[list[str], dict[str, str]]:
    command = [
        sys.executable, "-m", "infermux", "serve", "--model-repository", str(REPOSITORY),
        "--allow-client-shm", "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
        "--metrics-port", str(ports[2]),
    ]  # fmt: skip
    return command, dict(os.environ)


MODELS = sorted({p.model for p in POINTS})


def start(
    server: str, args: argparse.Namespace, log: Path
) -> tuple[subprocess.Popen[bytes], list[int]]:
    ports = [free_port() for _ in range(3)]
    while len(set(ports)) < 3:
        ports = [free_port() for _ in range(3)]
    if server == "infermux":
        command, env = infermux_command(ports)
    else:
        command, env = triton_command(args.triton_venv, ports)
    process = subprocess.Popen(
        command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    base = f"http://127.0.0.1:{ports[0]}"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{server} exited with {process.returncode}; see {log}")
        try:
            if all(
                urllib.request.urlopen(f"{base}{path}", timeout=2).status == 200
                for path in ("/v2/health/ready", *(f"/v2/models/{m}/ready" for m in MODELS))
            ):
                return process, ports
        except OSError:
            pass
        time.sleep(0.25)
    stop_group(process)
    raise RuntimeError(f"{server} not ready in 120 s; see {log}")


def read_row(path: Path) -> dict[str, float]:
    """The first row of perf_analyzer's ``-f`` CSV (one concurrency level per run)."""
    try:
        block = path.read_text().split("\n\n", 1)[0]
    except OSError:
        return {}
    for row in csv.DictReader(block.splitlines()):
        return {k.strip(): float(v) for k, v in row.items() if k and v not in (None, "")}
    return {}


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


def measure(
    point: Point, ports: list[int], pgid: int, args: argparse.Namespace, out: Path
) -> dict[str, Any]:
    """One perf_analyzer run (one retry when it finds no stable window, exit 2)."""
    stem = out / f"{point.model}-{point.mode}-c{point.concurrency}"
    protocol = ["-i", "http", "-u", f"127.0.0.1:{ports[0]}"]
    if point.mode.startswith("grpc"):
        protocol = ["-i", "grpc", "-u", f"127.0.0.1:{ports[1]}"]
    if point.mode.endswith("shm"):
        protocol += ["--shared-memory", "system", "--output-shared-memory-size", str(4 * ELEMENTS)]
    command = [
        str(args.perf_analyzer), "-m", point.model, *protocol,
        "--shape", f"INPUT0:{ELEMENTS}", "--input-data", "zero",
        "--concurrency-range", str(point.concurrency), *args.window.split(),
        "-f", f"{stem}.csv",
    ]  # fmt: skip
    cap = int(args.pa_mem_gb * 2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    before_shm = shm_names()
    pids = group_pids(pgid)
    cpu0, wall0 = cpu_seconds(pids), time.monotonic()
    rc, attempts = -1, 0
    for attempts in range(1, 3):
        with open(f"{stem}.log", "wb") as log:
            try:
                rc = subprocess.run(
                    command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    preexec_fn=limit, timeout=args.pa_timeout, check=False,
                ).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                rc = 124
        if rc != 2:
            break
        shutil.copy(f"{stem}.log", f"{stem}.unstable{attempts}.log")
    cpu, wall = cpu_seconds(group_pids(pgid) | pids) - cpu0, time.monotonic() - wall0
    # perf_analyzer names its regions after the tensors and leaves them behind when it aborts.
    for name in shm_names() - before_shm:
        if re.match(r"(INPUT|OUTPUT)\d", name):
            Path("/dev/shm", name).unlink(missing_ok=True)
    Path(f"{stem}.cmd").write_text(" ".join(command) + "\n")
    row = read_row(Path(f"{stem}.csv"))
    log_text = Path(f"{stem}.log").read_text(errors="replace")
    result: dict[str, Any] = {
        "point": point.key, "rc": rc, "attempts": attempts, "ok": rc == 0 and bool(row),
        "command": " ".join(command),
    }  # fmt: skip
    if result["ok"]:
        result.update(
            throughput=row["Inferences/Second"],
            p50_us=row["p50 latency"],
            p90_us=row["p90 latency"],
            p99_us=row["p99 latency"],
            avg_us=row.get("Avg latency"),
            server_queue_us=row.get("Server Queue"),
            server_compute_us=sum(
                row.get(f"Server Compute {k}", 0.0) for k in ("Input", "Infer", "Output")
            ),
            server_cpu_s=round(cpu, 2),
            wall_s=round(wall, 1),
        )
        # The server group's CPU over the whole perf_analyzer run (all its windows) per second,
        # divided by the reported window's rate: approximate, as the rate varies across windows.
        result["server_cores"] = round(cpu / wall, 3)
        result["server_cpu_ms_per_infer"] = round(1000 * cpu / wall / row["Inferences/Second"], 3)
    else:
        errors = [
            ln.strip() for ln in log_text.splitlines() if re.search(r"error|fail|alloc", ln, re.I)
        ]
        result["error"] = sorted(set(errors))[:3]
    return result


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    cells: dict[str, Any] = {}
    for key, results in runs.items():
        good = [r for r in results if r["ok"]]
        cell: dict[str, Any] = {"runs": len(results), "ok": len(good)}
        for figure in FIGURES:
            values = [r[figure] for r in good if r.get(figure) is not None]
            if values:
                cell[figure] = round(statistics.median(values), 3)
        cell["throughput_runs"] = [round(r["throughput"], 1) for r in good]
        if len(good) < len(results):
            cell["errors"] = sorted({e for r in results if not r["ok"] for e in r.get("error", [])})
        cells[key] = cell
    return cells


def ratios(cells: dict[str, Any], points: list[Point]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for point in points:
        a, b = cells.get(f"infermux|{point.key}", {}), cells.get(f"triton|{point.key}", {})
        entry = {}
        for figure in ("throughput", "p50_us", "p99_us"):
            if a.get(figure) and b.get(figure):
                entry[figure] = round(a[figure] / b[figure], 2)
        if entry:
            out[point.key] = entry
    return out


def markdown(document: dict[str, Any], points: list[Point]) -> str:
    cells, ratio = document["medians"], document["ratios"]
    fl = document["floor"]
    lines = [
        "# Triton Python-backend model: infermux (in process) vs tritonserver (stub process)",
        "",
        f"Issue 27. `benchmarks/python_backend/bench.py`, {document['rounds']} alternating rounds, "
        "medians. Model `OUTPUT0 = INPUT0 * 2`, FP32 [262144] (1 MiB in, 1 MiB out), one CPU "
        "instance; the same repository directory served by both. Client: perf_analyzer "
        f"({document['window']}, `--input-data zero`). Machine: {document['machine']['cpu_model']}, "
        f"{document['machine']['nproc']} cores, **shared with other work** (load average at start "
        f"{document['machine']['loadavg_start']}); client and server share the 2 cores.",
        "",
        f"Floor (numpy `x * 2` on the 1 MiB array, in process): {fl['zeros']['median_us']} µs "
        f"(zeros), {fl['normal']['median_us']} µs (normal floats).",
        "",
        "| model | protocol | c | infermux p50 / p99 µs | Triton p50 / p99 µs | infermux infer/s | "
        "Triton infer/s | ratio p50 (lower = infermux faster) | ratio infer/s (higher = infermux ahead) | "
        "server CPU ms/infer (infermux / Triton) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for point in points:
        a = cells.get(f"infermux|{point.key}", {})
        b = cells.get(f"triton|{point.key}", {})
        r = ratio.get(point.key, {})

        def lat(c: dict[str, Any]) -> str:
            if "p50_us" not in c:
                return f"failed ({c.get('ok', 0)}/{c.get('runs', 0)})"
            return f"{c['p50_us']:.0f} / {c['p99_us']:.0f}"

        def tput(c: dict[str, Any]) -> str:
            return f"{c['throughput']:.0f} {c['throughput_runs']}" if "throughput" in c else "-"

        def cpu(c: dict[str, Any]) -> str:
            return f"{c['server_cpu_ms_per_infer']:.2f}" if "server_cpu_ms_per_infer" in c else "-"

        lines.append(
            f"| {point.model} | {point.mode} | {point.concurrency} | {lat(a)} | {lat(b)} | "
            f"{tput(a)} | {tput(b)} | {r.get('p50_us', '-')} | {r.get('throughput', '-')} | "
            f"{cpu(a)} / {cpu(b)} |"
        )
    failures = {k: v["errors"] for k, v in cells.items() if v.get("errors")}
    if failures:
        lines += ["", "Failed runs (first error lines):", ""]
        lines += [f"- `{k}`: {'; '.join(v)}" for k, v in failures.items()]
    lines += ["", "Commands (one round; ports differ per run):", "", "```"]
    lines += document["commands"]
    lines += ["```", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--triton-venv", type=Path, default=Path("/tmp/pyt"))
    parser.add_argument(
        "--perf-analyzer", type=Path, default=Path("/tmp/perf_analyzer/perf_analyzer")
    )
    parser.add_argument(
        "--window", default="--measurement-interval 3000 --stability-percentage 25 --max-trials 6"
    )
    parser.add_argument(
        "--pa-mem-gb", type=float, default=4.0, help="perf_analyzer address-space cap"
    )
    parser.add_argument("--pa-timeout", type=float, default=120)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "python_backend"
    )
    parser.add_argument("--only", default="", help="comma-separated point keys (default: all)")
    args = parser.parse_args()

    points = [p for p in POINTS if not args.only or p.key in args.only.split(",")]
    work = args.out / "raw"
    work.mkdir(parents=True, exist_ok=True)
    info = machine_info(perf_analyzer=str(args.perf_analyzer), triton_venv=str(args.triton_venv))
    print("floor ...", flush=True)
    fl = floor()
    print(json.dumps(fl), flush=True)

    runs: dict[str, list[dict[str, Any]]] = {}
    commands: list[str] = []
    for r in range(args.rounds):
        for server in SERVERS if r % 2 == 0 else tuple(reversed(SERVERS)):
            out = work / f"round{r}" / server
            out.mkdir(parents=True, exist_ok=True)
            process, ports = start(server, args, out / "server.log")
            try:
                if r == 0:
                    commands.append(f"# {server}: " + " ".join(process.args))  # type: ignore[arg-type]
                for point in points:
                    result = measure(point, ports, process.pid, args, out)
                    result["round"] = r
                    runs.setdefault(f"{server}|{point.key}", []).append(result)
                    if r == 0 and server == SERVERS[0]:
                        commands.append(result["command"])
                    shown = (
                        f"{result['throughput']:.0f}/s p50 {result['p50_us']:.0f} p99 {result['p99_us']:.0f}"
                        if result["ok"] else f"rc={result['rc']} {result.get('error')}"
                    )  # fmt: skip
                    print(f"round {r} {server} {point.key}: {shown}", flush=True)
            finally:
                stop_group(process)
    cells = summarize(runs)
    document = {
        "issue": 27,
        "machine": info,
        "loadavg_end": [round(v, 2) for v in os.getloadavg()],
        "rounds": args.rounds,
        "window": args.window,
        "floor": fl,
        "medians": cells,
        "ratios": ratios(cells, points),
        "commands": commands,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "python_backend.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out / "python_backend.md").write_text(markdown(document, points))
    print(markdown(document, points))


if __name__ == "__main__":
    main()
