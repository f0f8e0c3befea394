"""infermux beside its peers (Triton via PyTriton, MLServer, TorchServe, LitServe, Ray Serve,
plain FastAPI) on this machine, one run: the same two models on every server -- `simple` (INT32
add/sub of two 16-vectors) and a small MLP (64 -> 256 -> 256 -> 10, one TorchScript file, see
``mlp.py``) -- the same client per protocol, concurrency 1 / 8 / 32, alternating rounds (server
order reversed on odd rounds), medians, ratios to infermux.

Clients: V2 servers are driven by ``infermux bench`` (binary tensors over HTTP, and gRPC);
servers with their own JSON API by ``hey`` (Debian package) with that JSON; infermux is also
driven by ``hey`` with V2 JSON, so that it appears in every client's table.

Peers come from their own venvs (``benchmarks/peers/install.sh`` makes them under
``--venvs``, default /tmp/peers); a peer whose venv is missing is skipped and said so.

    bash benchmarks/peers/install.sh && python benchmarks/peers/run.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mlp  # this folder's helper (run.py runs as a script)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import stop_group

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SERVERS = HERE / "servers"
MODELS = ("simple", "mlp")
VECTOR = list(range(16))
FEATURES = [round(i / mlp.FEATURES, 4) for i in range(mlp.FEATURES)]
V2_JSON = {
    "simple": {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": VECTOR},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": VECTOR},
        ]
    },
    "mlp": {
        "inputs": [
            {"name": "INPUT__0", "datatype": "FP32", "shape": [1, mlp.FEATURES], "data": FEATURES}
        ]
    },
}
PLAIN_JSON = {"simple": {"a": VECTOR, "b": VECTOR}, "mlp": {"x": FEATURES}}
V2_ROUTES = {m: (f"/v2/models/{m}/infer", V2_JSON[m]) for m in MODELS}
PLAIN_ROUTES = {"simple": ("/predict", PLAIN_JSON["simple"]), "mlp": ("/mlp", PLAIN_JSON["mlp"])}
PORTS = 6
"""Ports per server: HTTP, gRPC, metrics, then spares (TorchServe's management, gRPC management
and worker base ports)."""


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@dataclass
class Peer:
    name: str
    start: Callable[[Path, list[int], Path], list[str]]
    """(venvs, ports, work dir) -> command line; the MLP's file is ``work / "mlp.pt"``."""
    clients: list[str]
    """Which client groups drive it: v2-http, v2-grpc, json."""
    json_routes: dict[str, tuple[str, dict[str, Any]]]
    """Model -> (path, JSON body) for ``hey``; every route answering 200 is readiness."""
    venv: str = ""
    env: dict[str, str] = field(default_factory=dict)


def _infermux(venvs: Path, ports: list[int], work: Path) -> list[str]:
    repository = mlp.infermux_repository(
        work / "repository", ROOT / "src" / "infermux" / "examples" / "model_repository" / "simple"
    )
    return [
        sys.executable, "-m", "infermux", "serve", "--http-port", str(ports[0]),
        "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
        "--model-repository", str(repository),
    ]  # fmt: skip


def _script(name: str, venv: str) -> Callable[[Path, list[int], Path], list[str]]:
    def command(venvs: Path, ports: list[int], work: Path) -> list[str]:
        python = str(venvs / venv / "bin" / "python")
        return [python, str(SERVERS / name), *map(str, ports[:3]), str(work / "mlp.pt")]

    return command


def _mlserver(venvs: Path, ports: list[int], work: Path) -> list[str]:
    folder = work / "mlserver"
    shutil.copytree(SERVERS / "mlserver", folder, dirs_exist_ok=True)
    settings = folder / "mlp" / "model-settings.json"
    settings.write_text(settings.read_text().replace("MLP_FILE", str(work / "mlp.pt")))
    server = {"http_port": ports[0], "grpc_port": ports[1], "metrics_port": ports[2]}
    (folder / "settings.json").write_text(json.dumps({**server, "host": "127.0.0.1"}))
    return [str(venvs / "mlserver" / "bin" / "mlserver"), "start", str(folder)]


