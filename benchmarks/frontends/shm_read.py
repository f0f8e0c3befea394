"""What reading client system shared memory costs a front end, end to end, on this machine.

On the device (`docs/benchmarks.md`, issue 24) the front ends spend ~120-130 µs more CPU per
ResNet-50 request over gRPC + system shm than over CUDA shm, whose regions they pass on
untouched. Reading an image out of its region and stacking it into the channel's arena cost
10 µs in isolation, so the question is what the whole path costs inside a serving front end.
This harness serves a ResNet-sized input (UINT8 [224, 224, 3], 150 KB; a TorchScript model on
the CPU that reads a few bytes of it, two instances, 500 µs queue delay) with
``infermux serve --frontends 2`` and drives it with Triton's perf_analyzer over gRPC + system
shm at ``--concurrency``, in two variants, alternating over ``--rounds``:

    read-here       the front end reads each input region (``transport/regions.py``), as served
    executor-reads  the front end passes the references on and the executor reads the regions
                    (``benchmarks/gpu/tuning_hook``, ``INFERMUX_BENCH_FRONTEND_SHM=0``)

Per run: requests/s, the average batch, the front ends' and the executor's CPU µs per request
(/proc, over perf_analyzer's window), and the busiest front end's minor page faults per request;
``--py-spy`` also records that front end and tables the infermux functions in its samples.

    python benchmarks/frontends/shm_read.py [--concurrency 16] [--seconds 8] [--rounds 3]
        [--py-spy] [--out benchmarks/results/frontends]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))  # cpuroles
import cpuroles  # a script beside its helpers
from benchkit import free_port, group_pids, machine_info, stat_fields, stop_group

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "benchmarks" / "gpu" / "tuning_hook"
VARIANTS = {"read-here": {}, "executor-reads": {"INFERMUX_BENCH_FRONTEND_SHM": "0"}}
CONFIG = """name: "img"
platform: "pytorch_libtorch"
max_batch_size: 64
input [ { name: "INPUT__0", data_type: TYPE_UINT8, dims: [ 224, 224, 3 ] } ]
output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 12 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 2, kind: KIND_CPU } ]
"""


def write_repository(root: Path) -> Path:
    import torch

    class Corner(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, :2, :2, :].reshape(x.shape[0], 12).float()

    model = root / "img"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(Corner()).save(str(model / "1" / "model.pt"))
    return root


def perf_analyzer() -> str:
    """The perf_analyzer wrapper (installed into /tmp/pa by the shared installer if missing)."""
    prefix = os.environ.get("PA_PREFIX", "/tmp/pa")
    wrapper = Path(prefix) / "perf_analyzer"
    if not wrapper.exists():
        installer = ROOT.parent / "shared" / "tools" / "install-perf-analyzer.sh"
        out = subprocess.run(["bash", str(installer), prefix], capture_output=True, text=True)
        return out.stdout.strip().splitlines()[-1]
    return str(wrapper)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.load(response)


def _faults(pid: int) -> int:
    fields = stat_fields(pid)
    return int(fields[7]) if fields is not None else 0


def _spy_table(path: Path, top: int = 12) -> list[tuple[float, str]]:
    """The infermux functions in a py-spy raw recording: share of samples, inclusive."""
    total = 0
    inclusive: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        for frame in {f for f in stack.split(";") if "infermux/" in f}:
            inclusive[frame.split(" (")[0]] += int(count)
    return [(round(100 * n / total, 1), f) for f, n in inclusive.most_common(top)] if total else []


def run(variant: str, repo: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    http, grpc, metrics = free_port(), free_port(), free_port()
    log_path = work / f"server-{variant}.log"
    env = dict(os.environ, **VARIANTS[variant])
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "infermux", "serve", "--allow-client-shm", "--frontends", "2",
               "--model-repository", str(repo), "--http-port", str(http), "--grpc-port", str(grpc),
               "--metrics-port", str(metrics)]  # fmt: skip
    with log_path.open("w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)  # fmt: skip
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        executors = cpuroles.executor_pids(log_path.read_text())
        pids = group_pids(server.pid)
        pa = [args.perf_analyzer, "-m", "img", "-i", "grpc", "-u", f"127.0.0.1:{grpc}", "-b", "1",
              "--concurrency-range", str(args.concurrency), "--shared-memory", "system",
              "--output-shared-memory-size", "64"]  # fmt: skip
        subprocess.run([*pa, "-p", "1500", "--max-trials", "2"], capture_output=True)  # warm-up

        def counts() -> tuple[int, int]:
            stats = _get(f"http://127.0.0.1:{http}/v2/models/img/stats")["model_stats"][0]
            return int(stats["inference_count"]), int(stats["execution_count"])

        roles = cpuroles.roles(server.pid, pids, executors)
        fronts = [pid for pid, role in roles.items() if role.startswith("frontend")]
        faults = {pid: _faults(pid) for pid in fronts}
        before, (requests, batches), started = (
            cpuroles.snapshot(server.pid, pids, executors),
            counts(),
            time.time(),
        )
        # One window of --seconds (stability checks off: the server's own counts are the figure).
        client = subprocess.Popen([*pa, "-p", str(int(args.seconds * 1000)), "--max-trials", "1", "-s", "100"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        if args.py_spy:
            time.sleep(1.5)
            spies = [subprocess.Popen(["py-spy", "record", "-p", str(pid), "--duration", str(max(1, int(args.seconds) - 3)),
                                       "--rate", "250", "--nonblocking", "--format", "raw", "-o", str(work / f"spy-{variant}-{pid}.txt")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in fronts]  # fmt: skip
            for spy in spies:
                spy.wait()
        client.wait()
        span = time.time() - started
        after, (requests_after, batches_after) = (
            cpuroles.snapshot(server.pid, pids, executors),
            counts(),
        )
        served, executed = requests_after - requests, batches_after - batches
        cpu = cpuroles.delta(before, after, span=span, requests=served, batches=executed)
        busiest = max(fronts, key=lambda pid: after["procs"][pid][1] - before["procs"][pid][1])
        out: dict[str, Any] = {
            "variant": variant,
            "requests_per_s": round(served / span),
            "avg_batch": round(served / max(executed, 1), 1),
            "frontend_cpu_us_per_request": cpu["frontend_cpu_us_per_request"],
            "executor_cpu_us_per_request": cpu["executor_cpu_us_per_request"],
            "busiest_frontend_faults_per_request": round(
                (_faults(busiest) - faults[busiest]) / max(served, 1), 2
            ),
        }
        spied = work / f"spy-{variant}-{busiest}.txt"
        if spied.exists():
            out["busiest_frontend_py_spy"] = _spy_table(spied)
        return out
    finally:
        stop_group(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--py-spy", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "frontends")
    args = parser.parse_args()
    args.perf_analyzer = perf_analyzer()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="infermux-shm-read-") as tmp:
        work = Path(tmp)
        repo = write_repository(work / "repo")
        order = list(VARIANTS)
        for index in range(args.rounds):
            for variant in order if index % 2 == 0 else order[::-1]:
                result = run(variant, repo, args, work)
                print(json.dumps(result), flush=True)
                runs.append(result)
    summary = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        summary[variant] = {
            key: statistics.median(r[key] for r in mine if r[key] is not None)
            for key in ("requests_per_s", "avg_batch", "frontend_cpu_us_per_request",
                        "executor_cpu_us_per_request", "busiest_frontend_faults_per_request")
        }  # fmt: skip
    document = {"benchmark": "shm_read", "machine": machine_info(), "concurrency": args.concurrency,
                "seconds": args.seconds, "rounds": args.rounds, "summary": summary, "runs": runs}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shm_read.json").write_text(json.dumps(document, indent=1) + "\n")
    lines = [
        f"# System shm read in the front end or the executor (perf_analyzer gRPC + system shm, c={args.concurrency}, "
        f"UINT8 [224, 224, 3], --frontends 2, median of {args.rounds} alternating rounds)",
        "",
        "| variant | requests/s | avg batch | front ends µs/req | executor µs/req | busiest front end's page faults/req |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for variant, s in summary.items():
        lines.append(f"| {variant} | {s['requests_per_s']:,.0f} | {s['avg_batch']} | {s['frontend_cpu_us_per_request']:.0f} | "
                     f"{s['executor_cpu_us_per_request']:.0f} | {s['busiest_frontend_faults_per_request']} |")  # fmt: skip
    for r in runs:
        if r.get("busiest_frontend_py_spy"):
            lines += [
                "",
                f"py-spy, busiest front end, {r['variant']} (share of its samples, inclusive):",
                "",
            ]
            lines += [f"- {share}% {name}" for share, name in r["busiest_frontend_py_spy"]]
    (args.out / "shm_read.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
