"""The server-side readings over one point's window, whatever drives the load (loadgen.py or
perf_analyzer): NVML utilisation and memory, CPU time of the server's process group (in all, per
role and per executor thread, cpuroles.py) and, for infermux, the ``/v2/models/M/stats`` delta."""

from __future__ import annotations

import time
from typing import Any

import connections
import cpuroles
import pyspy
from nvml import Nvml, Sampler
from procs import cpu_seconds, get_json
from readings import batch_counters, batch_delta, stats_counters, stats_delta
from servers import Server


class Window:
    """``start()`` and ``end()`` bracket the window; ``result()`` reads the differences."""

    def __init__(
        self, nvml: Nvml, server: Server, model: str, thread_names: dict[int, str] | None = None
    ) -> None:
        self._server = server
        self._infermux = server.name == "infermux"
        self._stats_url = f"{server.http_url}/v2/models/{model}/stats" if self._infermux else ""
        self._executors: set[int] = set(server.info.get("executor_pids", []))
        # Python thread names by native id, kept across the server's points (py-spy dump).
        self._names = thread_names if thread_names is not None else {}
        self._sampler = Sampler(nvml, server.process.pids)
        self._marks: dict[str, Any] = {}

    def _snapshot(self) -> dict[str, Any]:
        pids = self._server.process.pids()
        snap: dict[str, Any] = {"cpu": cpu_seconds(pids)}
        if self._infermux:
            snap["roles"] = cpuroles.snapshot(self._server.process.pid, pids, self._executors)
            try:
                document = get_json(self._stats_url)
                snap["stats"] = stats_counters(document)
                snap["batches"] = batch_counters(document)
            except Exception as exc:
                snap["stats_error"] = repr(exc)
        return snap

    def start(self) -> None:
        port = self._server.grpc_target.rpartition(":")[2]
        if self._infermux and port.isdigit():
            # At the window's start: the client's connections are up (its warm-up is over),
            # and at the end perf_analyzer has already exited.
            self._marks["grpc_connections"] = connections.per_process(
                self._server.process.pids(), int(port)
            )
        self._marks["before"] = self._snapshot()
        self._marks["t0"] = time.monotonic()
        self._sampler.start()

    def end(self) -> None:
        self._marks["gpu"] = self._sampler.stop()
        self._marks["after"] = self._snapshot()
        self._marks["t1"] = time.monotonic()

    @property
    def complete(self) -> bool:
        return "before" in self._marks and "after" in self._marks

    def result(self, baseline_mib: float | None, completed: int | None = None) -> dict[str, Any]:
        """Readings over the window; ``completed`` (the client's count) stands in for the server's
        request count where there are no stats (the peers)."""
        if not self.complete:
            return {}
        before, after = self._marks["before"], self._marks["after"]
        span = self._marks["t1"] - self._marks["t0"]
        out: dict[str, Any] = {"server_window_s": round(span, 2)}
        cpu = after["cpu"] - before["cpu"]
        out["server_cpu"] = round(cpu / span, 3)
        out.update(self._marks["gpu"])
        if "grpc_connections" in self._marks:
            held = self._marks["grpc_connections"]
            out["grpc_connections_per_process"] = {str(pid): n for pid, n in sorted(held.items())}
        used = out.get("device_used_max_mib")
        out["device_delta_max_mib"] = (
            round(used - baseline_mib, 1) if used is not None and baseline_mib is not None else None
        )
        requests, batches = completed, None
        if "stats" in before and "stats" in after:
            out.update(stats_delta(before["stats"], after["stats"]))
            out.update(batch_delta(before["batches"], after["batches"]))
            requests, batches = out["server_inferences"], out["server_executions"]
            out["server_items_per_s"] = round(requests / span, 1)
        out["group_cpu_us_per_request"] = round(cpu * 1e6 / requests, 1) if requests else None
        if "roles" in after:
            self._name_threads(after["roles"])
            after["roles"]["names"] = dict(self._names)
            out.update(
                cpuroles.delta(
                    before["roles"], after["roles"], span=span, requests=requests, batches=batches
                )
            )
        return out

    def _name_threads(self, roles_after: dict[str, Any]) -> None:
        """Ask py-spy for Python thread names when a thread has none yet (new threads only)."""
        unnamed = {
            pid for tid, (pid, _, _) in roles_after["threads"].items() if tid not in self._names
        }
        for pid in sorted(unnamed):
            found = pyspy.thread_names(pid)
            self._names.update(found)
            # Remember the unnamed ones too (native threads: comm is all there is), ask once.
            for tid, (owner, _, _) in roles_after["threads"].items():
                if owner == pid and tid not in self._names:
                    self._names[tid] = ""