def _torchserve(venvs: Path, ports: list[int], work: Path) -> list[str]:
    """Model store of unpacked archives (``torch-model-archiver --archive-format no-archive``),
    one worker per model as every other server has one instance, batching like the others
    (TorchServe's smallest delay is 1 ms), and every port and temp dir of its own (peers.md:
    TorchServe keeps its pid file in the temp dir and has fixed default ports)."""
    bin_ = venvs / "torchserve" / "bin"
    store, tmp = work / "store", work / "tmp"
    store.mkdir()
    tmp.mkdir()
    archive = [str(bin_ / "torch-model-archiver"), "--version", "1.0", "--export-path", str(store),
               "--archive-format", "no-archive", "--force"]  # fmt: skip
    subprocess.run([*archive, "--model-name", "simple", "--handler",
                    str(SERVERS / "torchserve" / "simple_handler.py")], check=True)  # fmt: skip
    subprocess.run([*archive, "--model-name", "mlp", "--serialized-file", str(work / "mlp.pt"),
                    "--handler", str(SERVERS / "torchserve" / "mlp_handler.py")], check=True)  # fmt: skip
    models = {
        name: {"1.0": {"defaultVersion": True, "marName": name, "minWorkers": 1, "maxWorkers": 1,
                       "batchSize": batch, "maxBatchDelay": 1, "responseTimeout": 60}}
        for name, batch in (("simple", 1), ("mlp", mlp.MAX_BATCH))
    }  # fmt: skip
    properties = {
        "inference_address": f"http://127.0.0.1:{ports[0]}",
        "management_address": f"http://127.0.0.1:{ports[3]}",
        "metrics_address": f"http://127.0.0.1:{ports[2]}",
        "grpc_inference_port": ports[1],
        "grpc_management_port": ports[4],
        "initial_worker_port": ports[5],
        "model_store": store,
        "load_models": "simple,mlp",
        "models": json.dumps(models),
        "vmargs": f"-Djava.io.tmpdir={tmp} -Xmx2g",
        "disable_token_authorization": "true",
        "install_py_dep_per_model": "false",
    }
    config = work / "config.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    return [str(bin_ / "torchserve"), "--start", "--foreground", "--ncs", "--ts-config",
            str(config), "--model-store", str(store), "--disable-token-auth"]  # fmt: skip


TORCHSERVE_ROUTES = {m: (f"/predictions/{m}", PLAIN_JSON[m]) for m in MODELS}
PEERS = [
    Peer("infermux", _infermux, ["v2-http", "v2-grpc", "json"], V2_ROUTES),
    Peer("triton (PyTriton)", _script("pytriton_server.py", "pytriton"),
         ["v2-http", "v2-grpc", "json"], V2_ROUTES, venv="pytriton"),
    Peer("mlserver", _mlserver, ["v2-grpc", "json"], V2_ROUTES, venv="mlserver"),
    Peer("torchserve", _torchserve, ["json"], TORCHSERVE_ROUTES, venv="torchserve"),
    Peer("litserve", _script("litserve_server.py", "litserve"), ["json"], PLAIN_ROUTES,
         venv="litserve"),
    Peer("fastapi", _script("fastapi_server.py", "fastapi"), ["json"], PLAIN_ROUTES,
         venv="fastapi"),
    Peer("ray serve", _script("rayserve_server.py", "ray"), ["json"], PLAIN_ROUTES, venv="ray"),
]  # fmt: skip


