"""One short streaming point against one ``infermux serve``, for profiling and A/B comparisons.

Starts ``infermux serve --frontends F`` on ``repository/`` (the code on ``PYTHONPATH``), drives it
with ``client.run_plan`` in this process (c streams, N responses per request, a pause between
them) and prints one JSON line: responses/s in the window and the server's CPU (its whole
process group, user + system, or user only with ``--user-only``) per response, also per
process. ``--py-spy PREFIX`` records each server process during the window (speedscope, GIL
holders only: where the Python-level time goes); ``--perf FILE`` runs ``perf record -g`` on them
(the native and kernel side). ``results/streaming/profile.md`` was made with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import client

HERE = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def group_cpu(pgid: int, user_only: bool) -> dict[int, float]:
    """CPU seconds of each process of group ``pgid``."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            out[int(entry)] = (int(fields[11]) + (0 if user_only else int(fields[12]))) / TICK
    return out


def recorders(args: argparse.Namespace, pids: list[int]) -> list[subprocess.Popen[bytes]]:
    seconds = str(int(args.window))
    procs = []
    if args.perf:
        command = ["perf", "record", "-F", "999", "-g", "-o", args.perf, "-p"]
        command += [",".join(map(str, pids)), "--", "sleep", seconds]
        procs.append(
            subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
    for pid in pids if args.py_spy else ():
        command = ["py-spy", "record", "--gil", "-r", "200", "-d", seconds, "-f", "speedscope"]
        command += ["--threads", "-o", f"{args.py_spy}_{pid}.json", "-p", str(pid)]
        procs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))
    return procs


async def measure(args: argparse.Namespace, url: str, pgid: int) -> dict[str, Any]:
    now = time.monotonic_ns()
    start = now + int(0.5e9)
    begin = start + int(args.warmup * 1e9)
    end = begin + int(args.window * 1e9)
    plan = client.Plan(
        url=url, first_stream=0, streams=args.streams, tokens=args.tokens, delay_us=args.delay_us,
        payload=16, start_ns=start, stop_ns=end, give_up_ns=end + int(5e9),
    )  # fmt: skip
    driving = asyncio.create_task(client.run_plan(plan))
    await asyncio.sleep((begin - time.monotonic_ns()) / 1e9)
    before = group_cpu(pgid, args.user_only)
    spies = recorders(args, list(before))
    await asyncio.sleep((end - time.monotonic_ns()) / 1e9)
    after = group_cpu(pgid, args.user_only)
    record = await driving
    for spy in spies:
        spy.wait()
    arrival = record["arrival"]
    count = max(1, int(((arrival >= begin) & (arrival < end)).sum()))
    used = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    return {
        "F": args.frontends, "c": args.streams, "delay_us": args.delay_us,
        "rps": round(count / args.window),
        "cpu_us_per_resp": round(sum(used.values()) / count * 1e6, 1),
        "per_proc_us": {pid: round(v / count * 1e6, 1) for pid, v in used.items() if v > 0},
        "errors": record["error_count"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frontends", type=int, default=1)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--delay-us", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--window", type=float, default=4)
    parser.add_argument("--user-only", action="store_true")
    parser.add_argument("--py-spy", default="", metavar="PREFIX")
    parser.add_argument("--perf", default="", metavar="FILE")
    args = parser.parse_args()
    ports = [free_port() for _ in range(3)]
    command = [
        sys.executable, "-m", "infermux", "serve", "--model-repository", str(HERE / "repository"),
        "--host", "127.0.0.1", "--frontends", str(args.frontends), "--http-port", str(ports[0]),
        "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
    ]  # fmt: skip
    server = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        ready = f"http://127.0.0.1:{ports[0]}/v2/models/{client.MODEL}/ready"
        for _ in range(300):
            try:
                urllib.request.urlopen(ready, timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("the server did not get ready")
        url = f"127.0.0.1:{ports[1]}"
        print(json.dumps(asyncio.run(measure(args, url, server.pid))))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
