"""GPU serving benchmark: infermux against LitServe and plain FastAPI on the same TorchScript models,
with the raw in-process ceiling beside them. One run writes ``OUT/gpu_bench.json`` and
``OUT/gpu_bench.md``; the JSON is rewritten after every point, so a run cut short keeps its data.

    python benchmarks/gpu/run.py --out DIR [--models resnet50,bert] [--servers infermux,litserve,fastapi]
                                 [--protocols grpc_shm,grpc,http] [--concurrency 1,16,64,256]
                                 [--window 5] [--device cuda|cpu] [--tiny] [--profile]
    python benchmarks/gpu/run.py --device cpu --tiny --window 2 --concurrency 1,4 --out /tmp/gpubench

Per model: (a) ``raw.py`` exports the model into a Triton-layout repository and measures the ceiling
in a subprocess; then, for each server in turn, (b) start it (own process group, 127.0.0.1), wait
until ready, warm it up, and (c) run a closed-loop point per protocol and concurrency (loadgen.py)
while sampling GPU utilisation and memory (NVML, every 100 ms) and the server's CPU time; infermux's
``/v2/models/M/stats`` delta gives the batch sizes it formed. Servers are stopped by killing their
process group, also on errors and Ctrl-C. README.md beside this file has the GPU-box commands.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from clients import Target
from loadgen import run_point
from nvml import Nvml, Sampler
from procs import cpu_seconds, get_json
from readings import (
    finish_profiler,
    git_commit,
    machine,
    start_profiler,
    stats_counters,
    stats_delta,
    versions,
)
from report import write_md
from servers import PROTOCOLS, SERVERS, Server, start_infermux, start_peer
from specs import MODELS, model_spec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
POINT_OVERHEAD_S = 1.5  # client start-up and drain per point (seen: 0.6 s on 2 slow cores)


class Clock:
    """Elapsed-time stamps on every progress line, and the deadline check."""

    def __init__(self, deadline: float) -> None:
        self.start = time.monotonic()
        self.deadline = deadline

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def log(self, message: str) -> None:
        now = datetime.datetime.now().strftime("%H:%M:%S")
        print(f"[{now} +{self.elapsed():6.1f}s] {message}", flush=True)

    def allows(self, seconds: float) -> bool:
        return self.elapsed() + seconds <= self.deadline


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.clock = Clock(args.deadline)
        self.nvml = Nvml()
        self.frontends: dict[str, int] = {}  # server label -> infermux --frontends
        self.out: Path = args.out
        self.work = Path(tempfile.mkdtemp(prefix="infermux-gpubench-"))
        self.doc: dict[str, Any] = {
            "benchmark": "gpu",
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join([sys.executable, *sys.argv]),
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": machine(),
            "gpu": self.nvml.info(),
            "versions": versions(),
            "git": git_commit(),
            "models": {},
        }

    # ------------------------------------------------------------------------- output
    def save(self) -> None:
        self.doc["wall_s"] = round(self.clock.elapsed(), 1)
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "gpu_bench.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1) + "\n")
        tmp.replace(path)  # never a half-written file if the run is killed
        write_md(self.doc, self.out / "gpu_bench.md")

    # ------------------------------------------------------------------------- per model
    def run_model(self, model: str) -> None:
        args = self.args
        entry: dict[str, Any] = {"servers": {}}
        self.doc["models"][model] = entry
        self.clock.log(f"{model}: export + raw in-process ceiling (subprocess)")
        entry["raw"] = self.raw(model)
        self.save()
        if "error" in entry["raw"]:
            self.clock.log(
                f"{model}: raw step failed, skipping its servers:\n{entry['raw']['error']}"
            )
            return
        raw = entry["raw"]
        self.clock.log(
            f"{model}: ceiling {raw['ceiling_items_per_s']:,.0f} items/s, "
            f"batch-1 {raw['b1_latency_ms']:.3f} ms, export {raw['export_s']} s"
        )
        for name, kind, frontends in server_runs(args):
            protocols = [p for p in args.protocols if p in PROTOCOLS[kind]] or list(PROTOCOLS[kind])
            if not self.clock.allows(20 + args.warmup + args.window + POINT_OVERHEAD_S):
                entry["servers"][name] = {"skipped": "deadline"}
                self.clock.log(f"{model}/{name}: skipped (deadline)")
                continue
            self.frontends[name] = frontends
            entry["servers"][name] = self.run_server(model, name, protocols)
            self.save()

    def raw(self, model: str) -> dict[str, Any]:
        args = self.args
        command = [
            sys.executable,
            str(HERE / "raw.py"),
            "--model",
            model,
            "--repo",
            str(self.work / "repos" / model),
            "--ref-dir",
            str(self.work / "ref"),
            "--device",
            args.device,
            "--instances",
            str(args.instances),
            "--gpus",
            args.gpus,
            "--queue-delay-us",
            str(args.queue_delay_us),
            "--streams",
            str(args.instances),
            "--seconds",
            str(args.raw_seconds),
            "--cuda-graphs" if args.cuda_graphs else "--no-cuda-graphs",
        ]
        if args.tiny:
            command.append("--tiny")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as exc:
            return {"error": f"raw.py timed out: {exc}"}
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            return {"error": f"raw.py rc={done.returncode}: {done.stderr[-3000:]}"}
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    # ------------------------------------------------------------------------- per server
    def run_server(self, model: str, name: str, protocols: list[str]) -> dict[str, Any]:
        args = self.args
        log = self.work / f"{model}-{name}.log"
        baseline = self.nvml.device_used_mib()
        entry: dict[str, Any] = {"points": [], "device_used_before_mib": baseline}
        server: Server | None = None
        self.clock.log(f"{model}/{name}: starting")
        try:
            server = self.start(model, name, log)
            entry["info"] = server.info
            self.clock.log(f"{model}/{name}: ready in {server.info['startup_s']} s")
            entry["memory_ready"] = self.server_memory(server, baseline)
            if args.server_warmup > 0:
                top = max(args.concurrency)
                warm = run_point(
                    self.target(model, server, protocols[0]),
                    top,
                    self.client_procs(top),
                    warmup=0,
                    window=args.server_warmup,
                )
                entry["warmup"] = {
                    k: warm.get(k) for k in ("items_per_s", "errors", "error", "mismatched")
                }
            entry["memory_after_warmup"] = self.server_memory(server, baseline)
            # infermux's own accounting: weights, buffers, graph pools, staging
            if name.startswith("infermux"):
                try:
                    stats = get_json(f"{server.http_url}/v2/models/{model}/stats")
                    entry["infermux_memory_usage"] = stats["model_stats"][0].get("memory_usage")
                except Exception as exc:
                    entry["infermux_memory_usage"] = repr(exc)
            for protocol in protocols:
                for conc in args.concurrency:
                    if not self.clock.allows(args.warmup + args.window + POINT_OVERHEAD_S):
                        entry["points"].append(
                            {"protocol": protocol, "concurrency": conc, "skipped": "deadline"}
                        )
                        continue
                    point = self.point(model, server, protocol, conc, baseline)
                    entry["points"].append(point)
                    self.report_point(model, name, point)
                    self.save()
                    if not server.process.alive():
                        raise RuntimeError(f"{name} died:\n{server.process.log_tail()}")
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            self.clock.log(f"{model}/{name}: ERROR {entry['error']}")
        finally:
            if server is not None:
                entry["stop_s"] = round(server.process.stop(), 2)
                entry["log_tail"] = server.process.log_tail(2000)
        return entry

    def start(self, model: str, name: str, log: Path) -> Server:
        args = self.args
        if name in self.frontends and name.startswith("infermux"):
            return start_infermux(
                self.work / "repos" / model,
                model,
                log,
                frontends=self.frontends[name],
                executors=args.executors,
            )
        spec = model_spec(model, args.tiny)
        return start_peer(
            name,
            model,
            self.work / "repos" / model / model / "1" / "model.pt",
            log,
            device=args.device,
            tiny=args.tiny,
            workers=args.litserve_workers,
            max_batch=min(args.litserve_max_batch, spec.max_batch_size),
            batch_timeout=args.litserve_batch_timeout,
        )

    def target(self, model: str, server: Server, protocol: str) -> Target:
        return Target(
            protocol=protocol,
            model=model,
            tiny=self.args.tiny,
            ref_dir=str(self.work / "ref"),
            http_url=server.http_url,
            grpc_target=server.grpc_target,
            grpc_client=self.args.grpc_client,
            http_client=self.args.http_client,
        )

    def client_procs(self, concurrency: int) -> int:
        return int(self.args.client_procs or min(8, concurrency))

    def server_memory(self, server: Server, baseline: float | None) -> dict[str, Any]:
        used = self.nvml.device_used_mib()
        return {
            "process_mib": self.nvml.process_mib(server.process.pids()),
            "device_delta_mib": (
                round(used - baseline, 1) if used is not None and baseline is not None else None
            ),
        }

    # ------------------------------------------------------------------------- per point
    def point(
        self, model: str, server: Server, protocol: str, conc: int, baseline: float | None
    ) -> dict[str, Any]:
        args = self.args
        sampler = Sampler(self.nvml, server.process.pids)
        marks: dict[str, Any] = {}
        stats_url = (
            f"{server.http_url}/v2/models/{model}/stats" if server.name == "infermux" else ""
        )
        profile = (
            args.profile
            and server.name == "infermux"
            and protocol == "grpc"
            and conc == max(args.concurrency)
        )

        def snapshot() -> dict[str, Any]:
            snap: dict[str, Any] = {"cpu": cpu_seconds(server.process.pids())}
            if stats_url:
                try:
                    snap["stats"] = stats_counters(get_json(stats_url))
                except Exception as exc:
                    snap["stats_error"] = repr(exc)
            return snap

        def on_start() -> None:
            marks["before"] = snapshot()
            marks["t0"] = time.monotonic()
            sampler.start()
            if profile:
                marks["profiler"] = start_profiler(server, self.out, model, conc, args.window)

        def on_end() -> None:
            marks["gpu"] = sampler.stop()
            marks["after"] = snapshot()
            marks["t1"] = time.monotonic()

        result = run_point(
            self.target(model, server, protocol),
            conc,
            self.client_procs(conc),
            warmup=args.warmup,
            window=args.window,
            on_start=on_start,
            on_end=on_end,
        )
        point: dict[str, Any] = {"protocol": protocol, "concurrency": conc, **result}
        if "before" in marks and "after" in marks:
            span = marks["t1"] - marks["t0"]
            point["server_cpu"] = round((marks["after"]["cpu"] - marks["before"]["cpu"]) / span, 3)
            point.update(marks["gpu"])
            used = point.get("device_used_max_mib")
            point["device_delta_max_mib"] = (
                round(used - baseline, 1) if used is not None and baseline is not None else None
            )
            if "stats" in marks["before"] and "stats" in marks["after"]:
                point.update(stats_delta(marks["before"]["stats"], marks["after"]["stats"]))
        if "profiler" in marks:
            point["profile"] = finish_profiler(marks["profiler"], args.window)
        return point

    def report_point(self, model: str, name: str, point: dict[str, Any]) -> None:
        if "error" in point:
            self.clock.log(
                f"{model}/{name}/{point['protocol']} c={point['concurrency']}: ERROR {point['error']}"
            )
            return
        self.clock.log(
            f"{model}/{name}/{point['protocol']:9s} c={point['concurrency']:<4d} "
            f"{point['items_per_s']:>9,.1f}/s p50={point['p50_ms']} p99={point['p99_ms']} ms "
            f"err={point['errors']} bad={point['mismatched']} batch={point.get('avg_batch')} "
            f"gpu={point.get('gpu_util_mean')}% cpu s/c={point.get('server_cpu')}/"
            f"{point['client_cpu']}"
        )


def server_runs(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(label, server kind, front-end processes) of every server run: infermux once per
    ``--frontends`` value (labelled ``infermux-fN`` when more than the default is asked)."""
    runs = []
    for kind in args.servers:
        if kind != "infermux":
            runs.append((kind, kind, 1))
        elif args.frontends == [1]:
            runs.append(("infermux", kind, 1))
        else:
            runs.extend((f"infermux-f{n}", kind, n) for n in args.frontends)
    return runs


