"""Server processes: each in its own process group, measured and stopped as a group.

LitServe forks API servers and inference workers, so CPU time and GPU memory are summed over the
whole group rather than read off one pid; and stopping kills the group, which leaves no worker
behind holding GPU memory for the next server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import CLOCK_TICK, cpu_seconds, free_port, group_pids, stop_group

__all__ = ["CLOCK_TICK", "cpu_seconds", "free_port", "group_pids"]  # siblings read them from here


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
        took = stop_group(self._process, grace)
        self._process = None
        return took
