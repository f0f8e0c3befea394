"""Streaming responses from a decoupled Python model: infermux vs real Triton (issue 28).

One Triton Python-backend ``model.py`` (``repository/stream_tokens``: N responses per request,
a fixed pause between them, the final flag with the last) served unchanged by ``infermux serve``
(one or several front-end processes) and by tritonserver 2.51 with its Python backend (from
PyTriton 0.7.0's wheel), all started up front and measured in turn at each point, driven over
gRPC ``ModelStreamInfer`` by the same client (``client.py``: c concurrent streams, one request at
a time each, over one or more client processes). Figures per point: time to first response
(TTFR) p50/p99, the gap between two responses of a request p50/p99 beside the model's own gap
(its send times, stamped on CLOCK_MONOTONIC in the model) and the nominal delay, model send ->
client arrival (delivery), responses/s, server and client CPU. Ratios infermux / Triton.

    python3 -m venv /tmp/pyt && /tmp/pyt/bin/pip install nvidia-pytriton==0.7.0 numpy
    PYTHONPATH=src python benchmarks/streaming/bench.py                     # both, here
    PYTHONPATH=src python benchmarks/streaming/bench.py --servers infermux  # no tritonserver
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: benchkit
sys.path.insert(0, str(HERE))  # client (also for the spawned client processes)
from benchkit import (  # noqa: E402
    cpu_seconds,
    free_port,
    group_pids,
    machine_info,
    stop_group,
    tritonserver_command,
)
from client import MODEL, Clients, Plan, figures  # noqa: E402
from report import RATIO_FIGURES, markdown  # noqa: E402

ROOT = HERE.parents[1]
REPOSITORY = HERE / "repository"
LEAD_S = 0.4  # from handing the plans out to the streams' start (processes open channels)
POINT_OVERHEAD_S = 0.6  # answers, figures, a pause between points
SERVER_START_S = {"infermux": 4.0, "triton": 6.0}


@dataclass
class Server:
    label: str  # infermux-f1, infermux-f2, triton
    kind: str  # infermux or triton
    frontends: int = 1
    process: subprocess.Popen[bytes] | None = None
    ports: list[int] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    state: str = "not started"  # ready, or why not

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.ports[1]}"


class Clock:
    def __init__(self, deadline: float) -> None:
        self.start = time.monotonic()
        self.deadline = deadline

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def allows(self, seconds: float) -> bool:
        return self.elapsed() + seconds <= self.deadline

    def log(self, message: str) -> None:
        print(f"[+{self.elapsed():6.1f}s] {message}", flush=True)


def triton_command(venv: Path, ports: list[int]) -> tuple[list[str], dict[str, str]]:
    """tritonserver from PyTriton's wheel, as benchkit builds it (peers.md)."""
    return tritonserver_command(venv, REPOSITORY, ports)


def infermux_command(frontends: int, ports: list[int]) -> tuple[list[str], dict[str, str]]:
    command = [
        sys.executable, "-m", "infermux", "serve", "--model-repository", str(REPOSITORY),
        "--host", "127.0.0.1", "--frontends", str(frontends),
        "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
    ]  # fmt: skip
    return command, dict(os.environ, PYTHONUNBUFFERED="1")


def model_state(base: str) -> tuple[str, str]:
    """The model's state and reason from the repository index (both servers answer it)."""
    request = urllib.request.Request(
        f"{base}/v2/repository/index", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=2) as answer:
        for entry in json.loads(answer.read()):
            if entry.get("name") == MODEL:
                return str(entry.get("state", "")), str(entry.get("reason", ""))
    return "", ""