def estimate_s(args: argparse.Namespace) -> float:
    """Rough wall time of the requested run, printed up front."""
    points = 0
    runs = server_runs(args)
    for _, kind, _ in runs:
        protocols = [p for p in args.protocols if p in PROTOCOLS[kind]] or PROTOCOLS[kind]
        points += len(protocols) * len(args.concurrency)
    per_model = (
        30  # export + raw
        + len(runs) * (15 + args.server_warmup)
        + points * (args.warmup + args.window + POINT_OVERHEAD_S)
    )
    return float(per_model * len(args.models))


# ----------------------------------------------------------------------------- main
def csv(choices: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        items = [part.strip() for part in text.split(",") if part.strip()]
        bad = [item for item in items if item not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)} (got {text!r})")
        return items

    return parse


def ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu")
    p.add_argument("--models", type=csv(MODELS), default=list(MODELS))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="ResNet-18 at 64x64 and a 2-layer BERT")
    p.add_argument("--concurrency", type=ints, default=[1, 16, 64, 256])
    p.add_argument("--window", type=float, default=5.0, help="seconds measured per point")
    p.add_argument("--warmup", type=float, default=1.5, help="seconds of load before each window")
    p.add_argument("--servers", type=csv(SERVERS), default=list(SERVERS))
    p.add_argument(
        "--protocols",
        type=csv(("grpc_shm", "grpc", "http")),
        default=["grpc_shm", "grpc", "http"],
        help="infermux's protocols (the peers always use their JSON route)",
    )
    p.add_argument("--instances", type=int, default=4, help="infermux instance_group count")
    p.add_argument(
        "--frontends",
        type=ints,
        default=[1],
        help="infermux --frontends values, each a server run (e.g. 1,2,4,8)",
    )
    p.add_argument(
        "--gpus", default="", help="instance_group gpus (e.g. 0,1: --instances on each GPU)"
    )
    p.add_argument("--executors", type=int, default=1, help="infermux --executors")
    p.add_argument("--queue-delay-us", type=int, default=500, help="max_queue_delay_microseconds")
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write optimization { cuda { graphs: true } } into config.pbtxt",
    )
    p.add_argument("--client-procs", type=int, default=0, help="default: min(8, concurrency)")
    p.add_argument("--grpc-client", choices=("stub", "tritonclient"), default="stub")
    p.add_argument("--http-client", choices=("aiohttp", "tritonclient"), default="aiohttp")
    p.add_argument("--litserve-workers", type=int, default=4, help="workers_per_device")
    p.add_argument("--litserve-max-batch", type=int, default=64)
    p.add_argument("--litserve-batch-timeout", type=float, default=0.005, help="seconds")
    p.add_argument("--raw-seconds", type=float, default=2.0, help="per raw throughput reading")
    p.add_argument(
        "--server-warmup", type=float, default=3.0, help="seconds of load after each start"
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=540.0,
        help="seconds; points that would end later are skipped (the GPU box kills at 600)",
    )
    p.add_argument("--profile", action="store_true", help="py-spy infermux at max-c gRPC")
    p.add_argument("--keep-workdir", action="store_true", help="keep repositories and logs")
    return p.parse_args()


def terminate(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the `finally` that stops the server


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, terminate)
    bench = Bench(args)
    bench.clock.log(
        f"models {args.models}, servers {args.servers}, protocols {args.protocols}, "
        f"c {args.concurrency}, device {args.device}{' (tiny)' if args.tiny else ''}; "
        f"estimated {estimate_s(args):.0f} s, deadline {args.deadline:.0f} s; "
        f"NVML: {'yes' if bench.nvml.available else bench.nvml.error}; work dir {bench.work}"
    )
    try:
        for model in args.models:
            bench.run_model(model)
    finally:
        bench.save()
        if args.keep_workdir:
            bench.clock.log(f"work dir kept: {bench.work}")
        else:
            shutil.rmtree(bench.work, ignore_errors=True)
    bench.clock.log(f"wrote {args.out / 'gpu_bench.json'} and gpu_bench.md")


if __name__ == "__main__":
    main()
