"""CPU time of an infermux process group split by role, and of the executor's threads.

Roles: with ``--frontends N > 1`` (or ``--executors > 1``) the group leader is the
``supervisor``; the executor pids are the ones its ready line names ("executor pid(s) ...");
multiprocessing's ``resource_tracker`` is recognised by its command line; every other
``spawn_main`` child is a ``frontend``. A one-process server is role ``server`` (front end and
executor in one). Anything else in the group is ``other``.

CPU is utime + stime of /proc/<pid>/stat (all threads of the process) and, per thread, of
/proc/<pid>/task/<tid>/stat, named by /proc/<pid>/task/<tid>/comm (or the Python thread name,
when py-spy could tell it). Differences of two snapshots, divided by the server's own request and
batch counts over the same span (the stats delta), give µs per request and per batch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from procs import CLOCK_TICK

_EXECUTORS = re.compile(r"executor pids? ([\d, ]+)\)")
THREADS_SHOWN = 8


def executor_pids(log_text: str) -> set[int]:
    """The executor pids of the supervisor's ready line (empty for a one-process server)."""
    found = _EXECUTORS.findall(log_text)
    return {int(p) for p in found[-1].replace(",", " ").split()} if found else set()


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _ticks(stat_path: str) -> int | None:
    try:
        text = Path(stat_path).read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def roles(leader: int, pids: set[int], executors: set[int]) -> dict[int, str]:
    """pid -> role; front ends and executors get an index in pid order when there are several."""
    out: dict[int, str] = {}
    children = pids - {leader}
    for pid in children:
        command = _cmdline(pid)
        if pid in executors:
            out[pid] = "executor"
        elif "resource_tracker" in command:
            out[pid] = "resource_tracker"
        elif "spawn_main" in command:
            out[pid] = "frontend"
        else:
            out[pid] = "other"
    if leader in pids:
        out[leader] = (
            "supervisor" if any(r in ("frontend", "executor") for r in out.values()) else "server"
        )
    return out


def snapshot(
    leader: int, pids: set[int], executors: set[int], names: dict[int, str] | None = None
) -> dict[str, Any]:
    """CPU ticks per process (with its role) and per thread of the executor(s) or the one server."""
    role_of = roles(leader, pids, executors)
    procs = {pid: (role, _ticks(f"/proc/{pid}/stat")) for pid, role in role_of.items()}
    threads: dict[int, tuple[int, str, int]] = {}  # tid -> (pid, name, ticks)
    for pid, role in role_of.items():
        if role not in ("executor", "server"):
            continue
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            ticks = _ticks(f"/proc/{pid}/task/{tid}/stat")
            if ticks is None:
                continue
            try:
                comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                comm = "?"
            threads[tid] = (pid, comm, ticks)
    return {"procs": procs, "threads": threads, "names": dict(names or {})}


def delta(
    before: dict[str, Any],
    after: dict[str, Any],
    *,
    span: float,
    requests: int | None,
    batches: int | None,
) -> dict[str, Any]:
    """Per role and per process: cores over ``span`` s, µs per request; the executor also per
    batch, and its busiest threads."""

    def per(seconds: float, count: int | None) -> float | None:
        return round(seconds * 1e6 / count, 1) if count else None

    by_role: dict[str, float] = {}
    per_process = []
    for pid, (role, ticks) in sorted(after["procs"].items()):
        if ticks is None:
            continue
        start = before["procs"].get(pid, (role, 0))[1] or 0
        seconds = (ticks - start) / CLOCK_TICK
        by_role[role] = by_role.get(role, 0.0) + seconds
        per_process.append(
            {
                "pid": pid,
                "role": role,
                "cores": round(seconds / span, 3),
                "us_per_request": per(seconds, requests),
            }
        )
    names = {**before.get("names", {}), **after.get("names", {})}
    threads = []
    for tid, (pid, comm, ticks) in after["threads"].items():
        start = before["threads"].get(tid, (pid, comm, 0))[2]
        seconds = (ticks - start) / CLOCK_TICK
        if seconds > 0:
            name = names.get(tid) or ("main" if tid == pid else comm)
            threads.append((seconds, tid, pid, name))
    threads.sort(reverse=True)
    shown = [
        {
            "tid": tid,
            "pid": pid,
            "name": name,
            "cores": round(seconds / span, 3),
            "us_per_request": per(seconds, requests),
        }
        for seconds, tid, pid, name in threads[:THREADS_SHOWN]
    ]
    rest = sum(t[0] for t in threads[THREADS_SHOWN:])
    if rest:
        shown.append(
            {
                "name": f"{len(threads) - THREADS_SHOWN} other threads",
                "cores": round(rest / span, 3),
                "us_per_request": per(rest, requests),
            }
        )
    executor = by_role.get("executor")
    frontend = by_role.get("frontend")
    return {
        "cpu_roles": {
            role: {"cores": round(s / span, 3), "us_per_request": per(s, requests)}
            for role, s in sorted(by_role.items())
        },
        "cpu_processes": per_process,
        "executor_threads": shown,
        "executor_cpu_us_per_request": per(executor, requests) if executor is not None else None,
        "executor_cpu_us_per_batch": per(executor, batches) if executor is not None else None,
        "frontend_cpu_us_per_request": per(frontend, requests) if frontend is not None else None,
    }