def start(server: Server, args: argparse.Namespace, log: Path) -> None:
    ports = [free_port() for _ in range(3)]
    while len(set(ports)) < 3:
        ports = [free_port() for _ in range(3)]
    if server.kind == "infermux":
        command, env = infermux_command(server.frontends, ports)
    else:
        command, env = triton_command(args.triton_venv, ports)
    server.ports, server.command = ports, command
    server.process = subprocess.Popen(
        command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{ports[0]}"
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            server.state = f"exited with {server.process.returncode} (see {log.name})"
            return
        try:
            urllib.request.urlopen(f"{base}/v2/health/live", timeout=2)
            state, reason = model_state(base)
            if state == "READY":
                server.state = "ready"
                return
            if state == "UNAVAILABLE" and reason:
                server.state = f"model not loaded: {reason}"
                return
        except OSError:
            pass
        time.sleep(0.25)
    server.state = f"not ready in {args.start_timeout:.0f} s (see {log.name})"


def busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat's first line."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def run_point(
    server: Server, clients: Clients, args: argparse.Namespace, c: int, delay_us: int
) -> dict[str, Any]:
    """One point: ``c`` streams against ``server`` for warm-up + window, the figures."""
    now = time.monotonic_ns()
    start_ns = now + int(LEAD_S * 1e9)
    w0 = start_ns + int(args.warmup * 1e9)
    w1 = w0 + int(args.window * 1e9)
    request_s = args.tokens * delay_us / 1e6
    give_up = w1 + int((10 + 5 * request_s) * 1e9)
    parts = clients.split(c)
    plans = [
        Plan(
            url=server.grpc, first_stream=first, streams=streams, tokens=args.tokens,
            delay_us=delay_us, payload=args.payload, start_ns=start_ns, stop_ns=w1,
            give_up_ns=give_up, streams_per_channel=args.streams_per_channel,
            marks_ns=(w0, w1),
        )
        for first, streams in parts
    ]  # fmt: skip
    assert server.process is not None
    pgid = server.process.pid
    clients.send(plans)
    time.sleep(max(0.0, (w0 - time.monotonic_ns()) / 1e9))
    pids = group_pids(pgid)
    cpu0, machine0 = cpu_seconds(pids), busy_ticks()
    load0 = os.getloadavg()[0]
    time.sleep(max(0.0, (w1 - time.monotonic_ns()) / 1e9))
    server_cpu, machine1 = cpu_seconds(pids) - cpu0, busy_ticks()
    busy, total = machine1[0] - machine0[0], machine1[1] - machine0[1]
    records = clients.receive(len(plans), timeout=(give_up - time.monotonic_ns()) / 1e9 + 30)
    span = args.window
    fatal = [r["fatal"] for r in records if "fatal" in r]
    if fatal:
        return {"ok": False, "errors": fatal}
    result = figures(records, (w0, w1), args.tokens)
    errors = [e for r in records for e in r["errors"]]
    client_cores = [
        round((r["cpu_marks"][1] - r["cpu_marks"][0]) / span, 3)
        for r in records
        if len(r["cpu_marks"]) == 2
    ]
    rate = result["responses_per_s"]
    result.update(
        ok=result["requests"] > 0 and not errors,
        errors=errors[:5],
        error_count=sum(r["error_count"] for r in records),
        client_processes=len(records),
        client_cores=client_cores,
        client_saturated=bool(client_cores) and max(client_cores) >= args.saturated,
        client_cpu_us_per_response=round(1e6 * sum(client_cores) * span / max(1, rate * span), 1),
        server_cores=round(server_cpu / span, 3),
        server_cpu_us_per_response=round(1e6 * server_cpu / max(1, rate * span), 1)
        if rate
        else None,
        loadavg_1m=round(load0, 2),
        # Every process's CPU, the other helpers' too: how busy the whole machine was.
        machine_busy_cores=round(busy / total * (os.cpu_count() or 1), 2) if total else None,
    )
    delay = delay_us
    gap, ttfr = result["gap_us"], result["ttfr_us"]
    if gap.get("n"):
        result["overhead_us"] = {
            "gap_p50_minus_delay": round(gap["p50"] - delay, 1),
            "gap_p99_minus_delay": round(gap["p99"] - delay, 1),
            "gap_minus_model_gap_p50": result["gap_minus_model_gap_us"]["p50"],
            "gap_minus_model_gap_p99": result["gap_minus_model_gap_us"]["p99"],
            "delivery_p50": result["delivery_us"]["p50"],
            "delivery_p99": result["delivery_us"]["p99"],
        }
    elif ttfr.get("n"):
        result["overhead_us"] = {"delivery_p50": result["delivery_us"]["p50"]}
    return result


def point_estimate_s(args: argparse.Namespace, delay_us: int) -> float:
    seconds: float = args.warmup + args.window + args.tokens * delay_us / 1e6
    return LEAD_S + seconds + POINT_OVERHEAD_S


def estimate_s(args: argparse.Namespace, servers: list[Server]) -> float:
    starts = sum(SERVER_START_S[s.kind] + 1.5 for s in servers) + 2.0  # + client processes
    points = sum(
        point_estimate_s(args, int(d * 1000)) * len(args.concurrency) * args.rounds
        for d in args.delays_ms
    )
    total: float = starts + len(servers) * (points + 2.0)  # + a warm-up point each
    return total


