"""Server processes: each in its own process group, measured and stopped as a group.

LitServe forks API servers and inference workers, so CPU time and GPU memory are summed over the
whole group rather than read off one pid; and stopping kills the group, which leaves no worker
behind holding GPU memory for the next server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
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
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[2]) == pgid:
                pids.add(int(entry.name))
    return pids


def cpu_seconds(pids: set[int]) -> float:
    """utime + stime of ``pids`` (all their threads; a process that exited since is not counted)."""
    total = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICK


def free_port() -> int:
    """A port nothing listens on now (LitServe refuses port 0, so peers need a number)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def get_json(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def http_ok(url: str, timeout: float = 2) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


class GroupProcess:
    """A command started in a new session (its own process group), output to a log file."""

    def __init__(self, name: str, command: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.command = command
        self.log_path = log_path
        self._env = env
        self._process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self) -> None:
        self.started_at = time.monotonic()
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._process.pid

    def pids(self) -> set[int]:
        """The group's live processes (the leader's pid is the group id)."""
        return group_pids(self.pid) if self._process is not None else set()

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_text()[-chars:]

    def wait_for(self, ready: Callable[[], bool], timeout: float) -> float:
        """Poll ``ready`` until it is true; seconds since start. Raises if the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return time.monotonic() - self.started_at
            if not self.alive():
                raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, grace: float = 10) -> float:
        """SIGTERM to the group, SIGKILL to whatever is left after ``grace`` seconds."""
        if self._process is None:
            return 0.0
        started = time.monotonic()
        pgid = self._process.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        # The leader may exit before its workers: wait for the whole group, not just the leader.
        while time.monotonic() < deadline and (self._process.poll() is None or group_pids(pgid)):
            time.sleep(0.1)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._process.wait()
        self._process = None
        return time.monotonic() - started
