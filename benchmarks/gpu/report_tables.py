"""The tables of ``gpu_bench.md`` for one model (report.py puts them together): the headline table
(issue 24's columns), the details of every point, GPU memory against the in-process minimum and
LitServe, infermux's CPU per process role and executor thread at the highest concurrency, and
its batches there (sizes, CUDA graph padding)."""

from __future__ import annotations

import itertools
from typing import Any


def fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def points(entry: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(server, point) of every measured point of a model, in run order."""
    return [
        (name, p)
        for name, server in entry.get("servers", {}).items()
        for p in server.get("points", [])
    ]


def measured(p: dict[str, Any]) -> bool:
    return "items_per_s" in p and "skipped" not in p


def _head(name: str, p: dict[str, Any]) -> str:
    client = "perf_analyzer" if p["protocol"].startswith("pa_") else "loadgen"
    return f"| {name} | {client} | {p['protocol']} | {p['concurrency']} |"


def _gap(name: str, p: dict[str, Any], columns: int) -> str:
    text = p.get("skipped") or " ".join(p.get("error", "").split())[:200]
    return f"{_head(name, p)} {text.replace('|', '/')} |" + " |" * (columns - 1)


def headline(entry: dict[str, Any], ceiling: float | None) -> list[str]:
    """Protocol x concurrency -> the figures issue 24 asks for, every server's rows together."""
    lines = [
        "| server | client | protocol | c | infer/s | ÷ ceiling | p50 ms | p99 ms | GPU util % "
        "| avg batch | compute infer µs | executor CPU µs/req | executor CPU µs/batch "
        "| front-end CPU µs/req | server CPU µs/req |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p in points(entry):
        if not measured(p):
            lines.append(_gap(name, p, 11))
            continue
        rate = p["items_per_s"]
        infer = p.get("pa_server_compute_infer_us", p.get("server_compute_infer_us"))
        lines.append(
            f"{_head(name, p)} {'~' if p.get('unstable') else ''}{rate:,.0f} | "
            f"{fmt(rate / ceiling if ceiling else None, '.3f')} | {fmt(p.get('p50_ms'), '.2f')} | "
            f"{fmt(p.get('p99_ms'), '.2f')} | {fmt(p.get('gpu_util_mean'), '.0f')} | "
            f"{fmt(p.get('avg_batch'), '.1f')} | {fmt(infer, ',.0f')} | "
            f"{fmt(p.get('executor_cpu_us_per_request'), ',.0f')} | "
            f"{fmt(p.get('executor_cpu_us_per_batch'), ',.0f')} | "
            f"{fmt(p.get('frontend_cpu_us_per_request'), ',.0f')} | "
            f"{fmt(p.get('group_cpu_us_per_request'), ',.0f')} |"
        )
    return lines


def details(entry: dict[str, Any], ceiling: float | None) -> list[str]:
    lines = [
        "| server | client | protocol | c | items/s | % ceil | p50 ms | p90 ms | p99 ms | errors | "
        "client CPU | server CPU | GPU % | GPU MiB | batch | queue µs | infer µs | server items/s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p in points(entry):
        if not measured(p):
            lines.append(_gap(name, p, 14))
            continue
        rate = p["items_per_s"]
        gpu = (
            f"{fmt(p.get('gpu_util_mean'), '.0f')} / {fmt(p.get('gpu_util_max'))}"
            if p.get("gpu_util_mean") is not None
            else "-"
        )
        mib = p.get("server_gpu_mib_max")
        lines.append(
            f"{_head(name, p)} {rate:,.0f} | {fmt(100 * rate / ceiling if ceiling else None, '.1f')} | "
            f"{fmt(p.get('p50_ms'), '.2f')} | {fmt(p.get('p90_ms'), '.2f')} | "
            f"{fmt(p.get('p99_ms'), '.2f')} | {fmt(p.get('errors'))} | "
            f"{fmt(p.get('client_cpu'), '.2f')} | {fmt(p.get('server_cpu'), '.2f')} | {gpu} | "
            f"{fmt(mib if mib is not None else p.get('device_delta_max_mib'), ',.0f')} | "
            f"{fmt(p.get('avg_batch'), '.1f')} | "
            f"{fmt(p.get('pa_server_queue_us', p.get('server_queue_us')), ',.0f')} | "
            f"{fmt(p.get('pa_server_compute_infer_us', p.get('server_compute_infer_us')), ',.0f')} | "
            f"{fmt(p.get('server_items_per_s'), ',.0f')} |"
        )
    return lines


def mib_of(memory: dict[str, Any] | None) -> float | None:
    if not memory:
        return None
    value = memory.get("process_mib")
    return value if value is not None else memory.get("device_delta_mib")


def peak_mib(server: dict[str, Any]) -> float | None:
    """The largest GPU memory of the server's processes over its measured points."""
    values = [
        p.get("server_gpu_mib_max")
        if p.get("server_gpu_mib_max") is not None
        else p.get("device_delta_max_mib")
        for p in server.get("points", [])
    ]
    found = [v for v in values if v is not None]
    return max(found) if found else None


def memory(entry: dict[str, Any]) -> list[str]:
    raw = entry.get("raw", {}).get("memory") or {}
    minimum = mib_of(raw)
    rows = [("raw in-process minimum (" + str(raw.get("what", "-")) + ")", minimum)]
    litserve = None
    for name, server in entry.get("servers", {}).items():
        ready = mib_of(server.get("memory_after_warmup"))
        rows.append((f"{name} after warm-up", ready))
        rows.append((f"{name} peak under load", peak_mib(server)))
        if name == "litserve":
            litserve = ready
    lines = [
        "| GPU memory | MiB | ÷ raw minimum | ÷ LitServe (after warm-up) |",
        "|---|---:|---:|---:|",
    ]
    for what, mib in rows:
        lines.append(
            f"| {what} | {fmt(mib, ',.0f')} | "
            f"{fmt(mib / minimum if mib is not None and minimum else None, '.2f')} | "
            f"{fmt(mib / litserve if mib is not None and litserve else None, '.2f')} |"
        )
    return lines


def cpu_split(entry: dict[str, Any], concurrency: int) -> list[str]:
    """infermux's CPU per role, per process and per executor thread at ``concurrency``."""
    lines = []
    for name, p in points(entry):
        if not measured(p) or p["concurrency"] != concurrency or "cpu_roles" not in p:
            continue
        roles = ", ".join(
            f"{role} {r['cores']:.2f} cores / {fmt(r['us_per_request'], ',.0f')} µs"
            for role, r in p["cpu_roles"].items()
        )
        procs = ", ".join(
            f"{q['role']} {q['pid']} {q['cores']:.2f}"
            for q in p.get("cpu_processes", [])
            if q["role"] == "frontend"
        )
        threads = ", ".join(
            f"{t['name']} {t['cores']:.2f} / {fmt(t['us_per_request'], ',.0f')} µs"
            for t in p.get("executor_threads", [])
        )
        lines.append(
            f"- {name} {p['protocol']} c={concurrency}: per role (cores / CPU µs per request) "
            f"{roles}"
            + (f"; front ends one by one (cores) {procs}" if procs else "")
            + (f"; executor threads (cores / µs per request) {threads}" if threads else "")
            + "."
        )
    return lines


def batches(entry: dict[str, Any], concurrency: int) -> list[str]:
    """infermux's executions by batch size at ``concurrency``: the most frequent sizes with their
    mean compute infer, and the share of the rows the GPU ran that were graph padding."""
    lines = [
        f"- {name}: CUDA graph buckets {', '.join(map(str, server['graph_buckets']))}."
        for name, server in entry.get("servers", {}).items()
        if isinstance(server.get("graph_buckets"), list) and server["graph_buckets"]
    ]
    for name, p in points(entry):
        sizes = p.get("batch_sizes")
        if not measured(p) or p["concurrency"] != concurrency or not sizes:
            continue
        infer = p.get("compute_infer_us_by_batch", {})
        common = sorted(sizes.items(), key=lambda kv: -kv[1])[:8]
        listed = ", ".join(
            f"{size} x{count} ({fmt(infer.get(size), ',.0f')} µs)"
            for size, count in sorted(common, key=lambda kv: int(kv[0]))
        )
        padded = p.get("padded_rows_pct")
        lines.append(
            f"- {name} {p['protocol']} c={concurrency}: {sum(sizes.values()):,} executions, "
            f"the most frequent sizes (rows x executions, mean compute infer) {listed}"
            + (f"; graph padding {padded}% of the rows run" if padded is not None else "")
            + "."
        )
    return lines


def curve_at(curve: dict[str, float], batch: float) -> float | None:
    """The raw graph throughput at ``batch`` rows, linear between the two measured sizes around
    it (None outside the measured range: no extrapolation)."""
    sizes = sorted((int(size), value) for size, value in curve.items())
    for (low, at_low), (high, at_high) in itertools.pairwise(sizes):
        if low <= batch <= high:
            return at_low + (at_high - at_low) * (batch - low) / (high - low)
    if sizes and batch == sizes[0][0]:
        return sizes[0][1]
    return None


def at_served_batch(entry: dict[str, Any], curve: dict[str, float]) -> list[str]:
    """Each infermux point beside what the raw model gives at the average batch it served: the
    ceiling is measured at max_batch_size, a server's batches are smaller, so this splits the
    gap into what the batch size costs the GPU and what serving costs besides."""
    lines = []
    for name, p in points(entry):
        batch = p.get("avg_batch")
        if not name.startswith("infermux") or not measured(p) or not batch:
            continue
        raw = curve_at(curve, batch)
        if raw is None:
            continue
        lines.append(
            f"- {name} {p['protocol']} c={p['concurrency']}: {fmt(p['items_per_s'], ',.0f')} "
            f"items/s at an average batch of {batch:.1f}; the raw model at that batch "
            f"{raw:,.0f} items/s: **{p['items_per_s'] / raw:.2f}x**."
        )
    return lines


def batch_cost(
    curve: dict[str, float], top: tuple[int, float] | None
) -> tuple[float, float] | None:
    """The raw model's GPU seconds per batch of ``b`` rows as ``a + c * b``, fitted (least
    squares) to the raw multi-stream throughput at the measured batch sizes (``curve``, plus
    ``top``: max_batch_size and the ceiling). Each point gives ``b / throughput`` seconds per
    batch with every stream busy. None with fewer than two sizes."""
    pairs = [(float(size), float(size) / value) for size, value in curve.items() if value]
    if top is not None and top[1]:
        pairs.append((float(top[0]), top[0] / top[1]))
    if len({b for b, _ in pairs}) < 2:
        return None
    n = len(pairs)
    mean_b = sum(b for b, _ in pairs) / n
    mean_t = sum(t for _, t in pairs) / n
    slope = sum((b - mean_b) * (t - mean_t) for b, t in pairs) / sum(
        (b - mean_b) ** 2 for b, _ in pairs
    )
    return mean_t - slope * mean_b, slope


def gpu_work(entry: dict[str, Any], raw: dict[str, Any], concurrency: int) -> list[str]:
    """What the GPU had to do for the batches each infermux point served at ``concurrency``,
    costed as the raw model runs them (:func:`batch_cost`, graph padding included): the share
    of the window that work fills (below 100%: the server did not keep the GPU fed), and the
    throughput this batch mix would give with the GPU fed all the time (the batch sizes'
    limit). Their product is about the point's throughput: which factor falls short says
    whether serving or batching limits it."""
    graph = raw.get("graph", {})
    top = (raw["max_batch"], graph["multi_stream_items_per_s"]) if raw.get("max_batch") else None
    cost = batch_cost(graph.get("batch_curve", {}), top)
    ceiling = raw.get("ceiling_items_per_s")
    if cost is None or not ceiling:
        return []
    per_batch, per_row = cost
    lines = [
        f"- Raw cost per batch of b rows, every stream busy: {per_batch * 1e3:.3f} ms + "
        f"{per_row * 1e6:.1f} µs x b (fitted to the batch curve and the ceiling)."
    ]
    for name, p in points(entry):
        sizes, window = p.get("batch_sizes"), p.get("server_window_s")
        if not measured(p) or p["concurrency"] != concurrency or not sizes or not window:
            continue
        buckets = sorted(entry.get("servers", {}).get(name, {}).get("graph_buckets") or [])
        executions = real = run = 0
        for size_text, count in sizes.items():
            size = int(size_text)
            executions += count
            real += size * count
            run += next((b for b in buckets if b >= size), size) * count
        work = per_batch * executions + per_row * run
        possible = real / work
        lines.append(
            f"- {name} {p['protocol']} c={concurrency}: its batches needed the GPU "
            f"**{100 * work / window:.0f}%** of the window (NVML: "
            f"{fmt(p.get('gpu_util_mean'), '.0f')}%); fed all the time, this batch mix gives "
            f"{possible:,.0f} items/s (**{possible / ceiling:.3f}x** the ceiling); measured "
            f"{p['items_per_s'] / ceiling:.3f}x."
        )
    return lines
