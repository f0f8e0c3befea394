"""Dynamic batching benchmark: what batch formation buys a CPU model served over HTTP.

One run:

1. writes a temporary Triton-layout repository with a numpy MLP (``benchmarks/batching/model.py``,
   FP32, INPUT0 [512] -> 1024 -> 1024 -> OUTPUT0 [10], fixed-seed weights) as an infermux Python
   model under two (or more) configs: ``mlp_dynamic`` (``max_batch_size: 32``, ``dynamic_batching
   { max_queue_delay_microseconds: D }``; one model ``mlp_dynamic_d<D>`` per extra ``--delay-us``)
   and ``mlp_single`` (``max_batch_size: 32``, no ``dynamic_batching``: one request per execute);
2. measures the raw in-process ceiling: the model's ``execute`` called directly at batch 1..32
   (rows/s), before and after the HTTP runs (CPU 0, one BLAS thread);
3. starts ``infermux serve`` (``taskset -c 0``, own process group, one BLAS thread) and, for each
   concurrency, alternating the models (A/B, order flipped every cell), runs a closed-loop client
   in a separate process (``taskset -c 1``, aiohttp + uvloop, V2 *binary* tensors): N requests in
   flight, warm-up, then a fixed window. The client checks each connection's first response against
   the model computed locally, and records infer/s, p50/p90/p99 latency, errors, its own CPU use,
   the server's CPU use and the server's statistics delta (average batch size = delta
   inference_count / delta execution_count);
4. repeats that ``--rounds`` times, takes the median per cell, stops the server by killing its
   process group (also on error or Ctrl-C), and writes benchmarks/results/batching.{json,md}.

  .venv/bin/python benchmarks/batching.py [--rounds 2] [--window 4] [--concurrency 1,2,4,8,16,32,64]
                                          [--delay-us 0[,2000]] [--out benchmarks/results/batching.json]
  .venv/bin/python benchmarks/batching.py --md-only     # re-render the .md from the .json

About 3 minutes with the defaults (2 rounds x 7 concurrencies x 2 models x 5 s). Do not run it
next to another benchmark: it assumes 2 cores, one for the server and one for the client.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import benchkit
from benchkit import proc_cpu_seconds, stats_counters, stop_group

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
MODEL_FILE = HERE / "batching" / "model.py"
SERVER_CPU = 0
CLIENT_CPU = 1
# One BLAS / OpenMP thread everywhere, so the server's model uses one core like the rest of it.
THREAD_ENV = dict.fromkeys(
    (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "BLIS_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "NUMEXPR_NUM_THREADS",
    ),
    "1",
)
MAX_BATCH = 32
RAW_BATCHES = (1, 2, 4, 8, 16, 32)
GAP_S, GAP_CALLS = 0.002, 200  # raw ceiling, "cold" variant: sleep 2 ms before each execute
INPUT_POOL = 16  # distinct input rows; connection i sends row i % INPUT_POOL
SINGLE = "mlp_single"
READY = re.compile(r"ready: HTTP on http://([^:\s]+):(\d+)")


# ----------------------------------------------------------------------------- helpers
def load_model_module() -> ModuleType:
    """``benchmarks/batching/model.py`` as a module (by path: ``batching`` is also this script)."""
    spec = importlib.util.spec_from_file_location("batching_mlp_model", MODEL_FILE)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {MODEL_FILE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dynamic_name(delay_us: int) -> str:
    return "mlp_dynamic" if delay_us == 0 else f"mlp_dynamic_d{delay_us}"


def can_pin() -> bool:
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return False
    return shutil.which("taskset") is not None and {SERVER_CPU, CLIENT_CPU} <= cpus


def pinned(cpu: int, command: list[str], pin: bool) -> list[str]:
    return ["taskset", "-c", str(cpu), *command] if pin else command


def write_repository(repo: Path, delays: Sequence[int]) -> dict[str, str]:
    """One folder per model, all with the same model.py; returns model name -> config text."""
    configs: dict[str, str] = {}
    common = (
        'backend: "python"\n'
        f"max_batch_size: {MAX_BATCH}\n"
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 512 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 10 ] } ]\n'
        "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
    )
    for delay in delays:
        configs[dynamic_name(delay)] = (
            common + f"dynamic_batching {{ max_queue_delay_microseconds: {delay} }}\n"
        )
    configs[SINGLE] = common
    for name, text in configs.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{text}')
        shutil.copyfile(MODEL_FILE, repo / name / "1" / "model.py")
    return configs


def http_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


# ----------------------------------------------------------------------------- server
class Server:
    """``infermux serve`` in its own process group; stderr goes to a log file."""

    def __init__(self, repo: Path, pin: bool, log_path: Path) -> None:
        self.command = pinned(
            SERVER_CPU,
            [
                sys.executable,
                "-m",
                "infermux",
                "serve",
                "--model-repository",
                str(repo),
                "--http-port",
                "0",
                "--grpc-port",
                "0",
                "--metrics-port",
                "0",
            ],
            pin,
        )
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.base_url = ""

    def start(self, timeout: float = 90) -> float:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **THREAD_ENV)
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: killed as a whole in stop()
            )
        while time.monotonic() - started < timeout:
            match = READY.search(self.log_path.read_text(errors="replace"))
            if match:
                self.base_url = f"http://{match.group(1)}:{match.group(2)}"
                return time.monotonic() - started
            if self.process.poll() is not None:
                raise RuntimeError(f"infermux serve exited early:\n{self.log_tail()}")
            time.sleep(0.1)
        raise RuntimeError(f"infermux serve not ready after {timeout} s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> float:
        """SIGTERM to the group, SIGKILL to whatever is left after 15 s."""
        if self.process is None:
            return 0.0
        took = stop_group(self.process, 15)
        self.process = None
        return took


# ----------------------------------------------------------------------------- client (subprocess)
def cpu_ticks() -> dict[str, list[int]]:
    """Per CPU [busy, steal] clock ticks from /proc/stat (busy: user+nice+system+irq+softirq)."""
    out: dict[str, list[int]] = {}
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        name, *values = line.split()
        if name.startswith("cpu") and name != "cpu":
            v = [int(x) for x in values]
            out[name] = [v[0] + v[1] + v[2] + v[5] + v[6], v[7] if len(v) > 7 else 0]
    return out


async def closed_loop(cfg: dict[str, Any]) -> dict[str, Any]:
    """N connections, each: send, await the response, send again. Run in the client process."""
    import aiohttp
    import numpy as np

    mlp = load_model_module()
    rng = np.random.default_rng(7)
    pool = rng.standard_normal((INPUT_POOL, mlp.INPUT_DIM), dtype=np.float32)
    expected = mlp.forward(mlp.build_weights(), pool)
    bodies: list[tuple[bytes, dict[str, str]]] = []
    for row in pool:
        header = {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, mlp.INPUT_DIM],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": row.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
        head = json.dumps(header, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(head)),
        }
        bodies.append((head + row.tobytes(), headers))

    base, model, conc = cfg["url"], cfg["model"], int(cfg["concurrency"])
    infer_url, stats_url = f"{base}/v2/models/{model}/infer", f"{base}/v2/models/{model}/stats"
    begin = time.perf_counter()
    t0 = begin + float(cfg["warmup"])
    t1 = t0 + float(cfg["window"])
    latencies: list[float] = []
    errors = {"window": 0, "total": 0}
    error_samples: list[str] = []
    checks = {"verified": 0, "mismatched": 0, "max_abs_err": 0.0}

    def check(idx: int, status: int, headers: Any, data: bytes) -> None:
        try:
            hlen = int(headers.get("Inference-Header-Content-Length", "-1"))
            head = json.loads(data[:hlen])
            out = head["outputs"][0]
            got = np.frombuffer(data[hlen:], dtype=np.float32).reshape(out["shape"])
            ok = (
                status == 200
                and out["name"] == "OUTPUT0"
                and out["datatype"] == "FP32"
                and list(got.shape) == [1, mlp.OUTPUT_DIM]
            )
            err = float(np.max(np.abs(got[0] - expected[idx]))) if ok else float("inf")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            ok, err = False, float("inf")
            error_samples.append(f"bad response: {exc!r} {data[:200]!r}")
        checks["max_abs_err"] = max(checks["max_abs_err"], err)
        if ok and np.allclose(got[0], expected[idx], rtol=1e-3, atol=1e-4):
            checks["verified"] += 1
        else:
            checks["mismatched"] += 1

    async def worker(session: aiohttp.ClientSession, i: int) -> None:
        idx = i % INPUT_POOL
        body, headers = bodies[idx]
        first = True
        while time.perf_counter() < t1:
            sent = time.perf_counter()
            status, failure = 0, ""
            try:
                async with session.post(infer_url, data=body, headers=headers) as response:
                    data = await response.read()
                    status = response.status
                    if first:
                        check(idx, status, response.headers, data)
                        first = False
                    if status != 200:
                        failure = f"HTTP {status}: {data[:200]!r}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                failure = repr(exc)
            done = time.perf_counter()
            in_window = t0 <= done < t1
            if failure:
                errors["total"] += 1
                errors["window"] += in_window
                if len(error_samples) < 5:
                    error_samples.append(failure)
                await asyncio.sleep(0.01)  # a failing server must not turn this into a busy loop
            elif in_window:
                latencies.append(done - sent)

    async def snapshot(session: aiohttp.ClientSession) -> dict[str, Any]:
        cpu: dict[str, Any] = {
            "at": time.perf_counter(),
            "client_cpu_s": time.process_time(),
            "server_cpu_s": proc_cpu_seconds(int(cfg["server_pid"])),
            "loadavg": os.getloadavg()[0],
            "ticks": cpu_ticks(),
        }
        async with session.get(stats_url) as response:
            cpu["stats"] = stats_counters(await response.json())
        return cpu

    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        aiohttp.ClientSession(timeout=timeout) as control,
    ):
        workers = [asyncio.create_task(worker(session, i)) for i in range(conc)]
        await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        before = await snapshot(control)
        await asyncio.sleep(max(0.0, t1 - time.perf_counter()))
        after = await snapshot(control)
        await asyncio.gather(*workers)

    window = t1 - t0
    d_stats = {k: after["stats"][k] - before["stats"][k] for k in before["stats"]}
    lat_ms = np.asarray(latencies) * 1e3

    def avg_us(key: str) -> float | None:
        n = d_stats[f"{key}_count"]
        return round(d_stats[f"{key}_ns"] / n / 1e3, 1) if n else None

    # Everything else on the machine during the window: CPU busy time not spent by server or client.
    hz = os.sysconf("SC_CLK_TCK")
    busy = sum(after["ticks"][k][0] - before["ticks"][k][0] for k in before["ticks"]) / hz
    steal = sum(after["ticks"][k][1] - before["ticks"][k][1] for k in before["ticks"]) / hz
    client_cpu = (after["client_cpu_s"] - before["client_cpu_s"]) / window
    server_cpu = (after["server_cpu_s"] - before["server_cpu_s"]) / window
    executions = d_stats["execution_count"]
    result: dict[str, Any] = {
        "model": model,
        "concurrency": conc,
        "window_s": round(window, 3),
        "completed": len(latencies),
        "infer_per_s": round(len(latencies) / window, 1),
        "p50_ms": round(float(np.percentile(lat_ms, 50)), 3) if len(lat_ms) else None,
        "p90_ms": round(float(np.percentile(lat_ms, 90)), 3) if len(lat_ms) else None,
        "p99_ms": round(float(np.percentile(lat_ms, 99)), 3) if len(lat_ms) else None,
        "mean_ms": round(float(lat_ms.mean()), 3) if len(lat_ms) else None,
        "errors": errors["window"],
        "errors_total": errors["total"],
        "error_samples": error_samples,
        "avg_batch": round(d_stats["inference_count"] / executions, 2) if executions else None,
        "server_inferences": d_stats["inference_count"],
        "server_executions": executions,
        "server_avg_request_us": avg_us("success"),
        "server_avg_queue_us": avg_us("queue"),
        "server_avg_compute_infer_us": avg_us("compute_infer"),
        "client_cpu": round(client_cpu, 3),
        "server_cpu": round(server_cpu, 3),
        # Cores busy with other processes (tick-granular, so +-0.05 or so) and stolen by the host.
        "other_cpu": round(max(0.0, busy / window - client_cpu - server_cpu), 3),
        "steal_cpu": round(steal / window, 3),
        "loadavg_1m": [round(before["loadavg"], 2), round(after["loadavg"], 2)],
        "verified": checks["verified"],
        "mismatched": checks["mismatched"],
        "max_abs_err": checks["max_abs_err"],
    }
    return result


def client_main(cfg_json: str) -> None:
    cfg = json.loads(cfg_json)
    try:
        import uvloop

        result = uvloop.run(closed_loop(cfg))
        result["event_loop"] = "uvloop"
    except ImportError:
        result = asyncio.run(closed_loop(cfg))
        result["event_loop"] = "asyncio"
    print(json.dumps(result))


def run_client(
    server: Server, model: str, conc: int, *, warmup: float, window: float, pin: bool
) -> dict[str, Any]:
    cfg = {
        "url": server.base_url,
        "model": model,
        "concurrency": conc,
        "warmup": warmup,
        "window": window,
        "server_pid": server.pid,
    }
    command = pinned(CLIENT_CPU, [sys.executable, __file__, "--client", json.dumps(cfg)], pin)
    env = dict(os.environ, **THREAD_ENV)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=warmup + window + 120, env=env
        )
    except subprocess.TimeoutExpired:
        return {"model": model, "concurrency": conc, "error": "client timed out"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stdout + done.stderr)[-1500:]
        return {
            "model": model,
            "concurrency": conc,
            "error": f"client rc={done.returncode}: {tail}",
        }
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# ----------------------------------------------------------------------------- raw ceiling
def raw_main(seconds: float) -> None:
    """``execute`` in a tight loop (run by measure_raw under taskset -c 0, one BLAS thread)."""
    import numpy as np

    import infermux

    mlp = load_model_module()
    model = mlp.Model()
    rng = np.random.default_rng(11)
    x = rng.standard_normal((MAX_BATCH, mlp.INPUT_DIM), dtype=np.float32)
    out: dict[str, Any] = {}
    for batch in RAW_BATCHES:
        # As the dynamic batcher delivers it: `batch` requests of one row each.
        requests = [
            infermux.ModelRequest({"INPUT0": x[i : i + 1]}, ("OUTPUT0",)) for i in range(batch)
        ]
        model.execute(requests)
        rates = []
        for _ in range(3):
            calls, start = 0, time.perf_counter()
            while True:
                model.execute(requests)
                calls += 1
                elapsed = time.perf_counter() - start
                if elapsed >= seconds / 3:
                    break
            rates.append(calls * batch / elapsed)
        out[str(batch)] = {
            "rows_per_s": round(statistics.median(rates), 1),
            "ms_per_execute": round(1e3 * batch / statistics.median(rates), 4),
        }
        # A server is never this hot: between executes it parses HTTP or sits idle, and on a
        # shared VM an idle vCPU loses its caches. Same call, each one after a short sleep.
        if batch in (1, MAX_BATCH):
            times = []
            for _ in range(GAP_CALLS):
                time.sleep(GAP_S)
                start = time.perf_counter()
                model.execute(requests)
                times.append(time.perf_counter() - start)
            out[str(batch)]["ms_per_execute_after_gap"] = round(1e3 * statistics.median(times), 4)
    blas: Any = None
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
    except (TypeError, KeyError):
        pass
    print(json.dumps({"by_batch": out, "numpy_blas": blas}))


def measure_raw(seconds: float, pin: bool) -> dict[str, Any]:
    command = pinned(
        SERVER_CPU, [sys.executable, __file__, "--raw", "--raw-seconds", str(seconds)], pin
    )
    env = dict(os.environ, **THREAD_ENV)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        return {"error": done.stderr[-1500:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# ----------------------------------------------------------------------------- environment
def machine_info(pin: bool) -> dict[str, Any]:
    return benchkit.machine_info(
        pinned=pin,
        server_cpu=SERVER_CPU if pin else None,
        client_cpu=CLIENT_CPU if pin else None,
    )


def versions() -> dict[str, str]:
    out = {}
    for package in ("infermux", "numpy", "aiohttp", "uvloop", "uvicorn", "httptools", "orjson"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def git_info() -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip()

    digest = hashlib.sha256()
    for path in sorted((ROOT / "src" / "infermux" / "scheduling").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": git("status", "--porcelain", "--untracked-files=no").splitlines(),
        # The scheduler is being rewritten: which scheduling sources this run served with.
        "scheduling_sha256": digest.hexdigest()[:16],
    }


# ----------------------------------------------------------------------------- summary
def median_of(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(
    measurements: list[dict[str, Any]], models: list[str], conc: list[int]
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for model in models:
        summary[model] = {}
        for c in conc:
            rounds = [m for m in measurements if m["model"] == model and m["concurrency"] == c]
            ok = [r for r in rounds if "infer_per_s" in r]
            if not ok:
                summary[model][str(c)] = {"error": rounds[-1].get("error") if rounds else "no data"}
                continue
            rates = [r["infer_per_s"] for r in ok]
            cell: dict[str, Any] = {
                key: median_of(ok, key)
                for key in (
                    "infer_per_s",
                    "avg_batch",
                    "p50_ms",
                    "p90_ms",
                    "p99_ms",
                    "client_cpu",
                    "server_cpu",
                    "other_cpu",
                    "steal_cpu",
                    "server_avg_queue_us",
                    "server_avg_compute_infer_us",
                )
            }
            # CPU time per inference: robust to other tenants stealing wall time on a shared machine.
            for side in ("client", "server"):
                per = [1e6 * r[f"{side}_cpu"] / r["infer_per_s"] for r in ok if r["infer_per_s"]]
                cell[f"{side}_cpu_us_per_infer"] = round(statistics.median(per), 1) if per else None
            cell["spread_pct"] = round(100 * (max(rates) - min(rates)) / statistics.mean(rates), 1)
            cell["errors"] = sum(r["errors"] for r in ok)
            cell["rounds"] = len(ok)
            summary[model][str(c)] = cell
    return summary


def ceilings(raw: dict[str, Any]) -> dict[str, float]:
    """Rows/s per batch size: mean of the before/after measurements that succeeded."""
    out: dict[str, float] = {}
    for batch in RAW_BATCHES:
        values = [
            run["by_batch"][str(batch)]["rows_per_s"]
            for run in (raw.get("before", {}), raw.get("after", {}))
            if "by_batch" in run
        ]
        if values:
            out[str(batch)] = round(statistics.mean(values), 1)
    return out


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def blas_name(blas: Any) -> str:
    if not isinstance(blas, dict):
        return "?"
    return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()


def write_md(doc: dict[str, Any], path: Path) -> None:
    cfg, mi, raw = doc["config"], doc["machine"], doc["raw_in_process"]
    ceiling = raw.get("ceiling_rows_per_s", {})
    summary = doc["summary"]
    dynamic = [dynamic_name(d) for d in cfg["delay_us"]]
    lines = ["# Dynamic batching benchmark (numpy MLP over HTTP, binary tensors)\n"]
    lines.append(
        f"- Machine: {mi['cpu_model']}, {mi['nproc']} CPUs, {mi['platform']}, Python {mi['python']}; "
        f"load average (1 min) at start / end: {mi['loadavg_start'][0]} / {mi.get('loadavg_end', ['?'])[0]} "
        "(shared machine: quote ratios, not absolute numbers)."
    )
    pin = (
        f"server pinned to CPU {mi['server_cpu']}, client process to CPU {mi['client_cpu']}"
        if mi["pinned"]
        else "NOT pinned (taskset or 2 CPUs unavailable)"
    )
    lines.append(
        f"- Model: FP32 MLP 512 → 1024 → 1024 → 10 (ReLU), numpy, one BLAS thread, one instance, "
        f"max_batch_size {MAX_BATCH}; {pin}."
    )
    lines.append(
        f"- Load: closed loop, N in flight (aiohttp + {doc.get('client_event_loop', 'uvloop')}, one "
        f"keep-alive connection per request in flight), V2 binary tensors; {cfg['warmup_s']} s warm-up "
        f"+ {cfg['window_s']} s window per cell; models alternated per cell (order flipped each cell "
        f"and round); median of {cfg['rounds']} rounds. `avg batch` = Δinference_count / "
        "Δexecution_count from `/v2/models/<m>/stats` over the window."
    )
    v, g = doc["versions"], doc["git"]
    lines.append(
        "- Versions: "
        + ", ".join(f"{k} {v[k]}" for k in v)
        + f"; numpy BLAS {blas_name(raw.get('before', {}).get('numpy_blas'))}; git {g['commit'][:10]}"
        + (f" (dirty: {', '.join(g['dirty'])})" if g["dirty"] else "")
        + f", scheduling sources sha256 {g['scheduling_sha256']}.\n"
    )

    lines.append("## Raw in-process ceiling (execute() in a loop, CPU 0, no server)\n")
    lines.append(
        f"`after {GAP_S * 1e3:g} ms idle` = median time of one execute that follows a "
        f"{GAP_S * 1e3:g} ms sleep (mean of before/after): what a server that does other work "
        "between batches can expect when caches go cold.\n"
    )
    lines.append(
        f"| batch | rows/s (mean) | before | after | ms / execute | ms / execute after "
        f"{GAP_S * 1e3:g} ms idle |"
    )
    lines.append("|---:|---:|---:|---:|---:|---:|")
    for batch in RAW_BATCHES:
        key = str(batch)
        before = raw.get("before", {}).get("by_batch", {}).get(key, {})
        after = raw.get("after", {}).get("by_batch", {}).get(key, {})
        mean = ceiling.get(key)
        gaps = [
            r["ms_per_execute_after_gap"]
            for r in (before, after)
            if "ms_per_execute_after_gap" in r
        ]
        gap = statistics.mean(gaps) if gaps else None
        lines.append(
            f"| {batch} | {fmt(mean, ',.0f')} | {fmt(before.get('rows_per_s'), ',.0f')} | "
            f"{fmt(after.get('rows_per_s'), ',.0f')} | "
            f"{fmt(batch * 1e3 / mean if mean else None, '.3f')} | {fmt(gap, '.3f')} |"
        )
    lines.append("")

    lines.append("## Throughput and latency\n")
    lines.append(
        "`x single` = infer/s ÷ mlp_single's infer/s at the same concurrency. `% ceiling` = infer/s ÷ "
        "the raw rows/s at batch 1 (for mlp_single) or batch 32 (dynamic models). `client` / `server` "
        "CPU = cores used (1.00 = one full core); `other CPU` = cores used by anything else on the "
        "machine during the window (other tenants: the server and client compete with it); `server CPU us/infer` = server CPU time per inference. `spread` = (max - min) / mean of infer/s over rounds.\n"
    )
    lines.append(
        "| c | model | infer/s | x single | % ceiling | avg batch | p50 ms | p90 ms | p99 ms | "
        "client CPU | server CPU | other CPU | server CPU us/infer | spread | errors |"
    )
    lines.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in cfg["concurrency"]:
        base = summary.get(SINGLE, {}).get(str(c), {}).get("infer_per_s")
        for model in [SINGLE, *dynamic]:
            cell = summary.get(model, {}).get(str(c), {})
            if "infer_per_s" not in cell:
                lines.append(f"| {c} | {model} | ERROR: {cell.get('error', '?')} |")
                continue
            rate = cell["infer_per_s"]
            top = ceiling.get("1" if model == SINGLE else str(MAX_BATCH))
            lines.append(
                f"| {c} | {model} | {rate:,.0f} | {fmt(rate / base if base else None, '.2f')} | "
                f"{fmt(100 * rate / top if top else None, '.0f')}% | {fmt(cell['avg_batch'], '.2f')} | "
                f"{fmt(cell['p50_ms'], '.2f')} | {fmt(cell['p90_ms'], '.2f')} | "
                f"{fmt(cell['p99_ms'], '.2f')} | {fmt(cell['client_cpu'], '.2f')} | "
                f"{fmt(cell['server_cpu'], '.2f')} | {fmt(cell.get('other_cpu'), '.2f')} | "
                f"{fmt(cell.get('server_cpu_us_per_infer'), ',.0f')} | "
                f"{cell['spread_pct']:.0f}% | {cell['errors']} |"
            )
    lines.append("")

    notes = doc.get("notes", [])
    if notes:
        lines.append("## Observations (computed from the numbers above)\n")
        lines.extend(f"- {note}" for note in notes)
        lines.append("")
    lines.append("## Checks\n")
    lines.append(
        f"- Responses checked against the model computed in the client: {doc['checks']['verified']} "
        f"verified, {doc['checks']['mismatched']} mismatched (max |Δ| {doc['checks']['max_abs_err']:.2e})."
    )
    lines.append(
        f"- Server start-up {doc['server']['startup_s']} s, stop {doc['server']['stop_s']} s; "
        f"total wall time {doc['wall_s']} s."
    )
    path.write_text("\n".join(lines) + "\n")


def observations(doc: dict[str, Any]) -> list[str]:
    """Plain statements derived from the summary: peaks, batching gain, saturation, contention."""
    cfg, summary = doc["config"], doc["summary"]
    ceiling = doc["raw_in_process"].get("ceiling_rows_per_s", {})
    concs: list[int] = cfg["concurrency"]
    notes: list[str] = []
    single = summary.get(SINGLE, {})
    slower = [b for b in RAW_BATCHES[1:] if ceiling.get(str(b), float("inf")) < ceiling.get("1", 0)]
    if slower:
        notes.append(
            f"Raw ceiling: batches of {slower} rows run fewer rows/s than batch 1 (numpy sends one "
            "row to a matrix-vector kernel and more rows to sgemm, which is slow for a few rows), "
            "so small dynamic batches can lose to no batching."
        )
    for model, cells in summary.items():
        ok = {c: cells[str(c)] for c in concs if cells[str(c)].get("infer_per_s")}
        if not ok:
            continue
        best = max(ok, key=lambda c: ok[c]["infer_per_s"])
        top = ceiling.get("1" if model == SINGLE else str(MAX_BATCH))
        share = f", {100 * ok[best]['infer_per_s'] / top:.0f}% of the raw ceiling" if top else ""
        notes.append(
            f"{model}: peak {ok[best]['infer_per_s']:,.0f} infer/s at c = {best} "
            f"(avg batch {ok[best]['avg_batch']}{share})."
        )
        if model != SINGLE:
            ratios = {
                c: ok[c]["infer_per_s"] / single[str(c)]["infer_per_s"]
                for c in ok
                if single.get(str(c), {}).get("infer_per_s")
            }
            if ratios:
                listed = ", ".join(f"c={c}: {r:.2f}" for c, r in ratios.items())
                notes.append(f"{model} / {SINGLE} infer/s: {listed}.")
        # Who runs out first: CPU per inference -> what one full core could sustain.
        c = max(ok)
        for side in ("client", "server"):
            per = ok[c].get(f"{side}_cpu_us_per_infer")
            used = ok[c].get(f"{side}_cpu")
            if per:
                notes.append(
                    f"{model}, c = {c}: the {side} uses {used:.2f} core, {per:,.0f} us CPU per "
                    f"inference, i.e. one full {side} core would sustain ~{1e6 / per:,.0f} infer/s."
                )
        stolen = [c for c in concs if (cells[str(c)].get("steal_cpu") or 0) >= 0.05]
        if stolen:
            notes.append(
                f"{model}: the hypervisor stole >= 0.05 core (median of rounds) at c = {stolen}."
            )
        busy = [c for c in concs if (cells[str(c)].get("other_cpu") or 0) >= 0.3]
        if busy:
            notes.append(
                f"{model}: other processes used >= 0.3 core during c = {busy}; those cells are "
                "contended (compare `server CPU us/infer` rather than infer/s there)."
            )
    return notes


# ----------------------------------------------------------------------------- main
def parse_ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def terminate(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through `finally`, which stops the server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds per cell; the median is kept")
    parser.add_argument("--window", type=float, default=4.0, help="seconds measured per cell")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of load before each window"
    )
    parser.add_argument(
        "--concurrency",
        type=parse_ints,
        default=[1, 2, 4, 8, 16, 32, 64],
        help="requests in flight, comma-separated (default 1,2,4,8,16,32,64)",
    )
    parser.add_argument(
        "--delay-us",
        type=parse_ints,
        default=[0],
        help="max_queue_delay_microseconds values; one dynamic model each (e.g. 0,2000)",
    )
    parser.add_argument(
        "--raw-seconds", type=float, default=1.0, help="per batch size, raw ceiling"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "batching.json",
        help="JSON results path; the .md summary goes beside it",
    )
    parser.add_argument("--md-only", action="store_true", help="re-render the .md from --out")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args.client)
        return
    if args.raw:
        raw_main(args.raw_seconds)
        return
    if args.md_only:
        saved: dict[str, Any] = json.loads(args.out.read_text())
        saved["notes"] = observations(saved)
        write_md(saved, args.out.with_suffix(".md"))
        return

    signal.signal(signal.SIGTERM, terminate)
    pin = can_pin()
    if pin:
        os.sched_setaffinity(0, {CLIENT_CPU})  # keep this driver off the server's core
    delays = sorted(set(args.delay_us))
    models = [SINGLE, *(dynamic_name(d) for d in delays)]
    started = time.time()
    doc: dict[str, Any] = {
        "benchmark": "batching",
        "machine": machine_info(pin),
        "versions": versions(),
        "git": git_info(),
        "config": {
            "rounds": args.rounds,
            "window_s": args.window,
            "warmup_s": args.warmup,
            "concurrency": args.concurrency,
            "delay_us": delays,
            "models": models,
            "max_batch_size": MAX_BATCH,
            "input_pool": INPUT_POOL,
            "thread_env": THREAD_ENV,
            "raw_seconds_per_batch": args.raw_seconds,
        },
    }
    print("raw in-process ceiling (before) ...", flush=True)
    raw: dict[str, Any] = {"before": measure_raw(args.raw_seconds, pin)}
    print(json.dumps(raw["before"]), flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="infermux-batching-"))
    measurements: list[dict[str, Any]] = []
    server = Server(tmp / "repo", pin, tmp / "server.log")
    try:
        doc["model_configs"] = write_repository(tmp / "repo", delays)
        startup = server.start()
        print(
            f"server ready at {server.base_url} in {startup:.1f} s (pid {server.pid})", flush=True
        )
        doc["server"] = {"command": " ".join(server.command), "startup_s": round(startup, 2)}
        for rnd in range(args.rounds):
            for index, conc in enumerate(args.concurrency):
                order = models if (rnd + index) % 2 == 0 else models[::-1]
                for model in order:
                    result = run_client(
                        server, model, conc, warmup=args.warmup, window=args.window, pin=pin
                    )
                    result["round"] = rnd
                    measurements.append(result)
                    print(
                        f"[round {rnd}] {model:20s} c={conc:<3d} "
                        f"infer/s={result.get('infer_per_s', 'ERR'):>8} "
                        f"batch={result.get('avg_batch')} p50={result.get('p50_ms')} "
                        f"p99={result.get('p99_ms')} client_cpu={result.get('client_cpu')} "
                        f"server_cpu={result.get('server_cpu')} err={result.get('errors', result.get('error'))}",
                        flush=True,
                    )
                    if not server.alive():
                        raise RuntimeError(f"server died:\n{server.log_tail()}")
                    if result.get("mismatched"):
                        raise RuntimeError(f"wrong model output from the server: {result}")
                    time.sleep(0.3)
    finally:
        doc.setdefault("server", {})["stop_s"] = round(server.stop(), 2)
        doc["server"]["log_tail"] = server.log_tail(2000)
        shutil.rmtree(tmp, ignore_errors=True)

    print("raw in-process ceiling (after) ...", flush=True)
    raw["after"] = measure_raw(args.raw_seconds, pin)
    print(json.dumps(raw["after"]), flush=True)
    raw["ceiling_rows_per_s"] = ceilings(raw)
    doc["raw_in_process"] = raw
    doc["machine"]["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    doc["client_event_loop"] = next(
        (m["event_loop"] for m in measurements if "event_loop" in m), None
    )
    doc["checks"] = {
        "verified": sum(m.get("verified", 0) for m in measurements),
        "mismatched": sum(m.get("mismatched", 0) for m in measurements),
        "max_abs_err": max((m.get("max_abs_err", 0.0) for m in measurements), default=0.0),
    }
    doc["summary"] = summarize(measurements, models, args.concurrency)
    doc["notes"] = observations(doc)
    doc["measurements"] = measurements
    doc["wall_s"] = round(time.time() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    write_md(doc, args.out.with_suffix(".md"))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')} in {doc['wall_s']} s", flush=True)


if __name__ == "__main__":
    main()
