"""infermux beside its peers (Triton via PyTriton, MLServer, LitServe, Ray Serve, plain FastAPI)
on this machine, one run: the same `simple` model (INT32 add/sub of two 16-vectors) on every
server, the same client per protocol, concurrency 1 / 8 / 32, alternating rounds (server order
reversed on odd rounds), medians, ratios to infermux.

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

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SERVERS = HERE / "servers"
VECTOR = list(range(16))
V2_JSON = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": VECTOR},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": VECTOR},
    ]
}
PLAIN_JSON = {"a": VECTOR, "b": VECTOR}


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
    """(venvs, ports [http, grpc, metrics], work dir) -> command line."""
    ready_path: str
    clients: list[str]
    """Which client groups drive it: v2-http, v2-grpc, json."""
    json_path: str = ""
    json_body: dict[str, Any] = field(default_factory=dict)
    venv: str = ""
    env: dict[str, str] = field(default_factory=dict)


def _infermux(venvs: Path, ports: list[int], work: Path) -> list[str]:
    return [
        sys.executable, "-m", "infermux", "serve", "--http-port", str(ports[0]),
        "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
        "--model-repository", str(ROOT / "src" / "infermux" / "examples" / "model_repository"),
    ]  # fmt: skip


def _script(name: str, venv: str) -> Callable[[Path, list[int], Path], list[str]]:
    def command(venvs: Path, ports: list[int], work: Path) -> list[str]:
        return [str(venvs / venv / "bin" / "python"), str(SERVERS / name), *map(str, ports)]

    return command


def _mlserver(venvs: Path, ports: list[int], work: Path) -> list[str]:
    folder = work / "mlserver"
    shutil.copytree(SERVERS / "mlserver", folder, dirs_exist_ok=True)
    settings = {
        "http_port": ports[0],
        "grpc_port": ports[1],
        "metrics_port": ports[2],
        "host": "127.0.0.1",
    }
    (folder / "settings.json").write_text(json.dumps(settings))
    return [str(venvs / "mlserver" / "bin" / "mlserver"), "start", str(folder)]


PEERS = [
    Peer("infermux", _infermux, "/v2/health/ready", ["v2-http", "v2-grpc", "json"],
         "/v2/models/simple/infer", V2_JSON),
    Peer("triton (PyTriton)", _script("pytriton_server.py", "pytriton"), "/v2/models/simple/ready",
         ["v2-http", "v2-grpc", "json"], "/v2/models/simple/infer", V2_JSON, venv="pytriton"),
    Peer("mlserver", _mlserver, "/v2/models/simple/ready", ["v2-grpc", "json"],
         "/v2/models/simple/infer", V2_JSON, venv="mlserver"),
    Peer("litserve", _script("litserve_server.py", "litserve"), "/health", ["json"], "/predict",
         PLAIN_JSON, venv="litserve"),
    Peer("fastapi", _script("fastapi_server.py", "fastapi"), "/docs", ["json"], "/predict",
         PLAIN_JSON, venv="fastapi"),
    Peer("ray serve", _script("rayserve_server.py", "ray"), "/predict", ["json"], "/predict",
         PLAIN_JSON, venv="ray"),
]  # fmt: skip


def wait_ready(
    url: str, process: subprocess.Popen[bytes], body: bytes | None = None, timeout: float = 120
) -> None:
    """Until ``url`` answers 200 (to a POST of ``body`` when given: Ray Serve's proxy is healthy
    before its application is deployed, so only a real request tells)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}")
        request = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.3)
    raise RuntimeError("not ready in time")