def versions(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    try:
        import grpc

        out["grpcio"] = grpc.__version__
    except ImportError:
        pass
    try:
        out["infermux_commit"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
    except OSError:
        pass
    if "triton" in args.servers:
        pytriton = list(args.triton_venv.glob("lib/python3*/site-packages/nvidia_pytriton-*"))
        out["pytriton"] = pytriton[0].name if pytriton else None
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def ints(text: str) -> list[int]:
        return [int(v) for v in text.split(",") if v]

    def floats(text: str) -> list[float]:
        return [float(v) for v in text.split(",") if v]

    parser.add_argument("--servers", default="infermux,triton", help="infermux and/or triton")
    parser.add_argument(
        "--frontends", type=ints, default=[1, 2], help="infermux --frontends N, each a server"
    )
    parser.add_argument("--concurrency", type=ints, default=[1, 4, 16, 64, 256])
    parser.add_argument(
        "--delays-ms",
        type=floats,
        default=[0.0, 1.0, 10.0],
        help="the model's pause between responses",
    )
    parser.add_argument("--tokens", type=int, default=32, help="responses per request")
    parser.add_argument("--payload", type=int, default=16, help="FP32 elements per response")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before each window")
    parser.add_argument("--window", type=float, default=2.0, help="measured seconds per point")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--client-procs",
        default="auto",
        help="client processes (auto: 1 below 8 cores, else cores // 4, at most 8)",
    )
    parser.add_argument(
        "--streams-per-channel", type=int, default=64, help="gRPC streams per client connection"
    )
    parser.add_argument(
        "--saturated",
        type=float,
        default=0.9,
        help="client process CPU (cores) counted as saturated",
    )
    parser.add_argument("--triton-venv", type=Path, default=Path("/tmp/pyt"))
    parser.add_argument("--start-timeout", type=float, default=90)
    parser.add_argument(
        "--deadline",
        type=float,
        default=330,
        help="seconds; points that would end later are skipped",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "streaming")
    parser.add_argument("--name", default="streaming", help="result file stem")
    parser.add_argument(
        "--note", default="", help="a line for the summary (the machine's state, say)"
    )
    parser.add_argument(
        "--rebuild", type=Path, help="only rewrite the summary and .md of this result .json"
    )
    args = parser.parse_args(argv)
    args.servers = [s for s in args.servers.split(",") if s]
    for name in args.servers:
        if name not in ("infermux", "triton"):
            parser.error(f"--servers: unknown server {name!r}")
    cores = os.cpu_count() or 1
    args.client_procs = (
        (1 if cores < 8 else min(8, cores // 4))
        if args.client_procs == "auto"
        else int(args.client_procs)
    )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rebuild:
        doc = json.loads(args.rebuild.read_text())
        doc["summary"] = summarize(doc["points"])
        doc["ratios"] = ratios(doc["summary"])
        args.rebuild.write_text(json.dumps(doc, indent=2) + "\n")
        args.rebuild.with_suffix(".md").write_text(markdown(doc))
        return 0
    clock = Clock(args.deadline)
    servers = [
        Server(f"infermux-f{f}", "infermux", f)
        for f in args.frontends
        if "infermux" in args.servers
    ]
    notes: list[str] = []
    if args.note:
        notes.append(args.note)
    if "triton" in args.servers:
        if next(args.triton_venv.glob("lib/python3*/site-packages/pytriton/tritonserver"), None):
            servers.append(Server("triton", "triton"))
        else:
            notes.append(f"tritonserver not found under {args.triton_venv}: Triton not measured")
    delays_us = [round(d * 1000) for d in args.delays_ms]
    estimate = estimate_s(args, servers)
    clock.log(
        f"servers {[s.label for s in servers]}, c={args.concurrency}, delays {args.delays_ms} ms, "
        f"{args.tokens} responses/request, window {args.window} s, {args.client_procs} client "
        f"process(es); estimated {estimate:.0f} s, deadline {args.deadline:.0f} s"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    doc: dict[str, Any] = {
        "benchmark": "streaming",
        "issue": 28,
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine_info(client_processes=args.client_procs),
        "versions": versions(args),
        "estimated_s": round(estimate),
        "servers": {},
        "points": [],
        "notes": notes,
    }
    clients = Clients(args.client_procs)
    try:
        for server in servers:
            start(server, args, logs / f"{args.name}-{server.label}.log")
            clock.log(f"{server.label}: {server.state}")
            doc["servers"][server.label] = {
                "command": " ".join(server.command),
                "state": server.state,
            }
        live = [s for s in servers if s.state == "ready"]
        for server in live:  # warm-up: threads, connections, first-call paths
            run_point(
                server,
                clients,
                argparse.Namespace(**{**vars(args), "warmup": 0.1, "window": 0.5}),
                4,
                0,
            )
        turn = 0
        for r in range(args.rounds):
            for delay_us in delays_us:
                for c in args.concurrency:
                    order = live if turn % 2 == 0 else live[::-1]  # who goes first alternates
                    turn += 1
                    for server in order:
                        key = {"server": server.label, "c": c, "delay_us": delay_us, "round": r}
                        if not clock.allows(point_estimate_s(args, delay_us)):
                            doc["points"].append({**key, "skipped": "deadline"})
                            continue
                        result = run_point(server, clients, args, c, delay_us)
                        doc["points"].append({**key, **result})
                        clock.log(brief(server.label, c, delay_us, result))
    finally:
        clients.close()
        for server in servers:
            if server.process is not None:
                stop_group(server.process)
    doc["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    doc["elapsed_s"] = round(clock.elapsed(), 1)
    doc["summary"] = summarize(doc["points"])
    doc["ratios"] = ratios(doc["summary"])
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    text = markdown(doc)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)
    clock.log(f"done; estimated {estimate:.0f} s")
    return 0


def brief(label: str, c: int, delay_us: int, r: dict[str, Any]) -> str:
    if not r.get("requests"):
        return f"{label} c={c} delay={delay_us}us: failed {r.get('errors')}"
    ttfr, gap = r["ttfr_us"], r["gap_us"]
    gap_text = f"gap p50/p99 {gap['p50']:.0f}/{gap['p99']:.0f}" if gap.get("n") else "no gaps"
    return (
        f"{label} c={c} delay={delay_us}us: {r['responses_per_s']:.0f} resp/s, TTFR p50/p99 "
        f"{ttfr['p50']:.0f}/{ttfr['p99']:.0f} us (to model {r['to_model_us']['p50']:.0f}, first back "
        f"{r['first_back_us']['p50']:.0f}), {gap_text} us, delivery p50 "
        f"{r['delivery_us']['p50']:.0f} us, server {r['server_cores']} cores, client "
        f"{r['client_cores']} cores{' SATURATED' if r['client_saturated'] else ''}, machine "
        f"{r['machine_busy_cores']} cores busy"
        f"{' errors ' + str(r['error_count']) if r['error_count'] else ''}"
    )


FIGURES = {
    "responses_per_s": ("responses_per_s",),
    "ttfr_p50": ("ttfr_us", "p50"),
    "ttfr_p99": ("ttfr_us", "p99"),
    "to_model_p50": ("to_model_us", "p50"),
    "gap_p50": ("gap_us", "p50"),
    "gap_p99": ("gap_us", "p99"),
    "model_gap_p99": ("model_gap_us", "p99"),
    "delivery_p50": ("delivery_us", "p50"),
    "delivery_p99": ("delivery_us", "p99"),
    "server_cpu_us_per_response": ("server_cpu_us_per_response",),
}


def summarize(points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Medians over rounds per (server, delay, c)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        if p.get("requests"):
            groups.setdefault(f"{p['server']}|d{p['delay_us']}|c{p['c']}", []).append(p)
    out: dict[str, dict[str, Any]] = {}
    for key, runs in groups.items():
        cell: dict[str, Any] = {"rounds": len(runs)}
        for name, path in FIGURES.items():
            values = []
            for run in runs:
                value: Any = run
                for part in path:
                    value = value.get(part) if isinstance(value, dict) else None
                if value is not None:
                    values.append(value)
            if values:
                cell[name] = round(statistics.median(values), 1)
        cell["client_saturated"] = any(r["client_saturated"] for r in runs)
        cell["ttfr_n"] = sum(r["ttfr_us"].get("n", 0) for r in runs)
        out[key] = cell
    return out


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """infermux-fN / triton for each figure both have, per (delay, c)."""
    out: dict[str, dict[str, float]] = {}
    for key, cell in summary.items():
        label, rest = key.split("|", 1)
        peer = summary.get(f"triton|{rest}")
        if not label.startswith("infermux") or peer is None:
            continue
        entry = {
            name: round(cell[name] / peer[name], 2)
            for name in RATIO_FIGURES
            if cell.get(name) and peer.get(name)
        }
        out[key] = entry
    return out


if __name__ == "__main__":
    sys.exit(main())
