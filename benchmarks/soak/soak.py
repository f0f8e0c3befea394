"""Soak: a million requests against one `infermux serve`, its memory and file descriptors
sampled throughout (issue 11; target: growth under 5%).

The load is Debian's ``hey`` (a Go client, so the client costs the server little CPU) posting
V2 JSON to ``simple`` at a fixed concurrency until ``--requests`` are sent; a sampler reads
every server process's RSS and open descriptors from /proc every ``--every`` seconds. Growth is
the last tenth of the run's samples against the tenth after warm-up (the first 10% of the run),
so that allocator pools and caches filling at start are not counted as a leak.

    python benchmarks/soak/soak.py [--requests 1000000] [--concurrency 32] [--frontends 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import stop_group

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"ready: HTTP on http://([^:]+):(\d+)")
BODY = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]
}


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (front ends, executors)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def sample(pid: int) -> tuple[int, int]:
    """(RSS bytes, open descriptors) summed over the server's processes."""
    rss = fds = 0
    for process in tree(pid):
        try:
            status = Path(f"/proc/{process}/status").read_text()
            rss += int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]
            fds += len(os.listdir(f"/proc/{process}/fd"))
        except (OSError, AttributeError):
            continue  # gone meanwhile, or a kernel thread
    return rss, fds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--frontends", type=int, default=1)
    p.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak")
    args = p.parse_args()
    command = [sys.executable, "-m", "infermux", "serve", "--http-port", "0", "--grpc-port", "0",
               "--metrics-port", "0", "--frontends", str(args.frontends)]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert server.stderr is not None
    url = ""
    for line in server.stderr:
        match = READY.search(line)
        if match:
            url = f"http://{match.group(1)}:{match.group(2)}"
            break
    if not url:
        raise SystemExit("the server did not start")
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()  # type: ignore[union-attr]
    body = Path(tempfile.mkdtemp()) / "body.json"
    body.write_text(json.dumps(BODY))
    samples: list[tuple[float, int, int]] = []
    done = threading.Event()
    started = time.monotonic()

    def sampler() -> None:
        while not done.is_set():
            rss, fds = sample(server.pid)
            samples.append((time.monotonic() - started, rss, fds))
            done.wait(args.every)

    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    try:
        load = subprocess.run(
            ["hey", "-n", str(args.requests), "-c", str(args.concurrency), "-m", "POST",
             "-T", "application/json", "-D", str(body), f"{url}/v2/models/simple/infer"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        done.set()
        watcher.join()
        stop_group(server, 60)
    seconds = time.monotonic() - started
    text = load.stdout
    statuses = {int(c): int(n) for c, n in re.findall(r"\[(\d+)\]\s+(\d+) responses", text)}
    errors = re.search(r"Error distribution:(.*)", text, flags=re.DOTALL)
    tenth = max(1, len(samples) // 10)
    early, late = samples[tenth : 2 * tenth], samples[-tenth:]

    def growth(index: int) -> float:
        before = statistics.mean(s[index] for s in early)
        return statistics.mean(s[index] for s in late) / before - 1

    result = {
        "requests": args.requests, "concurrency": args.concurrency, "frontends": args.frontends,
        "seconds": round(seconds, 1), "cpus": os.cpu_count(), "statuses": statuses,
        "client_errors": errors.group(1).strip() if errors else "",
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),  # type: ignore[union-attr]
        "rss_growth": growth(1), "fd_growth": growth(2),
        "rss_mib_first_last": [samples[0][1] / 2**20, samples[-1][1] / 2**20],
        "fds_first_last": [samples[0][2], samples[-1][2]],
        "samples": samples,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"soak-{args.frontends}frontends-{os.cpu_count()}cores"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    summary = (
        f"# Soak: {args.requests:,} requests, hey c={args.concurrency}, `--frontends "
        f"{args.frontends}`, {os.cpu_count()} cores, {seconds / 60:.1f} min\n\n"
        "| statuses | client errors | req/s | RSS MiB (first → last sample) | RSS growth | fds "
        "(first → last) | fd growth |\n|---|---|---:|---|---:|---|---:|\n"
        f"| {statuses} | {result['client_errors'] or 'none'} | {result['requests_per_s']:,.0f} | "
        f"{samples[0][1] / 2**20:,.0f} → {samples[-1][1] / 2**20:,.0f} | "
        f"{result['rss_growth']:+.1%} | {samples[0][2]} → {samples[-1][2]} | "
        f"{result['fd_growth']:+.1%} |\n\nGrowth: mean of the last tenth of the samples against "
        "the mean of the second tenth (after warm-up); target < 5%.\n"
    )
    (args.out / f"{stem}.md").write_text(summary)
    print(summary)


if __name__ == "__main__":
    main()
