"""Triton's ``perf_analyzer`` as the client of infermux points: protocols ``pa_grpc_shm``,
``pa_grpc_cuda_shm``, ``pa_grpc`` and ``pa_http``, one perf_analyzer run per point.

Each run sends the reference request of specs.py (``--input-data`` JSON, base64 tensors: random
INT64 ids would index past BERT's vocabulary), batch 1 (``-b 1``), default synchronous mode (one
thread per in-flight request), ``-v`` so that every measurement pass is in the log. perf_analyzer
stabilises by itself: ``--measurement-interval`` windows until 3 in a row agree within
``--stability-percentage`` or ``--max-trials`` is reached. Its ``-f`` CSV gives the figures; when
no measurement was stable (rc 2, no CSV), or the passes outlasted the point's time limit, the last
pass's throughput and mean latency are kept and the point is marked ``unstable``.

perf_analyzer's gRPC clients share a channel (one TCP connection) between up to
``TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT`` of its threads, so at low concurrency all gRPC
requests reach one infermux front end; ``--pa-grpc-channel-share`` sets that variable.

The server-side readings (NVML, CPU per process, stats delta) cannot see perf_analyzer's windows,
so they cover its whole run from ``warmup`` seconds after its start until it exits.

Locating the binary (``locate``): ``--perf-analyzer CMD``, else ``$PA``, else ``perf_analyzer``
on PATH, else ``.whl/perf_analyzer.tgz`` (../shared/tools/perf-analyzer-bundle.sh) unpacked into
``/tmp/pa`` and run through its own dynamic loader when the system's glibc is too old for it.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specs import ModelSpec

PROTOCOLS: dict[str, list[str]] = {
    "pa_grpc_shm": ["-i", "grpc", "--shared-memory", "system"],
    "pa_grpc_cuda_shm": ["-i", "grpc", "--shared-memory", "cuda"],
    "pa_grpc": ["-i", "grpc"],
    "pa_http": ["-i", "http"],
}
# The load generator's protocol closest to each (server warm-up, answer checks).
LOADGEN_EQUIVALENT = {
    "pa_grpc_shm": "grpc_shm",
    "pa_grpc_cuda_shm": "grpc_shm",
    "pa_grpc": "grpc",
    "pa_http": "http",
}
# -f CSV column -> JSON key (all µs); the latency percentiles become milliseconds below.
COLUMNS = {
    "Inferences/Second": "items_per_s",
    "Client Send": "pa_client_send_us",
    "Network+Server Send/Recv": "pa_network_server_us",
    "Server Queue": "pa_server_queue_us",
    "Server Compute Input": "pa_server_compute_input_us",
    "Server Compute Infer": "pa_server_compute_infer_us",
    "Server Compute Output": "pa_server_compute_output_us",
    "Client Recv": "pa_client_recv_us",
    "p50 latency": "p50_ms",
    "p90 latency": "p90_ms",
    "p95 latency": "p95_ms",
    "p99 latency": "p99_ms",
}
_PASS = re.compile(
    r"Pass \[(\d+)\] throughput: ([\d.]+) infer/sec\. Avg latency: (\d+) usec \(std (\d+) usec\)"
)
UNSTABLE_RC = 2  # "Failed to obtain stable measurement"
BUNDLE = Path(".whl") / "perf_analyzer.tgz"
UNPACK = Path("/tmp/pa")


def _works(argv: list[str]) -> bool:
    try:
        done = subprocess.run([*argv, "--version"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _unpack(bundle: Path) -> list[str] | None:
    """The bundle's three lines (perf-analyzer-bundle.sh): unpack, try the binary, else run it
    through the bundled loader and libraries."""
    binary = UNPACK / "wheel" / "perf_analyzer" / "bin" / "perf_analyzer"
    if not binary.is_file():
        UNPACK.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "xzf", str(bundle), "-C", str(UNPACK)], check=True, timeout=120)
    if _works([str(binary)]):
        return [str(binary)]
    lib = UNPACK / "root" / "usr" / "lib" / "x86_64-linux-gnu"
    argv = [str(lib / "ld-linux-x86-64.so.2"), "--library-path", str(lib), str(binary)]
    return argv if _works(argv) else None


def locate(explicit: str, root: Path) -> tuple[list[str] | None, str]:
    """(argv prefix of a working perf_analyzer, or None; where it came from or why not)."""
    tried = []
    for how, command in (("--perf-analyzer", explicit), ("$PA", os.environ.get("PA", ""))):
        if command:
            argv = shlex.split(command)
            if _works(argv):
                return argv, f"{how}: {command}"
            tried.append(f"{how} {command!r} does not run")
    on_path = shutil.which("perf_analyzer")
    if on_path and _works([on_path]):
        return [on_path], f"PATH: {on_path}"
    bundle = root / BUNDLE
    if bundle.is_file():
        try:
            argv_or_none = _unpack(bundle)
        except (OSError, subprocess.SubprocessError) as exc:
            argv_or_none = None
            tried.append(f"{bundle}: {exc}")
        if argv_or_none:
            return argv_or_none, f"{bundle} unpacked into {UNPACK}"
        tried.append(f"{bundle} unpacked but does not run")
    else:
        tried.append(f"no {bundle}")
    return None, "perf_analyzer not found: " + "; ".join(tried)


def write_input_data(spec: ModelSpec, ref: dict[str, Any], path: Path) -> Path:
    """The reference request as perf_analyzer's --input-data JSON (shapes without the batch)."""
    entry = {
        t.name: {
            "b64": base64.b64encode(ref[t.name].astype(t.dtype).tobytes()).decode(),
            "shape": list(t.dims),
        }
        for t in spec.inputs
    }
    path.write_text(json.dumps({"data": [entry]}))
    return path