def wait_ready(
    base: str,
    routes: dict[str, tuple[str, dict[str, Any]]],
    process: subprocess.Popen[bytes],
    timeout: float = 180,
) -> None:
    """Until every model's JSON route answers 200 to its body: a real request is the only
    readiness probe that means the same on every server (Ray Serve's proxy, for one, is healthy
    before its applications are deployed; TorchServe pings before its workers are up)."""
    deadline = time.monotonic() + timeout
    pending = dict(routes)
    while pending and time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}")
        for model, (path, body) in list(pending.items()):
            request = urllib.request.Request(
                base + path, data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            with (
                contextlib.suppress(Exception),
                urllib.request.urlopen(request, timeout=5) as answer,
            ):
                if answer.status == 200:
                    del pending[model]
        time.sleep(0.3)
    if pending:
        raise RuntimeError(f"not ready in time: {sorted(pending)}")


def bench(model: str, protocol: str, url: str, concurrency: int, work: Path) -> dict[str, float]:
    out = work / f"bench-{model}-{protocol}-{concurrency}.json"
    processes = max(1, min(2, concurrency // 8))
    subprocess.run(
        [sys.executable, "-m", "infermux", "bench", model, "-i", protocol, "-u", url,
         "--concurrency-range", str(concurrency), "-p", "1", "--max-trials", "4",
         "--warmup", "0.5", "--processes", str(processes), "--json", str(out)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    level = json.loads(out.read_text())["levels"][0]
    return {"throughput": level["requests_per_s"], "p50_ms": level["latency_us"]["p50"] / 1000,
            "p99_ms": level["latency_us"]["p99"] / 1000, "failures": level["failures"]}  # fmt: skip


def hey(
    url: str, body: dict[str, Any], concurrency: int, seconds: int, work: Path
) -> dict[str, float]:
    body_file = work / "body.json"
    body_file.write_text(json.dumps(body))
    result = subprocess.run(
        ["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST", "-T", "application/json",
         "-D", str(body_file), url],
        check=True, capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    text = result.stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    p50 = re.search(r"50%+ in ([\d.]+) secs", text)
    p99 = re.search(r"99%+ in ([\d.]+) secs", text)
    statuses = dict(re.findall(r"\[(\d+)\]\s+(\d+) responses", text))
    bad = sum(int(n) for code, n in statuses.items() if code != "200")
    errors = re.search(r"Error distribution:(.*)", text, flags=re.DOTALL)
    return {"throughput": rate, "p50_ms": float(p50.group(1)) * 1000 if p50 else float("nan"),
            "p99_ms": float(p99.group(1)) * 1000 if p99 else float("nan"),
            "failures": bad + (1 if errors and errors.group(1).strip() else 0)}  # fmt: skip


def run_peer(
    peer: Peer,
    venvs: Path,
    levels: list[int],
    seconds: int,
    results: dict[str, list[dict[str, float]]],
) -> str:
    if peer.venv and not (venvs / peer.venv / "bin" / "python").exists():
        return f"{peer.name}: skipped (no venv at {venvs / peer.venv})"
    work = Path(tempfile.mkdtemp(prefix="peer-"))
    mlp.build(work / "mlp.pt")
    ports = free_ports(PORTS)
    env = dict(os.environ, **peer.env)
    if peer.venv == "pytriton":  # PyTriton's models need the interpreter's LIBDIR (peers.md)
        libdir = subprocess.run([str(venvs / "pytriton" / "bin" / "python"), "-c",
                                 "import sysconfig;print(sysconfig.get_config_var('LIBDIR'))"],
                                capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        env["LD_LIBRARY_PATH"] = libdir
    if peer.venv == "torchserve":  # its pid file and worker sockets live in the temp dir
        env["TMPDIR"] = str(work / "tmp")
    env["RAY_USAGE_STATS_ENABLED"] = "0"  # no usage reporting (nothing outside is reachable)
    log = (work / "server.log").open("wb")
    try:
        command = peer.start(venvs, ports, work)
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"{peer.name}: FAILED to prepare ({exc})"
    if not Path(command[0]).exists():
        return f"{peer.name}: skipped ({command[0]} is not installed)"
    process = subprocess.Popen(command, stdout=log, stderr=log, env=env,
                               cwd=work, start_new_session=True)  # fmt: skip
    base = f"http://127.0.0.1:{ports[0]}"
    try:
        wait_ready(base, peer.json_routes, process)
        for model in MODELS:
            for c in levels:
                for client in peer.clients:
                    if client == "json":
                        path, body = peer.json_routes[model]
                        figures = hey(base + path, body, c, seconds, work)
                    else:
                        protocol = client.split("-")[1]
                        url = f"127.0.0.1:{ports[1] if protocol == 'grpc' else ports[0]}"
                        figures = bench(model, protocol, url, c, work)
                    results.setdefault(f"{model}|{client}|{peer.name}|{c}", []).append(figures)
        return f"{peer.name}: ok"
    except Exception as exc:
        tail = (work / "server.log").read_text(errors="replace")[-600:]
        return f"{peer.name}: FAILED ({exc}); server log tail: {tail!r}"
    finally:
        with contextlib.suppress(ProcessLookupError):  # already gone (a failed start)
            stop_group(process, 30)
        log.close()
        if peer.venv == "ray":  # Ray's own processes leave the process group: stop them all
            ray = venvs / "ray" / "bin" / "ray"
            subprocess.run(
                [str(ray), "stop", "--force"], capture_output=True, check=False, timeout=60
            )
        if peer.venv == "torchserve":  # the frontend (Java) outlives a SIGTERM'd launcher
            subprocess.run(["pkill", "-f", f"ts-config {work}"], check=False)


CLIENTS = ("v2-http", "v2-grpc", "json")


def summarize(
    results: dict[str, list[dict[str, float]]], levels: list[int]
) -> list[dict[str, Any]]:
    rows = []
    for model in MODELS:
        for client in CLIENTS:
            for c in levels:
                base = results.get(f"{model}|{client}|infermux|{c}")
                base_rate = statistics.median(x["throughput"] for x in base) if base else math.nan
                for peer in PEERS:
                    runs = results.get(f"{model}|{client}|{peer.name}|{c}")
                    if not runs:
                        continue
                    rate = statistics.median(x["throughput"] for x in runs)
                    rows.append({
                        "model": model, "client": client, "concurrency": c, "server": peer.name,
                        "throughput": rate,
                        "p50_ms": statistics.median(x["p50_ms"] for x in runs),
                        "p99_ms": statistics.median(x["p99_ms"] for x in runs),
                        "failures": sum(x["failures"] for x in runs),
                        "runs": [round(x["throughput"]) for x in runs],
                        "vs_infermux": rate / base_rate if math.isfinite(base_rate) else math.nan,
                    })  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]], rounds: int, minutes: float, status: dict[str, str]) -> str:
    lines = [
        f"# infermux and its peers: `simple` add/sub and a small MLP ({os.cpu_count()} cores, "
        f"median of {rounds} alternating rounds, {minutes:.1f} min)",
        "",
        "Clients: `v2-http` / `v2-grpc` = `infermux bench` (binary tensors); `json` = `hey` with each "
        "server's JSON (V2 JSON for V2 servers). Ratios are throughput / infermux's with the same "
        "client and model.",
        "",
        "| model | client | c | server | req/s | vs infermux | p50 ms | p99 ms | failed | runs |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['client']} | {row['concurrency']} | {row['server']} | "
            f"{row['throughput']:,.0f} | {row['vs_infermux']:.2f} | {_ms(row['p50_ms'])} | "
            f"{_ms(row['p99_ms'])} | {row['failures']} | {', '.join(map(str, row['runs']))} |"
        )
    return "\n".join([*lines, "", "Peers: " + "; ".join(status.values()), ""])


def _ms(value: float) -> str:
    """A latency cell; hey prints no percentile it has too few answers for (Ray Serve, c=32)."""
    return f"{value:.2f}" if math.isfinite(value) else "n/a"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Throughput (top) and p99 (bottom) against concurrency, one panel per model and client."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(m, c) for m in MODELS for c in CLIENTS if any(
        r["model"] == m and r["client"] == c for r in rows)]  # fmt: skip
    fig, axes = plt.subplots(2, len(panels), figsize=(3.6 * len(panels), 6.5), squeeze=False)
    for i, (model, client) in enumerate(panels):
        for server in dict.fromkeys(r["server"] for r in rows):
            mine = [
                r for r in rows if (r["model"], r["client"], r["server"]) == (model, client, server)
            ]
            if not mine:
                continue
            xs = [r["concurrency"] for r in mine]
            style = {"linewidth": 2.5, "color": "black"} if server == "infermux" else {}
            axes[0][i].plot(xs, [r["throughput"] for r in mine], marker="o", label=server, **style)
            axes[1][i].plot(xs, [r["p99_ms"] for r in mine], marker="o", label=server, **style)
        axes[0][i].set_title(f"{model} / {client}", fontsize=10)
        for row, label in ((0, "requests/s"), (1, "p99 ms")):
            axes[row][i].set_xscale("log", base=2)
            axes[row][i].set_yscale("log")
            axes[row][i].set_xlabel("concurrency")
            axes[row][i].set_ylabel(label)
            axes[row][i].grid(True, which="both", alpha=0.3)
        axes[0][i].legend(fontsize=7)
    fig.suptitle(f"infermux and its peers ({os.cpu_count()} cores; higher / lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--seconds", type=int, default=3, help="hey's duration per point")
    p.add_argument("--venvs", type=Path, default=Path("/tmp/peers"))
    p.add_argument("--only", default="", help="comma-separated peer names (default: every peer)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "peers")
    p.add_argument(
        "--replot", action="store_true", help="redraw the table and plot from --out's peers.json"
    )
    args = p.parse_args()
    # A SIGTERM'd run still stops the server it started (the finally in run_peer).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.replot:
        doc = json.loads((args.out / "peers.json").read_text())
        text = table(doc["rows"], doc["rounds"], doc["minutes"], doc["status"])
        (args.out / "peers.md").write_text(text)
        plot(doc["rows"], args.out / "peers.png")
        return
    levels = [int(c) for c in args.concurrency.split(",")]
    results: dict[str, list[dict[str, float]]] = {}
    status: dict[str, str] = {}
    started = time.monotonic()
    chosen = [p for p in PEERS if not args.only or p.name in args.only.split(",")]
    for r in range(args.rounds):
        for peer in chosen if r % 2 == 0 else list(reversed(chosen)):
            status[peer.name] = run_peer(peer, args.venvs, levels, args.seconds, results)
            print(f"round {r} ({(time.monotonic() - started) / 60:.1f} min): "
                  f"{status[peer.name][:300]}", flush=True)  # fmt: skip
    rows = summarize(results, levels)
    minutes = (time.monotonic() - started) / 60
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"cpus": os.cpu_count(), "rounds": args.rounds, "minutes": minutes, "status": status,
           "rows": rows}  # fmt: skip
    (args.out / "peers.json").write_text(json.dumps(doc, indent=2) + "\n")
    text = table(rows, args.rounds, minutes, status)
    (args.out / "peers.md").write_text(text)
    plot(rows, args.out / "peers.png")
    print(text)


if __name__ == "__main__":
    main()
