"""GPU serving benchmark: infermux against LitServe and plain FastAPI on the same TorchScript models,
with the raw in-process ceiling beside them. One run writes ``OUT/gpu_bench.json`` and
``OUT/gpu_bench.md``; the JSON is rewritten after every point, so a run cut short keeps its data.

    python benchmarks/gpu/run.py --out DIR [--models resnet50,bert] [--servers infermux,litserve,fastapi]
                                 [--protocols grpc_shm,grpc,http,pa_grpc_shm,pa_grpc_cuda_shm,pa_grpc,pa_http]
                                 [--concurrency 1,16,64,256] [--window 5] [--device cuda|cpu]
                                 [--tiny] [--profile] [--frontends 4]
    python benchmarks/gpu/run.py --device cpu --tiny --window 2 --concurrency 1,4 --out /tmp/gpubench

Per model: (a) ``raw.py`` exports the model into a Triton-layout repository and measures the ceiling
in a subprocess; then, for each server in turn, (b) start it (own process group, 127.0.0.1), wait
until ready, warm it up, and (c) run a point per protocol and concurrency: closed-loop load from
loadgen.py (``grpc_shm``, ``grpc``, ``http``; the peers' ``http_json``) or one perf_analyzer run
(``pa_*``, perfanalyzer.py), while window.py samples GPU utilisation and memory (NVML, every
100 ms), the server's CPU time per process role and executor thread, and infermux's
``/v2/models/M/stats`` delta (the batch sizes it formed). With ``--profile``, one more run at the
highest concurrency of ``--profile-protocol`` has py-spy record the whole server process group.
Servers are stopped by killing their process group, also on errors and Ctrl-C. README.md beside
this file has the GPU-box commands.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import cprofiling
import cpuroles
import gputrace
import perfanalyzer
import pyspy
from clients import SharedRegions, Target
from loadgen import run_point
from nvml import Nvml
from procs import get_json
from readings import git_commit, machine, padding, versions
from report import write_md
from servers import PROTOCOLS, SERVERS, Server, start_infermux, start_peer
from specs import MODELS, load_reference, model_spec, with_graphs
from window import Window

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
POINT_OVERHEAD_S = 1.5  # client start-up and drain per point (seen: 0.6 s on 2 slow cores)
SERVER_OVERHEAD_S = 15.0  # start-up and stop of one server (seen: 8-12 s on the H200 box)
RAW_S = 30.0  # export + raw ceiling (seen: 24 s for ResNet-50 on the H200 box)
FILES_TGZ = "gpu_bench_files.tgz"  # perf_analyzer CSVs and logs, its input data, server logs
PROFILE_SUMMARY = "pyspy_summary.txt"
TUNING_PREFIX = "INFERMUX_BENCH_"  # benchmarks/gpu/tuning_hook's variables


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
        self.files = self.work / "files"  # packed into OUT/gpu_bench_files.tgz
        self.files.mkdir()
        self.summaries: list[str] = []  # py-spy text summaries, OUT/pyspy_summary.txt
        self.pa: list[str] | None = None
        self.doc: dict[str, Any] = {
            "benchmark": "gpu",
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join([sys.executable, *sys.argv]),
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": machine(),
            "gpu": self.nvml.info(),
            "versions": versions(),
            "git": git_commit(),
            # The tuning hook's variables (benchmarks/gpu/tuning_hook), so that a variant's
            # result says which it was: the server has no such settings.
            "tuning": {k: v for k, v in sorted(os.environ.items()) if k.startswith(TUNING_PREFIX)},
            "models": {},
        }
        if any(p in perfanalyzer.PROTOCOLS for p in args.protocols):
            self.pa, how = perfanalyzer.locate(args.perf_analyzer, ROOT)
            self.doc["perf_analyzer"] = {"argv": self.pa, "found": how}
            if not self.pa:
                # Asked for by name: a run without its client would only measure the raw model
                # (and cost a device call) -- stop before anything starts.
                raise SystemExit(f"{how} (needed by --protocols {','.join(args.protocols)})")
            done = subprocess.run([*self.pa, "--version"], capture_output=True, text=True)
            self.doc["perf_analyzer"]["version"] = (done.stdout + done.stderr).strip()

    # ------------------------------------------------------------------------- output
    def save(self, pack: bool = False) -> None:
        self.doc["wall_s"] = round(self.clock.elapsed(), 1)
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "gpu_bench.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1) + "\n")
        tmp.replace(path)  # never a half-written file if the run is killed
        write_md(self.doc, self.out / "gpu_bench.md")
        if self.summaries:
            (self.out / PROFILE_SUMMARY).write_text("\n\n".join(self.summaries))
        if pack:
            tmp = self.out / (FILES_TGZ + ".tmp")
            with tarfile.open(tmp, "w:gz") as tar:
                tar.add(self.files, arcname="files")
            tmp.replace(self.out / FILES_TGZ)

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
        for name, kind, frontends, buckets in server_runs(args):
            protocols = [p for p in args.protocols if p in PROTOCOLS[kind]] or list(PROTOCOLS[kind])
            if not self.clock.allows(20 + args.warmup + args.window + POINT_OVERHEAD_S):
                entry["servers"][name] = {"skipped": "deadline"}
                self.clock.log(f"{model}/{name}: skipped (deadline)")
                continue
            self.frontends[name] = frontends
            if buckets is not None:  # this run's CUDA graph buckets, in the shared export
                config = self.work / "repos" / model / model / "config.pbtxt"
                config.write_text(with_graphs(config.read_text(), buckets))
            entry["servers"][name] = self.run_server(model, name, protocols)
            self.save(pack=True)

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
            "--graph-batch-sizes",
            ",".join(map(str, args.graph_batch_sizes)),
            "--batch-curve",
            ",".join(map(str, args.batch_curve)),
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
        log = self.files / f"server-{model}-{name}.log"
        baseline = self.nvml.device_used_mib()
        entry: dict[str, Any] = {"points": [], "device_used_before_mib": baseline}
        server: Server | None = None
        names: dict[int, str] = {}  # Python thread names of the executor(s), by native id
        profiled = profile_protocol(args, protocols) if name.startswith("infermux") else None
        self.clock.log(f"{model}/{name}: starting")
        try:
            server = self.start(model, name, log)
            entry["info"] = server.info
            self.clock.log(f"{model}/{name}: ready in {server.info['startup_s']} s")
            entry["memory_ready"] = self.server_memory(server, baseline)
            if args.server_warmup > 0:
                top = max(args.concurrency)
                # perf_analyzer checks no answer: warm up (and check) with loadgen's equivalent.
                first = perfanalyzer.LOADGEN_EQUIVALENT.get(protocols[0], protocols[0])
                warm = run_point(
                    self.target(model, server, first),
                    top,
                    self.client_procs(top),
                    warmup=0,
                    window=args.server_warmup,
                )
                entry["warmup"] = {"protocol": first, "concurrency": top}
                entry["warmup"].update(
                    (k, warm.get(k))
                    for k in ("items_per_s", "errors", "error", "verified", "mismatched")
                )
            entry["memory_after_warmup"] = self.server_memory(server, baseline)
            # infermux's own accounting: weights, buffers, graph pools, staging
            if name.startswith("infermux"):
                try:
                    stats = get_json(f"{server.http_url}/v2/models/{model}/stats")
                    entry["infermux_memory_usage"] = stats["model_stats"][0].get("memory_usage")
                except Exception as exc:
                    entry["infermux_memory_usage"] = repr(exc)
                # CPU instances capture no graphs, whatever the config says.
                entry["graph_buckets"] = (
                    graph_bucket_sizes(self.work / "repos" / model / model)
                    if args.device == "cuda"
                    else []
                )
            for protocol in protocols:
                for conc in args.concurrency:
                    why = self.skip_reason(protocol)
                    if why:
                        entry["points"].append(
                            {"protocol": protocol, "concurrency": conc, "skipped": why}
                        )
                        continue
                    point = self.point(
                        model, server, protocol, conc, baseline=baseline, names=names
                    )
                    buckets = entry.get("graph_buckets")
                    if isinstance(buckets, list):
                        point.update(padding(point.get("batch_sizes") or {}, buckets) or {})
                    entry["points"].append(point)
                    self.report_point(model, name, point)
                    self.save()
                    if not server.process.alive():
                        raise RuntimeError(f"{name} died:\n{server.process.log_tail()}")
                if protocol == profiled:
                    entry["profile"] = self.profile(model, server, protocol, baseline, names)
                    self.save()
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            self.clock.log(f"{model}/{name}: ERROR {entry['error']}")
        finally:
            if server is not None:
                entry["stop_s"] = round(server.process.stop(), 2)
                entry["log_tail"] = server.process.log_tail(2000)
        return entry

    def skip_reason(self, protocol: str) -> str:
        args = self.args
        if protocol == "pa_grpc_cuda_shm" and args.device != "cuda":
            return "CUDA shared memory needs --device cuda"
        if not self.clock.allows(self.point_s(protocol)[0]):
            return "deadline"
        return ""

    def point_s(self, protocol: str) -> tuple[float, float]:
        return point_s(self.args, protocol)

    def profiler_env(self) -> dict[str, str] | None:
        """The server's environment for --profile-cprofile or --profile-gpu-trace (each hook is
        a ``sitecustomize``, so one at a time)."""
        if self.args.profile_cprofile:
            return cprofiling.server_env(self.work / "cprofile")
        if self.args.profile_gpu_trace:
            return gputrace.server_env(self.work / "gputrace")
        return None

    def start(self, model: str, name: str, log: Path) -> Server:
        args = self.args
        if name in self.frontends and name.startswith("infermux"):
            return start_infermux(
                self.work / "repos" / model,
                model,
                log,
                frontends=self.frontends[name],
                executors=args.executors,
                max_shm_regions=shm_regions(args.concurrency),
                env=self.profiler_env(),
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
        self,
        model: str,
        server: Server,
        protocol: str,
        conc: int,
        *,
        baseline: float | None,
        names: dict[int, str],
    ) -> dict[str, Any]:
        window = Window(self.nvml, server, model, names)
        head: dict[str, Any] = {"protocol": protocol, "concurrency": conc}
        if protocol in perfanalyzer.PROTOCOLS:
            head["client"] = "perf_analyzer"
            result = self.pa_run(
                model, server, protocol, conc, on_start=window.start, on_end=window.end
            )
            return {**head, **result, **window.result(baseline)}
        args = self.args
        head["client"] = "loadgen"
        result = run_point(
            self.target(model, server, protocol),
            conc,
            self.client_procs(conc),
            warmup=args.warmup,
            window=args.window,
            on_start=window.start,
            on_end=window.end,
        )
        return {**head, **result, **window.result(baseline, result.get("completed"))}

    def pa_run(
        self,
        model: str,
        server: Server,
        protocol: str,
        conc: int,
        *,
        on_start: Callable[[], None],
        on_end: Callable[[], None],
        tag: str = "",
    ) -> dict[str, Any]:
        args = self.args
        assert self.pa is not None
        spec = model_spec(model, args.tiny)
        data = self.files / f"pa-input-{model}.json"
        if not data.exists():
            ref, _ = load_reference(self.work / "ref", spec)
            perfanalyzer.write_input_data(spec, ref, data)
        stem = f"pa-{model}-{protocol}-c{conc}{tag}"
        url = server.grpc_target if "grpc" in protocol else server.http_url.removeprefix("http://")
        extra = shlex.split(args.pa_extra) + (["--async"] if args.pa_async else [])
        argv = perfanalyzer.command(
            self.pa,
            model=model,
            url=url,
            protocol=protocol,
            concurrency=conc,
            input_data=data,
            csv_path=self.files / f"{stem}.csv",
            interval_ms=interval_ms(args, protocol),
            stability=args.pa_stability,
            max_trials=args.pa_max_trials,
            extra=extra,
        )
        worst = self.point_s(protocol)[1]
        result = perfanalyzer.run(
            argv,
            self.files / f"{stem}.log",
            warmup=args.warmup,
            timeout=worst + 60,
            shm_names=tuple(t.name for t in (*spec.inputs, spec.output)),
            env=(
                {"TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": str(args.pa_grpc_channel_share)}
                if args.pa_grpc_channel_share
                else None
            ),
            on_start=on_start,
            on_end=on_end,
        )
        return {"pa_command": shlex.join(argv), **result}

    def profile(
        self,
        model: str,
        server: Server,
        protocol: str,
        baseline: float | None,
        names: dict[int, str],
    ) -> dict[str, Any]:
        """One more run at ``--profile-concurrency`` (default: the highest) with py-spy
        recording the whole process group for ``--profile-seconds`` (a run of its own, so no
        measured point carries py-spy's overhead; its figures are kept beside the profile)."""
        args = self.args
        conc = args.profile_concurrency or max(args.concurrency)
        usual, _ = self.point_s(protocol)
        if not self.clock.allows(max(usual, args.warmup + args.profile_seconds + 3)):
            self.clock.log(f"{model}/infermux: profile skipped (deadline)")
            return {"skipped": "deadline"}
        path = self.out / f"pyspy-{model}-{protocol}-c{conc}.speedscope.json"
        handle: dict[str, Any] = {}
        window = Window(self.nvml, server, model, names)

        # The executors' loop threads (the one process in --frontends 1) for --profile-cprofile.
        profiled = list(server.info.get("executor_pids", [])) or [server.process.pid]

        def on_start() -> None:
            window.start()
            if args.profile_cprofile:
                cprofiling.start(profiled)
                return
            if args.profile_gpu_trace:
                gputrace.start(profiled)
            handle.update(
                pyspy.start(
                    server.process.pid, path, args.profile_seconds, native=args.profile_native
                )
            )

        def on_end() -> None:
            window.end()
            if args.profile_cprofile:
                cprofiling.stop(profiled)
            if args.profile_gpu_trace:
                gputrace.stop(profiled)

        self.clock.log(
            f"{model}/infermux: py-spy {args.profile_seconds:g} s at {protocol} c={conc}"
        )
        if protocol in perfanalyzer.PROTOCOLS:
            result = self.pa_run(
                model, server, protocol, conc, on_start=on_start, on_end=on_end, tag="-profiled"
            )
        else:
            result = run_point(
                self.target(model, server, protocol),
                conc,
                self.client_procs(conc),
                warmup=args.warmup,
                window=args.profile_seconds,
                on_start=on_start,
                on_end=on_end,
            )
        run = {"protocol": protocol, "concurrency": conc, **result, **window.result(baseline)}
        out: dict[str, Any] = {"run": run, "pyspy": pyspy.finish(handle) if handle else {}}
        if args.profile_cprofile:
            title = f"{model} infermux {protocol} c={conc}, executor loop threads {profiled}"
            self.summaries.append(cprofiling.summary(self.work / "cprofile", profiled, title))
            out["summary"] = PROFILE_SUMMARY
        if args.profile_gpu_trace:
            title = f"{model} infermux {protocol} c={conc}, executors {profiled}"
            self.summaries.append(gputrace.summary(self.work / "gputrace", profiled, title))
            out["summary"] = PROFILE_SUMMARY
        if path.exists():
            leader = server.process.pid
            executors = set(server.info.get("executor_pids", []))
            roles = cpuroles.roles(leader, server.process.pids() | {leader}, executors)
            try:
                self.summaries.append(
                    pyspy.summarize(
                        path, roles, f"{model} infermux {protocol} c={conc} ({path.name})"
                    )
                )
                out["summary"] = PROFILE_SUMMARY
            except (OSError, ValueError, KeyError) as exc:
                out["summary_error"] = repr(exc)
        self.clock.log(
            f"{model}/infermux: profile {out['pyspy'].get('file') or out['pyspy']} "
            f"({run.get('items_per_s')}/s while profiled)"
        )
        return out

    def report_point(self, model: str, name: str, point: dict[str, Any]) -> None:
        label = f"{model}/{name}/{point['protocol']:9s} c={point['concurrency']:<4d}"
        if "error" in point:
            self.clock.log(f"{label}: ERROR {point['error'][:600]}")
            return
        pa = point.get("client") == "perf_analyzer"
        self.clock.log(
            f"{label} {point['items_per_s']:>9,.1f}/s p50={point['p50_ms']} p99={point['p99_ms']} ms "
            + (
                f"rc={point['pa_rc']}{' UNSTABLE' if point.get('unstable') else ''} "
                f"passes={len(point['pa_passes'])} "
                if pa
                else f"err={point['errors']} bad={point['mismatched']} "
            )
            + f"batch={point.get('avg_batch')} pad={point.get('padded_rows_pct')}% "
            f"gpu={point.get('gpu_util_mean')}% "
            f"cpu s/c={point.get('server_cpu')}/{point.get('client_cpu')} "
            f"exec µs/req={point.get('executor_cpu_us_per_request')} "
            f"fe µs/req={point.get('frontend_cpu_us_per_request')}"
        )


def profile_protocol(args: argparse.Namespace, protocols: list[str]) -> str | None:
    """The protocol profiled with --profile: --profile-protocol when it is run, else the first
    perf_analyzer protocol run, else the first one."""
    if not args.profile:
        return None
    if args.profile_protocol in protocols:
        return str(args.profile_protocol)
    usable = [p for p in protocols if not (p == "pa_grpc_cuda_shm" and args.device != "cuda")]
    return next((p for p in usable if p in perfanalyzer.PROTOCOLS), usable[0] if usable else None)


ServerRun = tuple[str, str, int, tuple[int, ...] | None]
"""(label, server kind, front-end processes, CUDA graph buckets: None = as exported)."""


def server_runs(args: argparse.Namespace) -> list[ServerRun]:
    """Every server run: infermux once per ``--frontends`` value and ``--graph-variants`` set
    (labelled ``infermux-fN``, ``-gI`` when several are asked), each peer once."""
    runs: list[ServerRun] = []
    variants: list[tuple[int, ...] | None] = list(args.graph_variants) or [None]
    for kind in args.servers:
        if kind != "infermux":
            runs.append((kind, kind, 1, None))
            continue
        for n in args.frontends:
            for index, buckets in enumerate(variants):
                label = "infermux"
                label += f"-f{n}" if len(args.frontends) > 1 else ""
                label += f"-g{index}" if len(variants) > 1 else ""
                runs.append((label, kind, n, buckets))
    return runs


def graph_variants(text: str) -> list[tuple[int, ...]]:
    """``--graph-variants``: bucket sets separated by '/', each 'default' (infermux's own rule)
    or comma-separated batch sizes."""
    return [
        () if part.strip() == "default" else tuple(ints(part))
        for part in text.split("/")
        if part.strip()
    ]


def graph_bucket_sizes(model_dir: Path) -> list[int] | str:
    """The batch sizes infermux captures CUDA graphs at for the config the run wrote (its own
    rule, ``runtime/graphs.graph_buckets``); [] without graphs, the error's text when infermux
    cannot say (then no padding is reported)."""
    try:
        from infermux.repository import load_model_config
        from infermux.runtime.graphs import graph_buckets

        return [b.batch_size for b in graph_buckets(load_model_config(model_dir))]
    except Exception as exc:
        return repr(exc)


def interval_ms(args: argparse.Namespace, protocol: str) -> int:
    """perf_analyzer's measurement window for ``protocol``. perf_analyzer's own memory grows with
    every request it sends (its known leak at high rates, triton-inference-server/perf_analyzer#84;
    here: ~400 MB/s against a 150 KB identity model over HTTP, less over gRPC), so at ~12k
    ResNet-50 requests/s five 4 s HTTP windows got it OOM-killed on the device; HTTP points may
    use shorter ones."""
    if protocol == "pa_http" and args.pa_http_interval_ms:
        return int(args.pa_http_interval_ms)
    return int(args.pa_interval_ms)


def shm_regions(concurrency: list[int]) -> int:
    """The server's shared-memory region limit for a run: the loadgen warm-up at the top
    concurrency registers two regions per slot (perf_analyzer fewer), beyond infermux's default
    of 256 at c=256 (every warm-up there failed with "256 regions are registered" until this)."""
    return max(256, SharedRegions.PER_SLOT * max(concurrency) + 64)


def point_s(args: argparse.Namespace, protocol: str) -> tuple[float, float]:
    """(usual, worst) wall seconds of one point."""
    if protocol in perfanalyzer.PROTOCOLS:
        return perfanalyzer.expected_s(interval_ms(args, protocol), args.pa_max_trials)
    seconds = args.warmup + args.window + POINT_OVERHEAD_S
    return seconds, seconds


def estimate_s(args: argparse.Namespace) -> tuple[float, float]:
    """Rough (usual, worst) wall time of the requested run, printed up front. perf_analyzer
    points take 3 to --pa-max-trials measurement intervals each."""
    usual = worst = 0.0
    for _, kind, _, _ in server_runs(args):
        protocols = [p for p in args.protocols if p in PROTOCOLS[kind]] or list(PROTOCOLS[kind])
        if args.device != "cuda":
            protocols = [p for p in protocols if p != "pa_grpc_cuda_shm"]
        usual += SERVER_OVERHEAD_S + args.server_warmup
        worst += SERVER_OVERHEAD_S + args.server_warmup
        for protocol in protocols:
            low, high = point_s(args, protocol)
            usual += low * len(args.concurrency)
            worst += high * len(args.concurrency)
        profiled = profile_protocol(args, protocols) if kind == "infermux" else None
        if profiled:
            low, high = point_s(args, profiled)
            usual += max(low, args.warmup + args.profile_seconds + 3)
            worst += max(high, args.warmup + args.profile_seconds + 3)
    models = len(args.models)
    return (RAW_S + usual) * models, (RAW_S + worst) * models


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
    p.add_argument("--window", type=float, default=5.0, help="seconds measured per loadgen point")
    p.add_argument(
        "--warmup",
        type=float,
        default=1.5,
        help="seconds of load before each window (perf_analyzer: from its start)",
    )
    p.add_argument("--servers", type=csv(SERVERS), default=list(SERVERS))
    p.add_argument(
        "--protocols",
        type=csv(PROTOCOLS["infermux"]),
        default=["grpc_shm", "grpc", "http"],
        help="infermux's protocols; pa_* are perf_analyzer's (the peers always use their JSON route)",
    )
    p.add_argument("--instances", type=int, default=4, help="infermux instance_group count")
    p.add_argument(
        "--frontends",
        type=ints,
        default=[4],
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
    p.add_argument(
        "--perf-analyzer",
        default="",
        help="perf_analyzer command (default: $PA, PATH, or .whl/perf_analyzer.tgz unpacked)",
    )
    p.add_argument(
        "--pa-interval-ms", type=int, default=4000, help="perf_analyzer --measurement-interval"
    )
    p.add_argument(
        "--pa-http-interval-ms",
        type=int,
        default=0,
        help="perf_analyzer --measurement-interval for pa_http (default: --pa-interval-ms)",
    )
    p.add_argument(
        "--pa-stability", type=float, default=25, help="perf_analyzer --stability-percentage"
    )
    p.add_argument("--pa-max-trials", type=int, default=5, help="perf_analyzer --max-trials")
    p.add_argument(
        "--pa-async", action="store_true", help="perf_analyzer --async (default: synchronous)"
    )
    p.add_argument("--pa-extra", default="", help="more perf_analyzer flags, one string")
    p.add_argument(
        "--pa-grpc-channel-share",
        type=int,
        default=0,
        help="TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT for perf_analyzer (0: its default)",
    )
    p.add_argument("--litserve-workers", type=int, default=4, help="workers_per_device")
    p.add_argument("--litserve-max-batch", type=int, default=64)
    p.add_argument("--litserve-batch-timeout", type=float, default=0.005, help="seconds")
    p.add_argument("--raw-seconds", type=float, default=2.0, help="per raw throughput reading")
    p.add_argument(
        "--graph-batch-sizes",
        type=ints,
        default=[],
        help="CUDA graph buckets as graph_spec (default: infermux's own set)",
    )
    p.add_argument(
        "--graph-variants",
        type=graph_variants,
        default=[],
        help="infermux runs over one export, one per CUDA graph bucket set, '/'-separated: "
        "'default' or sizes, e.g. default/1,2,4,8,12,16 (labelled infermux-g0, -g1, ...)",
    )
    p.add_argument(
        "--batch-curve",
        type=ints,
        default=[],
        help="raw: graph throughput on --instances streams at these batch sizes, e.g. 16,32,64",
    )
    p.add_argument(
        "--server-warmup", type=float, default=3.0, help="seconds of load after each start"
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=540.0,
        help="seconds; points that would end later are skipped (the GPU box kills at 600)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="one extra run at the highest concurrency with py-spy over the infermux group",
    )
    p.add_argument(
        "--profile-protocol",
        default="pa_grpc_shm",
        help="the protocol of the --profile run (default pa_grpc_shm, else the first pa_* run)",
    )
    p.add_argument("--profile-seconds", type=float, default=5.0, help="py-spy record duration")
    p.add_argument(
        "--profile-concurrency",
        type=int,
        default=0,
        help="concurrency of the --profile run (default: the highest of --concurrency)",
    )
    p.add_argument(
        "--profile-native",
        action="store_true",
        help="py-spy --native: C/C++ frames too (time inside CUDA, torch, uvloop, grpc calls); "
        "it pauses each process per sample, so that run's own figures are not comparable",
    )
    p.add_argument(
        "--profile-cprofile",
        action="store_true",
        help="instead of py-spy: cProfile the executors' loop threads over the profile run "
        "(benchmarks/gpu/cprofiling.py), its text in OUT/pyspy_summary.txt",
    )
    p.add_argument(
        "--profile-gpu-trace",
        action="store_true",
        help="beside py-spy: a trace of the GPU's streams in each executor over the profile run "
        "(benchmarks/gpu/gputrace.py), its summary in OUT/pyspy_summary.txt",
    )
    p.add_argument("--keep-workdir", action="store_true", help="keep repositories and logs")
    args = p.parse_args()
    if args.profile_cprofile and args.profile_gpu_trace:
        p.error("--profile-cprofile and --profile-gpu-trace each install a sitecustomize: one")
    return args


def terminate(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the `finally` that stops the server


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, terminate)
    bench = Bench(args)
    usual, worst = estimate_s(args)
    bench.clock.log(
        f"models {args.models}, servers {args.servers}, protocols {args.protocols}, "
        f"c {args.concurrency}, frontends {args.frontends}, device {args.device}"
        f"{' (tiny)' if args.tiny else ''}; estimated {usual:.0f} s (at most {worst:.0f} s), "
        f"deadline {args.deadline:.0f} s; NVML: {'yes' if bench.nvml.available else bench.nvml.error}; "
        f"work dir {bench.work}"
    )
    if "perf_analyzer" in bench.doc:
        bench.clock.log(f"perf_analyzer: {bench.doc['perf_analyzer']['found']}")
    try:
        for model in args.models:
            bench.run_model(model)
    finally:
        bench.save(pack=True)
        if args.keep_workdir:
            bench.clock.log(f"work dir kept: {bench.work}")
        else:
            shutil.rmtree(bench.work, ignore_errors=True)
    written = sorted(p.name for p in args.out.iterdir() if p.is_file())
    bench.clock.log(f"wrote {args.out}: {', '.join(written)}")


if __name__ == "__main__":
    main()
