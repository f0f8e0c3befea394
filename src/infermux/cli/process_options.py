"""The ``infermux serve`` flags that lay the server out over processes: front ends, executors,
the shared memory between them, and the supervisor's heartbeats (docs/architecture.md,
*Processes*)."""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Callable

from infermux.cli.option_types import non_negative_seconds, positive
from infermux.settings import (
    DEFAULT_FRONTEND_HEARTBEAT_TIMEOUT,
    DEFAULT_IPC_ARENA_MB,
    MAX_EXECUTORS,
    MAX_FRONTENDS,
)


def _count_or_auto(limit: int, auto: Callable[[], int]) -> Callable[[str], int]:
    """An argparse type for ``N|auto``: 1 to ``limit``, or what ``auto`` says."""

    def parse(value: str) -> int:
        if value.strip().lower() == "auto":
            return auto()
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number or 'auto', got '{value}'"
            ) from None
        if not 1 <= number <= limit:
            raise argparse.ArgumentTypeError(f"must be 1-{limit}, got {value}")
        return number

    return parse


def auto_executors(environ: dict[str, str] | None = None) -> int:
    """Executor processes for ``--executors auto``: one per visible GPU (NVML's count, or the
    ``CUDA_VISIBLE_DEVICES`` list when set), at most :data:`MAX_EXECUTORS`; one without GPUs
    or off x86-64 (several executors need the shared-memory ring)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return 1
    visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    else:
        from infermux.runtime.nvml import NVML

        count = len(NVML.read()) if NVML.available else 0
    return max(1, min(MAX_EXECUTORS, count))


# --frontends auto is resolved in parse_settings, which knows --ipc-arena-mb (0 stands for it).
_frontends = _count_or_auto(MAX_FRONTENDS, lambda: 0)
_executors = _count_or_auto(MAX_EXECUTORS, auto_executors)


def add_process_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--frontends",
        type=_frontends,
        default=0,
        metavar="N|auto",
        help="front-end processes (default auto: 1 below 8 cores, else one per 4 cores up to "
        "8, as /dev/shm allows); 1 runs everything in one process, N > 1 runs N front ends "
        "and one executor",
    )
    serve.add_argument(
        "--executors",
        type=_executors,
        default=1,
        metavar="N|auto",
        help="executor processes (default 1; auto: one per visible GPU). Each holds the "
        "instances of its GPUs (GPU g: executor g %% N) and every N-th CPU instance, with its "
        "own GIL; N > 1 runs the front ends in processes of their own too",
    )
    serve.add_argument(
        "--ipc-arena-mb",
        type=positive(int),
        default=DEFAULT_IPC_ARENA_MB,
        metavar="MIB",
        help="with --frontends > 1: shared memory per front end for tensors in flight, each "
        "way (default 256)",
    )
    serve.add_argument(
        "--frontend-heartbeat-timeout-secs",
        type=non_negative_seconds,
        default=DEFAULT_FRONTEND_HEARTBEAT_TIMEOUT,
        metavar="SECONDS",
        help="with --frontends > 1: a front-end process that leaves the supervisor's "
        "once-a-second heartbeat unanswered this long (stopped, hung) is killed and "
        f"restarted (default {DEFAULT_FRONTEND_HEARTBEAT_TIMEOUT:g}; 0: never)",
    )
    serve.add_argument(
        "--executor-heartbeat-timeout-secs",
        type=non_negative_seconds,
        default=0.0,
        metavar="SECONDS",
        help="the same for executor processes (default 0: never; a model that blocks the "
        "executor's event loop this long would get it killed)",
    )
    serve.add_argument(
        "--executor-ready-timeout-ms",
        type=positive(int),
        default=1000,
        metavar="MS",
        help="with --frontends > 1: how long a front end waits for the executor's readiness "
        "answer before it answers not ready (default 1000)",
    )
