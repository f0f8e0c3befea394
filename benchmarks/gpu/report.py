"""``gpu_bench.md``: the short summary of ``gpu_bench.json`` (re-render: ``python report.py JSON``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import report_tables as tables
from report_tables import fmt


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
    pa = doc.get("perf_analyzer")
    lines = [
        "# GPU serving benchmark\n",
        f"- Device {cfg['device']}{' (tiny models)' if cfg['tiny'] else ''}: {device}; "
        f"{mi['cpu_model']} x {mi['nproc']}, Python {mi['python']}.",
        "- Versions: " + ", ".join(f"{k} {v[k]}" for k in v) + ".",
        f"- Load, `loadgen` rows: closed loop, batch-1 requests, {cfg['warmup']} s warm-up + "
        f"{cfg['window']} s window per point, client processes {cfg['client_procs'] or 'min(8, c)'} "
        f"(asyncio + uvloop), gRPC client `{cfg['grpc_client']}`, HTTP client `{cfg['http_client']}`.",
    ]
    if pa:
        lines.append(
            f"- Load, `perf_analyzer` rows ({fmt(pa.get('version'))}; {pa.get('found')}): `-b 1`, "
            f"{'async' if cfg.get('pa_async') else 'sync'} mode, the reference request as "
            f"`--input-data` JSON, `--measurement-interval {cfg.get('pa_interval_ms')} "
            f"--stability-percentage {cfg.get('pa_stability'):g} --max-trials "
            f"{cfg.get('pa_max_trials')}`"
            + (
                f" (`pa_http`: `--measurement-interval {cfg['pa_http_interval_ms']}`)"
                if cfg.get("pa_http_interval_ms")
                else ""
            )
            + "; infer/s and p50/p99 are perf_analyzer's (its stable "
            "windows; `~` = no stable window, the last pass's throughput); the server-side "
            f"readings (GPU, batch, CPU) cover its whole run from {cfg['warmup']} s after its start. "
            "perf_analyzer checks no answer: each server's warm-up runs loadgen's equivalent "
            "protocol, which does (see Checks). Commands: `pa_command` in the JSON."
        )
    lines += [
        f"- infermux: {cfg['instances']} instances, max_queue_delay {cfg['queue_delay_us']} µs, "
        f"CUDA graphs {'on' if cfg['cuda_graphs'] else 'off'} in config, --frontends "
        f"{','.join(map(str, cfg['frontends']))}, --executors {cfg['executors']}. LitServe: "
        f"{cfg['litserve_workers']} workers, max batch {cfg['litserve_max_batch']}, timeout "
        f"{cfg['litserve_batch_timeout']} s; peers take base64 in JSON, FastAPI does not batch.",
        "- `÷ ceiling` = infer/s ÷ the raw in-process ceiling. GPU util = NVML, sampled every "
        "100 ms over the window. `avg batch`, `compute infer` = infermux's stats delta "
        "(Δinference / Δexecution count; perf_analyzer rows: its own Server Compute Infer). CPU "
        "µs per request = CPU time (utime + stime, /proc) over the window ÷ the server's "
        "Δinference count (peers: requests completed); per batch ÷ Δexecution count. `server "
        "CPU µs/req` is the whole process group (supervisor, front ends, executor, resource "
        "tracker); a one-process infermux (--frontends 1) has no executor/front-end split.",
        f"- Wall time {doc.get('wall_s')} s; git {fmt((doc['git'].get('commit') or '')[:10])}.\n",
    ]
    if doc.get("tuning"):  # a variant of benchmarks/gpu/tuning_hook: name it where it is read
        settings = ", ".join(f"`{k}={v}`" for k, v in doc["tuning"].items())
        lines.insert(-1, f"- Tuning hook (a benchmark aid, not server settings): {settings}.")
    for model, entry in doc["models"].items():
        lines += _model(model, entry, max(cfg["concurrency"]))
    lines += _checks(doc)
    return lines


def _raw(raw: dict[str, Any]) -> str:
    graph, eager, mem = raw.get("graph", {}), raw.get("eager", {}), raw.get("memory", {})
    return (
        f"Raw in-process ({raw.get('compute_dtype')}, torch {raw.get('torch')}): ceiling "
        f"**{fmt(raw.get('ceiling_items_per_s'), ',.0f')} items/s** at batch {raw.get('max_batch')}; "
        f"batch-1 latency **{fmt(raw.get('b1_latency_ms'), '.3f')} ms**. Eager: "
        f"{fmt(eager.get('max_batch_items_per_s'), ',.0f')} items/s, batch 1 "
        f"{fmt(eager.get('b1', {}).get('p50_ms'), '.3f')} ms. "
        + (
            f"CUDA graphs: 1 stream {fmt(graph.get('one_stream_items_per_s'), ',.0f')}, "
            f"{graph.get('streams')} streams {fmt(graph.get('multi_stream_items_per_s'), ',.0f')} "
            f"items/s, batch 1 {fmt(graph.get('b1', {}).get('p50_ms'), '.3f')} ms"
            + (f" (graph error: {graph['error'][:200]})" if "error" in graph else "")
            + ". "
            + (
                f"{graph.get('streams')} streams by batch size: "
                + ", ".join(
                    f"{b}: {fmt(v, ',.0f')}" for b, v in graph.get("batch_curve", {}).items()
                )
                + " items/s. "
                if graph.get("batch_curve")
                else ""
            )
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


def _model(model: str, entry: dict[str, Any], top: int) -> list[str]:
    raw = entry.get("raw", {})
    lines = [f"## {model}: {raw.get('description', '')}\n"]
    if "error" in raw:
        return [*lines, f"Raw step failed: `{raw['error'][-500:]}`\n"]
    ceiling = raw.get("ceiling_items_per_s")
    lines.append(_raw(raw))
    lines += [*tables.headline(entry, ceiling), ""]
    lines += ["### Targets\n", *_targets(entry, raw, top), ""]
    served = tables.at_served_batch(entry, raw.get("graph", {}).get("batch_curve", {}))
    if served:
        lines += [
            "### At the batch size served (÷ the raw model's throughput there)\n",
            *served,
            "",
        ]
    lines += ["### GPU memory\n", *tables.memory(entry), ""]
    split = tables.cpu_split(entry, top)
    if split:
        lines += [f"### infermux CPU at c={top}\n", *split, ""]
    sizes = tables.batches(entry, top)
    if sizes:
        lines += [f"### infermux batches at c={top}\n", *sizes, ""]
    work = tables.gpu_work(entry, raw, top)
    if len(work) > 1:
        lines += [f"### GPU work of the batches served at c={top}\n", *work, ""]
    lines += ["### All readings\n", *tables.details(entry, ceiling), ""]
    lines += _notes(entry)
    return [*lines, ""]


def _targets(entry: dict[str, Any], raw: dict[str, Any], top: int) -> list[str]:
    """Per server and protocol: best ÷ ceiling, GPU util / avg batch / executor CPU at the top
    concurrency, and c=1 p50 against the raw batch-1 latency."""
    ceiling, b1 = raw.get("ceiling_items_per_s"), raw.get("b1_latency_ms")
    series: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for name, p in tables.points(entry):
        if tables.measured(p):
            series.setdefault((name, p["protocol"]), {})[p["concurrency"]] = p
    lines = [
        f"| server | protocol | best ÷ ceiling (at c) | GPU util % at c={top} | avg batch at c={top} "
        f"| c=1 p50 ms (÷ raw batch-1 {fmt(b1, '.3f')} ms) | executor CPU µs/req at c={top} |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (name, protocol), by_c in series.items():
        best = max(by_c.values(), key=lambda p: p["items_per_s"])
        at_top, at_one = by_c.get(top, {}), by_c.get(1, {})
        p50 = at_one.get("p50_ms")
        lines.append(
            f"| {name} | {protocol} | "
            f"{fmt(best['items_per_s'] / ceiling if ceiling else None, '.3f')} "
            f"({best['concurrency']}) | {fmt(at_top.get('gpu_util_mean'), '.0f')} | "
            f"{fmt(at_top.get('avg_batch'), '.1f')} | "
            + (f"{p50:.2f} ({p50 / b1:.1f}x)" if p50 is not None and b1 else fmt(p50, ".2f"))
            + f" | {fmt(at_top.get('executor_cpu_us_per_request'), ',.0f')} |"
        )
    return lines


def _notes(entry: dict[str, Any]) -> list[str]:
    notes = []
    for name, server in entry.get("servers", {}).items():
        if "skipped" in server:
            notes.append(f"- {name}: skipped ({server['skipped']}).")
            continue
        if "error" in server:
            notes.append(f"- {name}: {' '.join(server['error'].split())[:400]}")
        info = server.get("info", {})
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
            warm = server.get("warmup", {})
            notes.append(
                f"- {name}: ready in {info.get('startup_s')} s; warm-up "
                f"{fmt(warm.get('protocol'))} c={fmt(warm.get('concurrency'))}: "
                f"{fmt(warm.get('items_per_s'), ',.0f')}/s, {fmt(warm.get('verified'))} answers "
                f"verified, {fmt(warm.get('mismatched'))} wrong; GPU memory after warm-up "
                f"{fmt(tables.mib_of(server.get('memory_after_warmup')), ',.0f')} MiB{accounted}; "
                f"stopped in {server.get('stop_s')} s."
            )
        profile = server.get("profile")
        if profile:
            spy, run = profile.get("pyspy", {}), profile.get("run", {})
            notes.append(
                f"- {name} py-spy ({run.get('protocol')} c={run.get('concurrency')}, a run of its "
                f"own: {fmt(run.get('items_per_s'), ',.0f')} infer/s while profiled): "
                + (
                    f"`{spy['file']}` (speedscope), top frames per process and thread in "
                    f"`{profile.get('summary', '-')}`."
                    if spy.get("file")
                    else f"no profile ({' '.join(str(spy.get('error') or spy.get('output') or profile.get('skipped')).split())[:300]})."
                )
            )
    return notes


def _checks(doc: dict[str, Any]) -> list[str]:
    verified = mismatched = errors = 0
    worst = 0.0
    for entry in doc["models"].values():
        for server in entry.get("servers", {}).values():
            warm = server.get("warmup", {})
            verified += warm.get("verified") or 0
            mismatched += warm.get("mismatched") or 0
            for p in server.get("points", []):
                verified += p.get("verified", 0)
                mismatched += p.get("mismatched", 0)
                errors += p.get("errors_total", 0) + ("error" in p)
                worst = max(worst, p.get("max_err", 0.0))
    return [
        "## Checks\n",
        f"- First answer of every loadgen client slot (points and warm-ups) checked against the raw "
        f"model's output for the same input: {verified} verified, {mismatched} wrong (largest error "
        f"relative to the output's magnitude in the points: {worst:.2e}); failed requests or "
        f"points: {errors}.",
    ]


if __name__ == "__main__":
    source = Path(sys.argv[1])
    write_md(json.loads(source.read_text()), source.with_suffix(".md"))