def bench(protocol: str, url: str, concurrency: int, work: Path) -> dict[str, float]:
    out = work / f"bench-{protocol}-{concurrency}.json"
    processes = max(1, min(2, concurrency // 8))
    subprocess.run(
        [sys.executable, "-m", "infermux", "bench", "simple", "-i", protocol, "-u", url,
         "--concurrency-range", str(concurrency), "-p", "2", "--max-trials", "6",
         "--warmup", "1", "--processes", str(processes), "--json", str(out)],
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
    ports = free_ports(3)
    env = dict(os.environ, **peer.env)
    if peer.venv == "pytriton":  # PyTriton's models need the interpreter's LIBDIR (peers.md)
        libdir = subprocess.run([str(venvs / "pytriton" / "bin" / "python"), "-c",
                                 "import sysconfig;print(sysconfig.get_config_var('LIBDIR'))"],
                                capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        env["LD_LIBRARY_PATH"] = libdir
    env["RAY_USAGE_STATS_ENABLED"] = "0"  # no usage reporting (nothing outside is reachable)
    log = (work / "server.log").open("wb")
    try:
        command = peer.start(venvs, ports, work)
    except OSError as exc:
        return f"{peer.name}: FAILED to prepare ({exc})"
    if not Path(command[0]).exists():
        return f"{peer.name}: skipped ({command[0]} is not installed)"
    process = subprocess.Popen(command, stdout=log, stderr=log, env=env,
                               cwd=work, start_new_session=True)  # fmt: skip
    try:
        probe = json.dumps(peer.json_body).encode() if peer.ready_path == peer.json_path else None
        wait_ready(f"http://127.0.0.1:{ports[0]}{peer.ready_path}", process, probe)
        for c in levels:
            for client in peer.clients:
                if client == "json":
                    figures = hey(
                        f"http://127.0.0.1:{ports[0]}{peer.json_path}",
                        peer.json_body,
                        c,
                        seconds,
                        work,
                    )
                else:
                    protocol = client.split("-")[1]
                    url = f"127.0.0.1:{ports[1] if protocol == 'grpc' else ports[0]}"
                    figures = bench(protocol, url, c, work)
                results.setdefault(f"{client}|{peer.name}|{c}", []).append(figures)
        return f"{peer.name}: ok"
    except Exception as exc:
        tail = (work / "server.log").read_text(errors="replace")[-600:]
        return f"{peer.name}: FAILED ({exc}); server log tail: {tail!r}"
    finally:
        with contextlib.suppress(ProcessLookupError):  # already gone (a failed start)
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()
        if peer.venv == "ray":  # Ray's own processes leave the process group: stop them all
            ray = venvs / "ray" / "bin" / "ray"
            subprocess.run(
                [str(ray), "stop", "--force"], capture_output=True, check=False, timeout=60
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--seconds", type=int, default=6, help="hey's duration per point")
    p.add_argument("--venvs", type=Path, default=Path("/tmp/peers"))
    p.add_argument("--only", default="", help="comma-separated peer names (default: every peer)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "peers")
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    results: dict[str, list[dict[str, float]]] = {}
    status: dict[str, str] = {}
    started = time.monotonic()
    chosen = [p for p in PEERS if not args.only or p.name in args.only.split(",")]
    for r in range(args.rounds):
        for peer in chosen if r % 2 == 0 else list(reversed(chosen)):
            status[peer.name] = run_peer(peer, args.venvs, levels, args.seconds, results)
            print(f"round {r}: {status[peer.name][:300]}", flush=True)
    rows = []
    for client in ("v2-http", "v2-grpc", "json"):
        for c in levels:
            base = results.get(f"{client}|infermux|{c}")
            base_rate = statistics.median(x["throughput"] for x in base) if base else float("nan")
            for peer in PEERS:
                runs = results.get(f"{client}|{peer.name}|{c}")
                if not runs:
                    continue
                rate = statistics.median(x["throughput"] for x in runs)
                rows.append({
                    "client": client, "concurrency": c, "server": peer.name, "throughput": rate,
                    "p50_ms": statistics.median(x["p50_ms"] for x in runs),
                    "p99_ms": statistics.median(x["p99_ms"] for x in runs),
                    "failures": sum(x["failures"] for x in runs), "runs": [round(x["throughput"]) for x in runs],
                    "vs_infermux": rate / base_rate if math.isfinite(base_rate) else float("nan"),
                })  # fmt: skip
    minutes = (time.monotonic() - started) / 60
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "minutes": minutes,
        "status": status,
        "rows": rows,
    }
    (args.out / "peers.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        f"# infermux and its peers: `simple` add/sub ({os.cpu_count()} cores, median of {args.rounds} "
        f"alternating rounds, {minutes:.1f} min)",
        "",
        "Clients: `v2-http` / `v2-grpc` = `infermux bench` (binary tensors); `json` = `hey` with each "
        "server's JSON (V2 JSON for V2 servers). Ratios are throughput / infermux's with the same client.",
        "",
        "| client | c | server | req/s | vs infermux | p50 ms | p99 ms | failed | runs |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['client']} | {row['concurrency']} | {row['server']} | {row['throughput']:,.0f} | "
            f"{row['vs_infermux']:.2f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['failures']} | "
            f"{', '.join(map(str, row['runs']))} |"
        )
    lines += ["", "Peers: " + "; ".join(status.values())]
    (args.out / "peers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
