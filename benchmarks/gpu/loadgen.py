"""Closed-loop load generator: ``concurrency`` requests in flight, spread over client processes,
each an asyncio loop (uvloop when installed) whose slots send a batch-1 request, await the answer
and send again; the protocols are in clients.py.

The parent (``run_point``) starts the processes, waits until every one has connected (and
registered its shared memory), then hands all of them the same warm-up end ``t0`` and window end
``t1`` on the system-wide monotonic clock; it calls ``on_start``/``on_end`` at ``t0``/``t1`` so the
orchestrator can read server counters over exactly the window. Each process reports the latencies
of the requests that completed inside the window, its errors, its CPU time over the window, and
whether each slot's first answer matched the reference output.
"""

from __future__ import annotations

import asyncio
import base64
import json
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from clients import REQUEST_TIMEOUT_S, SHM_PREFIX, Driver, Target, make_driver
from specs import TOLERANCE, ModelSpec, load_reference, model_spec, output_error


# ----------------------------------------------------------------------------- client process
async def client(target: Target, slots: int) -> dict[str, Any]:
    spec = model_spec(target.model, target.tiny)
    ref, expected = load_reference(Path(target.ref_dir), spec)
    driver = make_driver(target, spec, ref)
    await driver.setup(slots)
    try:
        print("READY", flush=True)
        loop = asyncio.get_running_loop()
        window = json.loads(await loop.run_in_executor(None, sys.stdin.readline))
        return await _drive(
            driver, spec, expected=expected, slots=slots, t0=window["t0"], t1=window["t1"]
        )
    finally:
        await driver.close()


async def _drive(
    driver: Driver,
    spec: ModelSpec,
    *,
    expected: npt.NDArray[Any],
    slots: int,
    t0: float,
    t1: float,
) -> dict[str, Any]:
    latencies: list[float] = []
    errors = {"window": 0, "total": 0}
    samples: list[str] = []
    checks = {"verified": 0, "mismatched": 0, "max_err": 0.0}
    shape = (1, *spec.output.dims)

    def check(out: npt.NDArray[Any]) -> None:
        ok = out.dtype == np.float16 and tuple(out.shape) == shape
        err = output_error(out, expected) if ok else float("inf")
        checks["max_err"] = max(checks["max_err"], err)
        if ok and err <= TOLERANCE:
            checks["verified"] += 1
        else:
            checks["mismatched"] += 1
            if len(samples) < 5:
                samples.append(f"wrong answer: dtype {out.dtype} shape {out.shape} error {err:.3g}")

    async def worker(slot: int) -> None:
        first = True
        while (sent := time.monotonic()) < t1:
            try:
                out = await driver.infer(slot)
            except Exception as exc:
                errors["total"] += 1
                errors["window"] += t0 <= time.monotonic() < t1
                if len(samples) < 5:
                    samples.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                await asyncio.sleep(0.01)  # a failing server must not become a busy loop
                continue
            done = time.monotonic()
            if first:
                check(out)
                first = False
            if t0 <= done < t1:
                latencies.append(done - sent)

    async def cpu_at(when: float) -> float:
        await asyncio.sleep(max(0.0, when - time.monotonic()))
        return time.process_time()

    tasks = [asyncio.create_task(worker(i)) for i in range(slots)]
    cpu0, cpu1 = await asyncio.gather(cpu_at(t0), cpu_at(t1))
    await asyncio.gather(*tasks)
    return {
        "completed": len(latencies),
        "latencies_ms": base64.b64encode(
            (np.asarray(latencies, dtype=np.float64) * 1e3).astype(np.float32).tobytes()
        ).decode(),
        "errors": errors["window"],
        "errors_total": errors["total"],
        "error_samples": samples,
        "cpu_s": cpu1 - cpu0,
        **checks,
    }


def client_main(argv: list[str]) -> None:
    target = Target(**json.loads(argv[0]))
    slots = int(argv[1])
    try:
        import uvloop

        result = uvloop.run(client(target, slots))
        result["event_loop"] = "uvloop"
    except ImportError:
        result = asyncio.run(client(target, slots))
        result["event_loop"] = "asyncio"
    print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- parent side
