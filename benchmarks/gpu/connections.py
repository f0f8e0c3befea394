"""How many established TCP connections on a port each process of the server holds.

perf_analyzer's gRPC threads share a connection six at a time by default, so at c=256 about 43
connections reach the server, and with several front ends the kernel's SO_REUSEPORT hash, not
the load, decides which front end serves each (docs/decisions.md). Counting them per process
beside each front end's CPU shows how even that spread was. From /proc: a process's socket
inodes (its fd links) matched with /proc/net/tcp{,6} rows in state ESTABLISHED whose local port
is the server's.
"""

from __future__ import annotations

import os
from pathlib import Path

_ESTABLISHED = "01"


def _established_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _ESTABLISHED and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def _socket_inode(pid: int, fd: str) -> str:
    try:
        link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:  # closed meanwhile
        return ""
    return link[8:-1] if link.startswith("socket:[") else ""


def per_process(pids: set[int], port: int) -> dict[int, int]:
    """pid -> established connections whose local port is ``port`` (pids with none left out)."""
    inodes = _established_inodes(port)
    counts: dict[int, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        held = sum(1 for fd in fds if _socket_inode(pid, fd) in inodes)
        if held:
            counts[pid] = held
    return counts
