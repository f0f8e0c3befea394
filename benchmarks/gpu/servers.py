"""Starting the servers under test: ``infermux serve`` and the two peers (peers.py), each bound to
127.0.0.1 in its own process group, and waiting until each answers as ready."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpuroles import executor_pids
from perfanalyzer import PROTOCOLS as PA_PROTOCOLS
from procs import GroupProcess, free_port, http_ok

HERE = Path(__file__).resolve().parent
SERVERS = ("infermux", "litserve", "fastapi")
# The protocols each server speaks (loadgen.py's, then perf_analyzer's); the peers have one HTTP
# route each.
PROTOCOLS = {"infermux": ("grpc_shm", "grpc", "http", *PA_PROTOCOLS), "litserve": ("http_json",)}
PROTOCOLS["fastapi"] = PROTOCOLS["litserve"]
_READY = re.compile(r"ready: (.*) \(models:")
_HTTP = re.compile(r"HTTP on http://([\d.]+:\d+)")
_GRPC = re.compile(r"gRPC on ([\d.]+:\d+)")


@dataclass
class Server:
    name: str
    process: GroupProcess
    http_url: str = ""  # infermux: base URL; peers: the /predict URL
    grpc_target: str = ""
    info: dict[str, Any] = field(default_factory=dict)


def _env() -> dict[str, str]:
    # Unbuffered so that the readiness line reaches the log at once.
    return dict(os.environ, PYTHONUNBUFFERED="1")


def start_infermux(
    repo: Path,
    model: str,
    log: Path,
    timeout: float = 300,
    *,
    frontends: int = 1,
    executors: int = 1,
    env: dict[str, str] | None = None,
    max_shm_regions: int = 256,
) -> Server:
    command = [
        sys.executable,
        "-m",
        "infermux",
        "serve",
        "--model-repository",
        str(repo),
        "--host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        "--allow-client-shm",
        "true",
        "--max-shm-regions",
        str(max_shm_regions),
        "--frontends",
        str(frontends),
        "--executors",
        str(executors),
    ]
    process = GroupProcess("infermux", command, log, {**_env(), **(env or {})})
    server = Server("infermux", process)
    process.start()

    def ready() -> bool:
        if not server.http_url:
            found = _READY.search(process.log_text())
            if not found:
                return False
            http, grpc = _HTTP.search(found.group(1)), _GRPC.search(found.group(1))
            if http is None or grpc is None:
                raise RuntimeError(f"infermux did not announce HTTP and gRPC: {found.group(0)}")
            server.http_url, server.grpc_target = f"http://{http.group(1)}", grpc.group(1)
        return http_ok(f"{server.http_url}/v2/health/ready") and http_ok(
            f"{server.http_url}/v2/models/{model}/ready"
        )

    server.info["startup_s"] = round(process.wait_for(ready, timeout), 2)
    server.info["command"] = " ".join(command)
    server.info["frontends"], server.info["executors"] = frontends, executors
    # Named by the supervisor's ready line; a one-process server has none (cpuroles.py).
    server.info["executor_pids"] = sorted(executor_pids(process.log_text()))
    return server


def start_peer(
    name: str,
    model: str,
    model_file: Path,
    log: Path,
    *,
    device: str,
    tiny: bool,
    workers: int,
    max_batch: int,
    batch_timeout: float,
    timeout: float = 300,
) -> Server:
    port = free_port()
    command = [
        sys.executable,
        str(HERE / "peers.py"),
        name,
        "--model",
        model,
        "--model-file",
        str(model_file),
        "--port",
        str(port),
        "--device",
        device,
        "--workers",
        str(workers),
        "--max-batch",
        str(max_batch),
        "--batch-timeout",
        str(batch_timeout),
    ]
    if tiny:
        command.append("--tiny")
    process = GroupProcess(name, command, log, _env())
    server = Server(name, process, http_url=f"http://127.0.0.1:{port}/predict")
    process.start()
    health = f"http://127.0.0.1:{port}/health"
    server.info["startup_s"] = round(process.wait_for(lambda: http_ok(health), timeout), 2)
    server.info["command"] = " ".join(command)
    if name == "litserve":
        server.info.update(
            workers_per_device=workers, max_batch_size=max_batch, batch_timeout_s=batch_timeout
        )
    else:
        server.info.update(batching=False, processes=1)
    return server