def command(
    pa: list[str],
    *,
    model: str,
    url: str,
    protocol: str,
    concurrency: int,
    input_data: Path,
    csv_path: Path,
    interval_ms: int,
    stability: float,
    max_trials: int,
    extra: list[str],
) -> list[str]:
    return [
        *pa,
        "-m",
        model,
        "-u",
        url,
        *PROTOCOLS[protocol],
        "-b",
        "1",
        "--input-data",
        str(input_data),
        "--concurrency-range",
        str(concurrency),
        "--measurement-interval",
        str(interval_ms),
        "--stability-percentage",
        f"{stability:g}",
        "--max-trials",
        str(max_trials),
        "-f",
        str(csv_path),
        "-v",
        *extra,
    ]


def run(
    argv: list[str],
    log_path: Path,
    *,
    warmup: float,
    timeout: float,
    shm_names: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    on_start: Callable[[], None] = lambda: None,
    on_end: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Run perf_analyzer once; ``on_start`` ``warmup`` s after it starts, ``on_end`` when it has
    exited (neither when it exits before the warm-up is over). Parses its CSV and log."""
    csv_path = Path(argv[argv.index("-f") + 1])
    csv_path.unlink(missing_ok=True)
    shm_before = _shm_entries()
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    windowed = False
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env} if env else None,
        )
        try:
            try:
                proc.wait(timeout=warmup)
            except subprocess.TimeoutExpired:
                on_start()
                windowed = True
            rc: int | None = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
        finally:
            if proc.poll() is None:  # KeyboardInterrupt, SystemExit
                proc.kill()
                proc.wait()
        if windowed:
            on_end()
    wall = time.monotonic() - started
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    leftovers = _remove_leftovers(shm_before, shm_names)
    log_text = log_path.read_text(errors="replace")
    result: dict[str, Any] = {
        "pa_rc": rc,
        "pa_wall_s": round(wall, 2),
        "client_cpu": round(cpu / wall, 3) if wall > 0 else None,
        "pa_passes": passes(log_text),
        "window_s": round(wall - warmup, 2) if windowed else None,
    }
    if leftovers:
        result["pa_shm_leftovers_removed"] = leftovers
    figures = read_csv(csv_path)
    # No stable window: perf_analyzer gave up (rc 2), or its passes outlasted the point's time
    # (the H200 lost gRPC and HTTP at c=256 that way after two passes each).
    unstable = rc in (UNSTABLE_RC, None)
    if figures:
        result.update(figures, errors=0)
    elif unstable and result["pa_passes"]:
        last = result["pa_passes"][-1]
        result.update(items_per_s=last["items_per_s"], mean_ms=last["avg_latency_ms"])
        result.update(p50_ms=None, p90_ms=None, p99_ms=None, unstable=True, errors=0)
    if rc != 0:
        tail = " ".join(log_text[-1500:].split())
        why = "timed out" if rc is None else f"rc={rc}"
        if rc == -signal.SIGKILL:  # nothing here kills it before its timeout: the OOM killer
            why += " (killed: SIGKILL, most likely out of memory)"
        if "items_per_s" in result:
            result["pa_note"] = f"perf_analyzer {why}: {tail[-400:]}"
        else:  # a request failed (perf_analyzer stops at the first), or it did not start
            result["error"] = f"perf_analyzer {why}: {tail}"
    return result


def read_csv(path: Path) -> dict[str, Any]:
    """The -f CSV's one row (empty when there is no CSV)."""
    try:
        rows = list(csv.DictReader(path.read_text().splitlines()))
    except OSError:
        return {}
    if not rows:
        return {}
    row, out = rows[0], {}
    for column, key in COLUMNS.items():
        value = row.get(column)
        if value in (None, ""):
            continue
        number = float(value)
        out[key] = round(number / 1e3, 3) if key.endswith("_ms") else number
    return out


def passes(log_text: str) -> list[dict[str, float]]:
    return [
        {
            "items_per_s": float(m.group(2)),
            "avg_latency_ms": round(int(m.group(3)) / 1e3, 3),
            "std_latency_ms": round(int(m.group(4)) / 1e3, 3),
        }
        for m in _PASS.finditer(log_text)
    ]


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _remove_leftovers(before: set[str], names: tuple[str, ...]) -> list[str]:
    """perf_analyzer names its system shm keys after the tensors (/INPUT__0_0_0, /OUTPUT__0) and
    leaves them behind when killed or when a registration fails; a later run would collide."""
    removed = []
    for entry in sorted(_shm_entries() - before):
        if names and entry.startswith(names):
            Path("/dev/shm", entry).unlink(missing_ok=True)
            removed.append(entry)
    return removed


def expected_s(interval_ms: int, max_trials: int) -> tuple[float, float]:
    """(usual, worst) wall seconds of one run: 3 passes at least, ``max_trials`` at most, plus
    start-up (model metadata, shm registration) and teardown."""
    per = interval_ms / 1e3
    return 3 * per + 1.5, max_trials * per + 2.0
