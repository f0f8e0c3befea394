"""``gpu_bench.md``: the short summary of ``gpu_bench.json`` (re-render: ``python report.py JSON``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def write_md(doc: dict[str, Any], path: Path) -> None:
    path.write_text("\n".join(render(doc)) + "\n")


def render(doc: dict[str, Any]) -> list[str]:
    cfg, gpu, mi = doc["config"], doc["gpu"], doc["machine"]
    device = (
        f"{gpu['name']} ({gpu['memory_total_mib']:,} MiB, driver {gpu['driver']})"
        if gpu.get("available")
        else f"no GPU reading ({gpu.get('error')})"
    )
    v = doc["versions"]
    lines = [
        "# GPU serving benchmark\n",
        f"- Device {cfg['device']}{' (tiny models)' if cfg['tiny'] else ''}: {device}; "
        f"{mi['cpu_model']} x {mi['nproc']}, Python {mi['python']}.",
        "- Versions: " + ", ".join(f"{k} {v[k]}" for k in v) + ".",
        f"- Load: closed loop, batch-1 requests, {cfg['warmup']} s warm-up + {cfg['window']} s "
        f"window per point, client processes {cfg['client_procs'] or 'min(8, c)'} (asyncio + "
        f"uvloop), gRPC client `{cfg['grpc_client']}`, HTTP client `{cfg['http_client']}`. "
        f"infermux: {cfg['instances']} instances, max_queue_delay {cfg['queue_delay_us']} µs, "
        f"CUDA graphs {'on' if cfg['cuda_graphs'] else 'off'} in config. LitServe: "
        f"{cfg['litserve_workers']} workers, max batch {cfg['litserve_max_batch']}, timeout "
        f"{cfg['litserve_batch_timeout']} s; peers take base64 in JSON, FastAPI does not batch.",
        "- `% ceil` = items/s ÷ the raw in-process ceiling. CPU columns are cores (1.00 = one "
        "core). GPU % = NVML utilisation sampled every 100 ms in the window (mean / max). "
        "`GPU MiB` = the server's processes per NVML (or, where NVML's pids do not match, the "
        "device's used memory minus what was used before the server started). `batch`, `queue`, "
        "`infer` = infermux's stats delta: Δinference / Δexecution count, and µs per request.",
        f"- Wall time {doc.get('wall_s')} s; git {fmt((doc['git'].get('commit') or '')[:10])}.\n",
    ]
    for model, entry in doc["models"].items():
        lines += _model(model, entry)
    lines += _checks(doc)
    return lines


def _model(model: str, entry: dict[str, Any]) -> list[str]:
    raw = entry.get("raw", {})
    lines = [f"## {model}: {raw.get('description', '')}\n"]
    if "error" in raw:
        return [*lines, f"Raw step failed: `{raw['error'][-500:]}`\n"]
    graph, eager, mem = raw.get("graph", {}), raw.get("eager", {}), raw.get("memory", {})
    ceiling = raw.get("ceiling_items_per_s")
    lines.append(
        f"Raw in-process ({raw.get('compute_dtype')}, torch {raw.get('torch')}): ceiling "
        f"**{fmt(ceiling, ',.0f')} items/s** at batch {raw.get('max_batch')}; batch-1 latency "
        f"{fmt(raw.get('b1_latency_ms'), '.3f')} ms. Eager: {fmt(eager.get('max_batch_items_per_s'), ',.0f')} "
        f"items/s, batch 1 {fmt(eager.get('b1', {}).get('p50_ms'), '.3f')} ms. "
        + (
            f"CUDA graphs: 1 stream {fmt(graph.get('one_stream_items_per_s'), ',.0f')}, "
            f"{graph.get('streams')} streams {fmt(graph.get('multi_stream_items_per_s'), ',.0f')} "
            f"items/s, batch 1 {fmt(graph.get('b1', {}).get('p50_ms'), '.3f')} ms"
            + (f" (graph error: {graph['error'][:200]})" if "error" in graph else "")
            + ". "
            if graph
            else ""
        )
        + (
            f"In-process GPU memory with {graph.get('streams')} graphs + buffers: "
            f"{fmt(mem.get('process_mib'), ',.0f')} MiB (NVML, process) / "
            f"{fmt(mem.get('device_delta_mib'), ',.0f')} MiB (device delta) / "
            f"{fmt(mem.get('torch_reserved_mib'), ',.0f')} MiB (torch reserved)."
            if mem
            else ""
        )
        + "\n"
    )
    lines.append(
        "| server | protocol | c | items/s | % ceil | p50 ms | p90 ms | p99 ms | errors | "
        "client CPU | server CPU | GPU % | GPU MiB | batch | queue µs | infer µs |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    notes = []
    for name, server in entry.get("servers", {}).items():
        if "skipped" in server:
            notes.append(f"- {name}: skipped ({server['skipped']}).")
            continue
        if "error" in server:
            notes.append(f"- {name}: {' '.join(server['error'].split())[:400]}")
        info, ready = server.get("info", {}), server.get("memory_after_warmup", {})
        if info:
            own = server.get("infermux_memory_usage")
            accounted = (
                "; its own accounting (statistics memory_usage): "
                + ", ".join(
                    f"{m['type']} {m['id']}: {m['byte_size'] / 2**20:,.0f} MiB" for m in own
                )
                if isinstance(own, list) and own
                else ""
            )
            notes.append(
                f"- {name}: ready in {info.get('startup_s')} s; GPU memory after warm-up "
                f"{fmt(_mib(ready), ',.0f')} MiB{accounted}; stopped in {server.get('stop_s')} s."
            )
        for p in server.get("points", []):
            head = f"| {name} | {p['protocol']} | {p['concurrency']} |"
            if "skipped" in p or "error" in p:
                text = p.get("skipped") or " ".join(p.get("error", "").split())[:200]
                lines.append(f"{head} {text.replace('|', '/')} |")
                continue
            rate = p["items_per_s"]
            gpu = (
                f"{fmt(p.get('gpu_util_mean'), '.0f')} / {fmt(p.get('gpu_util_max'))}"
                if p.get("gpu_util_mean") is not None
                else "-"
            )
            mib = p.get("server_gpu_mib_max")
            lines.append(
                f"{head} {rate:,.0f} | {fmt(100 * rate / ceiling if ceiling else None, '.1f')} | "
                f"{fmt(p['p50_ms'], '.2f')} | {fmt(p['p90_ms'], '.2f')} | {fmt(p['p99_ms'], '.2f')} | "
                f"{p['errors']} | {fmt(p['client_cpu'], '.2f')} | {fmt(p.get('server_cpu'), '.2f')} | "
                f"{gpu} | {fmt(mib if mib is not None else p.get('device_delta_max_mib'), ',.0f')} | "
                f"{fmt(p.get('avg_batch'), '.1f')} | {fmt(p.get('server_queue_us'), ',.0f')} | "
                f"{fmt(p.get('server_compute_infer_us'), ',.0f')} |"
            )
    return [*lines, "", *notes, ""]


def _mib(memory: dict[str, Any]) -> float | None:
    value = memory.get("process_mib")
    return value if value is not None else memory.get("device_delta_mib")


def _checks(doc: dict[str, Any]) -> list[str]:
    verified = mismatched = errors = 0
    worst = 0.0
    for entry in doc["models"].values():
        for server in entry.get("servers", {}).values():
            for p in server.get("points", []):
                verified += p.get("verified", 0)
                mismatched += p.get("mismatched", 0)
                errors += p.get("errors_total", 0) + ("error" in p)
                worst = max(worst, p.get("max_err", 0.0))
    return [
        "## Checks\n",
        f"- First answer of every client slot checked against the raw model's output for the same "
        f"input: {verified} verified, {mismatched} wrong (largest error relative to the output's "
        f"magnitude: {worst:.2e}); failed requests or points: {errors}.",
    ]


if __name__ == "__main__":
    source = Path(sys.argv[1])
    write_md(json.loads(source.read_text()), source.with_suffix(".md"))