def split(concurrency: int, procs: int) -> list[int]:
    """Slots per process, as even as possible, no empty process."""
    procs = max(1, min(procs, concurrency))
    return [concurrency // procs + (i < concurrency % procs) for i in range(procs)]


def run_point(
    target: Target,
    concurrency: int,
    procs: int,
    *,
    warmup: float,
    window: float,
    on_start: Callable[[], None] = lambda: None,
    on_end: Callable[[], None] = lambda: None,
    ready_timeout: float = 120,
) -> dict[str, Any]:
    """Run one closed-loop point; returns the merged result (``error`` set when it failed)."""
    spec_json = json.dumps(asdict(target))
    children: list[tuple[subprocess.Popen[str], Any]] = []
    started = time.monotonic()
    try:
        for slots in split(concurrency, procs):
            stderr = tempfile.TemporaryFile(mode="w+")
            child = subprocess.Popen(
                [sys.executable, str(Path(__file__)), spec_json, str(slots)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
            children.append((child, stderr))
        for child, stderr in children:
            line = _read_line(child, started + ready_timeout)
            if line.strip() != "READY":
                raise RuntimeError(f"client not ready: {line!r} {_tail(stderr)}")
        t0 = time.monotonic() + warmup
        t1 = t0 + window
        for child, _ in children:
            assert child.stdin is not None
            child.stdin.write(json.dumps({"t0": t0, "t1": t1}) + "\n")
            child.stdin.flush()
        time.sleep(max(0.0, t0 - time.monotonic()))
        on_start()
        time.sleep(max(0.0, t1 - time.monotonic()))
        on_end()
        results = []
        for child, stderr in children:
            out, _ = child.communicate(timeout=REQUEST_TIMEOUT_S + 30)
            lines = out.strip().splitlines()
            if child.returncode != 0 or not lines:
                raise RuntimeError(f"client rc={child.returncode}: {_tail(stderr)}")
            results.append(json.loads(lines[-1]))
        merged = merge(results, window)
        merged["client_procs"] = len(children)
        merged["setup_s"] = round(t0 - warmup - started, 2)
        return merged
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        for child, stderr in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            stderr.close()
            _remove_shm(child.pid)


def _read_line(child: subprocess.Popen[str], deadline: float) -> str:
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise TimeoutError("client did not become ready")
    return child.stdout.readline()


def _tail(stderr: Any, chars: int = 1500) -> str:
    stderr.seek(0)
    text: str = stderr.read()
    return text[-chars:]


def _remove_shm(pid: int) -> None:
    """Regions a crashed client left behind (a clean one removed its own)."""
    for path in Path("/dev/shm").glob(f"{SHM_PREFIX}_{pid}_*"):
        path.unlink(missing_ok=True)


def merge(results: list[dict[str, Any]], window: float) -> dict[str, Any]:
    arrays = [np.frombuffer(base64.b64decode(r["latencies_ms"]), dtype=np.float32) for r in results]
    lat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.float32)

    def pct(q: float) -> float | None:
        return round(float(np.percentile(lat, q)), 3) if lat.size else None

    samples = [s for r in results for s in r["error_samples"]][:5]
    return {
        "completed": int(lat.size),
        "items_per_s": round(lat.size / window, 1),
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "mean_ms": round(float(lat.mean()), 3) if lat.size else None,
        "errors": sum(r["errors"] for r in results),
        "errors_total": sum(r["errors_total"] for r in results),
        "error_samples": samples,
        "client_cpu": round(sum(r["cpu_s"] for r in results) / window, 3),
        "verified": sum(r["verified"] for r in results),
        "mismatched": sum(r["mismatched"] for r in results),
        "max_err": max((r["max_err"] for r in results), default=0.0),
        "event_loop": results[0].get("event_loop") if results else None,
    }


if __name__ == "__main__":
    client_main(sys.argv[1:])
