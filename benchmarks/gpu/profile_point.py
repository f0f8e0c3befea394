"""Where one saturated point's CPU goes: per process and per thread of an ``infermux serve``
group, with py-spy profiles of every process, while perf_analyzer drives it.

    python benchmarks/gpu/profile_point.py --out DIR --repo REPO --model resnet50 \
        --pa "CMD" [--protocols grpc_shm,http] [--concurrency 256] [--frontends 4]

For each protocol: a fresh server (own process group, 127.0.0.1), perf_analyzer at the given
concurrency in the background; after a warm-up, a sampling window in which every process's and
thread's CPU time (``/proc/<pid>/task/<tid>/stat``) and the model's ``/stats`` counters are read
at both ends, and ``py-spy record --threads`` runs on every process of the group. Writes
``DIR/profile_<proto>.json`` (per role and thread: CPU cores, µs per request, µs per batch) and
one collapsed py-spy file per process, summarised (top inclusive frames per thread) in
``DIR/profile_<proto>.md``. stdlib only, plus py-spy and perf_analyzer on PATH or given.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import stop_group

TICK = os.sysconf("SC_CLK_TCK")
PA_ARGS = {
    "grpc_shm": ["-i", "grpc", "--shared-memory", "system"],
    "grpc_cuda_shm": ["-i", "grpc", "--shared-memory", "cuda"],
    "grpc": ["-i", "grpc"],
    "http": ["-i", "http"],
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def wait_ready(url: str, model: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            get_json(f"{url}/v2/models/{model}/stats")
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError("server not ready")


def group(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                pids.append(int(entry))
    return sorted(pids)


def role(pid: int, supervisor: int) -> str:
    if pid == supervisor:
        return "supervisor"
    try:
        comms = {Path(t, "comm").read_text().strip() for t in Path(f"/proc/{pid}/task").iterdir()}
    except OSError:
        return "gone"
    if any(c.startswith(("grpc", "event_engine")) for c in comms):
        return "frontend"
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    if "resource_tracker" in cmd:
        return "tracker"
    return "executor"


def threads(pid: int) -> dict[str, float]:
    """CPU seconds by thread (name:tid)."""
    out = {}
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                out[f"{name}:{task.name}"] = (int(fields[11]) + int(fields[12])) / TICK
            except OSError:
                continue
    except OSError:
        pass
    return out


def counters(url: str, model: str) -> tuple[int, int]:
    stats = get_json(f"{url}/v2/models/{model}/stats")["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def collapse(path: Path, top: int = 22) -> list[str]:
    """Top inclusive frames per thread of a py-spy raw (collapsed) file."""
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: collections.Counter[str] = collections.Counter()
    if not path.exists():
        return [f"(no profile: {path.name})"]
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        thread, n = frames[0], int(count)
        totals[thread] += n
        for frame in set(frames[1:]):
            per[thread][frame] += n
    lines = []
    for thread, total in totals.most_common():
        if total < 20:
            continue
        lines.append(f"- {thread}: {total} samples")
        for frame, n in per[thread].most_common(top):
            if "(<string>" in frame or "multiprocessing" in frame or "runners.py" in frame:
                continue
            lines.append(f"  - {n / total * 100:5.1f}% {frame}")
    return lines


def run_protocol(args: argparse.Namespace, proto: str) -> dict[str, Any]:
    hp, gp, mp = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{hp}"
    log = open(args.out / f"server_{proto}.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "infermux", "serve", "--model-repository", str(args.repo),
         "--host", "127.0.0.1", "--http-port", str(hp), "--grpc-port", str(gp),
         "--metrics-port", str(mp), "--allow-client-shm", "true",
         "--frontends", str(args.frontends), *shlex.split(args.server_args)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    result: dict[str, Any] = {"protocol": proto, "concurrency": args.concurrency}
    try:
        wait_ready(url, args.model, 180)
        target = f"127.0.0.1:{gp}" if proto.startswith("grpc") else f"127.0.0.1:{hp}"
        pa_cmd = [*shlex.split(args.pa), "-m", args.model, "-u", target, *PA_ARGS[proto],
                  "--concurrency-range", str(args.concurrency), "--measurement-interval", "4000",
                  "--stability-percentage", "25", "--max-trials", "4",
                  "-f", str(args.out / f"pa_{proto}.csv")]  # fmt: skip
        result["pa_command"] = shlex.join(pa_cmd)
        pa_log = open(args.out / f"pa_{proto}.log", "w")
        pa = subprocess.Popen(pa_cmd, stdout=pa_log, stderr=subprocess.STDOUT)
        time.sleep(args.warmup)
        pids = group(server.pid)
        roles = {pid: role(pid, server.pid) for pid in pids}
        before = {pid: threads(pid) for pid in pids}
        c0, e0 = counters(url, args.model)
        t0 = time.monotonic()
        spies = [
            subprocess.Popen(
                [
                    args.py_spy,
                    "record",
                    "--threads",
                    "--nonblocking",
                    "-r",
                    "100",
                    "-d",
                    str(max(1, int(args.window))),
                    "-f",
                    "raw",
                    "-o",
                    str(args.out / f"spy_{proto}_{pid}.txt"),
                    "-p",
                    str(pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=open(args.out / f"spy_{proto}_{pid}.err", "w"),
            )
            for pid in pids
            if roles[pid] in ("executor", "frontend", "supervisor") and args.profile
        ]
        time.sleep(args.window)
        after = {pid: threads(pid) for pid in pids}
        c1, e1 = counters(url, args.model)
        elapsed = time.monotonic() - t0
        for spy in spies:
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
        requests, batches = c1 - c0, e1 - e0
        result.update(
            window_s=round(elapsed, 2), requests=requests, batches=batches,
            rate=round(requests / elapsed, 1), avg_batch=round(requests / max(batches, 1), 2),
        )  # fmt: skip
        processes = []
        for pid in pids:
            per_thread = {
                t: round(after[pid].get(t, 0) - before[pid].get(t, 0), 3) for t in after[pid]
            }
            cpu = sum(per_thread.values())
            processes.append(
                {
                    "pid": pid,
                    "role": roles[pid],
                    "cores": round(cpu / elapsed, 3),
                    "us_per_request": round(cpu / max(requests, 1) * 1e6, 1),
                    "us_per_batch": round(cpu / max(batches, 1) * 1e6, 1),
                    "threads": {t: round(v / elapsed, 3) for t, v in per_thread.items() if v},
                }
            )
        result["processes"] = processes
        pa.wait(timeout=240)
        result["pa_rc"] = pa.returncode
        result["pa_tail"] = (args.out / f"pa_{proto}.log").read_text()[-600:]
    finally:
        stop_group(server, 30)
    return result


def render(result: dict[str, Any], out: Path) -> str:
    lines = [
        f"# {result['protocol']} c={result['concurrency']}: {result.get('rate')} req/s, "
        f"avg batch {result.get('avg_batch')}",
        "",
        "| pid | role | cores | µs/request | µs/batch | busiest threads (cores) |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for p in result.get("processes", []):
        busiest = sorted(p["threads"].items(), key=lambda kv: -kv[1])[:4]
        lines.append(
            f"| {p['pid']} | {p['role']} | {p['cores']} | {p['us_per_request']} | "
            f"{p['us_per_batch']} | {', '.join(f'{t} {v}' for t, v in busiest)} |"
        )
    for p in result.get("processes", []):
        spy = out / f"spy_{result['protocol']}_{p['pid']}.txt"
        if spy.exists():
            lines += ["", f"## py-spy {p['role']} {p['pid']}", *collapse(spy)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--pa", required=True)
    parser.add_argument("--protocols", default="grpc_shm,http")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--frontends", type=int, default=4)
    parser.add_argument("--server-args", default="")
    parser.add_argument("--warmup", type=float, default=6.0)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for proto in args.protocols.split(","):
        result = run_protocol(args, proto)
        (args.out / f"profile_{proto}.json").write_text(json.dumps(result, indent=1))
        text = render(result, args.out)
        (args.out / f"profile_{proto}.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()
