"""What every benchmark script needs from the machine: which one it is, how much CPU a process
group used, and how to stop a server's whole process group.

Benchmarks are scripts run by path (``python benchmarks/x.py``, ``python benchmarks/gpu/run.py``),
not a package: scripts in a sub-folder put ``benchmarks/`` on ``sys.path`` to import this module.
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def machine_info(**extra: Any) -> dict[str, Any]:
    """The machine a result was measured on (CPU model, cores, memory, Python, load), plus
    ``extra`` (the script's own settings: pinned cores and the like)."""
    cpu = memory = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        memory = Path("/proc/meminfo").read_text().splitlines()[0]
    except (OSError, IndexError):
        pass
    return {
        "platform": platform.platform(),
        "cpu_model": cpu,
        "nproc": os.cpu_count(),
        "memory": memory,
        "python": sys.version.split()[0],
        "loadavg_start": [round(v, 2) for v in os.getloadavg()],
        **extra,
    }


def free_port() -> int:
    """A port nothing listens on now (for servers that refuse port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stats_counters(document: Any) -> dict[str, int]:
    """The counters of one model's entry in a statistics-extension answer
    (``GET /v2/models/{name}/stats``): inferences, executions, and count/ns per phase."""
    stats = document["model_stats"][0]
    out = {
        "inference_count": int(stats["inference_count"]),
        "execution_count": int(stats["execution_count"]),
    }
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        entry = stats["inference_stats"].get(key, {"count": 0, "ns": 0})
        out[f"{key}_count"] = int(entry["count"])
        out[f"{key}_ns"] = int(entry["ns"])
    return out


def batch_counters(document: Any) -> dict[int, tuple[int, int]]:
    """Executions by batch size from one model's ``batch_stats`` (statistics extension):
    ``{rows: (executions, compute-infer ns)}``."""
    out = {}
    for entry in document["model_stats"][0].get("batch_stats", []):
        infer = entry.get("compute_infer", {"count": 0, "ns": 0})
        out[int(entry["batch_size"])] = (int(infer["count"]), int(infer["ns"]))
    return out


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may contain spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def group_pids(pgid: int) -> set[int]:
    """Every live process whose process group is ``pgid``."""
    pids = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if fields is not None and int(fields[2]) == pgid:
                pids.add(int(entry.name))
    return pids


def cpu_seconds(pids: set[int]) -> float:
    """utime + stime of ``pids`` (all their threads; a process that exited since is not counted)."""
    total = 0
    for pid in pids:
        fields = stat_fields(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICK


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (NaN when it cannot be read)."""
    fields = stat_fields(pid)
    if fields is None:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


def stop_group(process: subprocess.Popen[Any], grace: float = 10) -> float:
    """SIGTERM to ``process``'s group (started with ``start_new_session``: the group id is the
    leader's pid), SIGKILL to whatever is left after ``grace`` seconds; the seconds it took.
    The leader may exit before its workers, so the whole group is waited for, not the leader."""
    started = time.monotonic()
    pgid = process.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = started + grace
    while time.monotonic() < deadline and (process.poll() is None or group_pids(pgid)):
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    return time.monotonic() - started


def tritonserver_command(
    venv: Path, repository: Path, ports: list[int]
) -> tuple[list[str], dict[str, str]]:
    """tritonserver from PyTriton's wheel in ``venv`` serving ``repository`` on loopback
    (/work/shared/reference/peers.md): the Python-backend stub for the venv's Python is copied
    into the backend folder when missing (the wheel ships one per Python version), and
    LD_LIBRARY_PATH names the interpreter's LIBDIR, where the stub finds libpython."""
    import shutil
    import sysconfig

    lib = next((venv / "lib").glob("python3*/site-packages/pytriton/tritonserver"))
    python = venv / "bin" / "python"
    version = subprocess.run(
        [str(python), "-c", "import sys;print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    stub = lib / "backends" / "python" / "triton_python_backend_stub"
    if not stub.exists():
        shutil.copy(lib / "python_backend_stubs" / version / stub.name, stub)
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=sysconfig.get_config_var("LIBDIR"),
        PATH=f"{venv / 'bin'}:{os.environ['PATH']}",
    )
    env.pop("PYTHONPATH", None)
    command = [
        str(lib / "bin" / "tritonserver"), "--model-repository", str(repository),
        "--backend-directory", str(lib / "backends"),
        "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
        "--metrics-address", "127.0.0.1",
    ]  # fmt: skip
    return command, env
