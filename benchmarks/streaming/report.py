"""The streaming benchmark's summary markdown, from its JSON document."""

from __future__ import annotations

from typing import Any

TARGET_US = 200.0  # issue 28: overhead per response at c=64 on the device host

RATIO_FIGURES = (
    "responses_per_s",
    "ttfr_p50",
    "ttfr_p99",
    "gap_p99",
    "delivery_p50",
    "delivery_p99",
    "server_cpu_us_per_response",
)
"""The figures compared infermux / Triton at each point, in the summary's column order."""


def _pair(cell: dict[str, Any], a: str, b: str) -> str:
    if cell.get(a) is None or cell.get(b) is None:
        return "-"
    return f"{cell[a]:.0f} / {cell[b]:.0f}"


def _num(value: Any, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(doc: dict[str, Any]) -> str:
    config, machine = doc["config"], doc["machine"]
    summary, ratios = doc["summary"], doc["ratios"]
    labels = list(doc["servers"])
    lines = [
        "# Streaming responses from a decoupled Python model: infermux vs tritonserver",
        "",
        f"Issue 28. `benchmarks/streaming/bench.py` ({doc['started']}, {doc['elapsed_s']} s; "
        f"estimated {doc['estimated_s']} s). The model `repository/stream_tokens/1/model.py` "
        "(Triton Python-backend API, the same file for every server) sends "
        f"{config['tokens']} responses per request ({config['payload']} FP32 each plus a 3-int64 "
        "stamp), the model's pause between two of them, the final flag with the last; a thread "
        "per request, as Triton's decoupled examples. Client: gRPC `ModelStreamInfer`, c "
        "concurrent streams, one request at a time each, the next as soon as the final response "
        f"came; {config['client_procs']} client process(es); warm-up {config['warmup']} s, "
        f"window {config['window']} s per point, {config['rounds']} round(s) (medians); the "
        "servers run side by side, the one measured first alternating per point.",
        "",
        f"Machine: {machine['cpu_model']}, {machine['nproc']} cores, Python {machine['python']}; "
        f"load average {machine['loadavg_start']} at start, {doc['loadavg_end']} at the end. "
        "Client, servers and model share these cores.",
        "",
        "Times in µs. TTFR: request written -> first response read (to model: request written -> "
        "the model's `execute` took it). gap: between two responses of "
        "a request as the client reads them; model gap: the same between the model's send stamps "
        "(its pause, the sleep's overshoot and the previous send's cost); delivery: model stamp "
        "-> client read, per response (the server's path back, the client's read). "
        "Server CPU: the server's process group (Triton's includes the Python stub), per response "
        "in the window. client cores: CPU of each client process over the window (>= "
        f"{config['saturated']} marks the client as the bottleneck, *sat*); machine busy: the "
        "cores busy on the whole machine over the window (every process, other work's too).",
    ]
    for note in doc.get("notes", []):
        lines += ["", f"Note: {note}"]
    measured = [p for p in doc["points"] if p.get("requests")]
    if measured:
        top = max(measured, key=lambda p: max(p.get("client_cores") or [0]))
        costs = [p["client_cpu_us_per_response"] for p in measured if p["delay_us"] == 0]
        saturated = [p for p in measured if p.get("client_saturated")]
        busy = [p["machine_busy_cores"] for p in measured if p.get("machine_busy_cores")]
        lines += [
            "",
            f"Client check: the busiest client process used {max(top['client_cores'])} cores "
            f"({top['server']}, c={top['c']}, pause {top['delay_us'] / 1000:g} ms); at pause 0 "
            f"the client spent {_num(min(costs) if costs else None)}-"
            f"{_num(max(costs) if costs else None)} µs of CPU per response; "
            + (
                f"{len(saturated)} point(s) had a saturated client process (marked *sat*)."
                if saturated
                else f"no client process reached {config['saturated']} cores."
            )
            + (
                f" The whole machine was {min(busy):.1f}-{max(busy):.1f} of "
                f"{machine['nproc']} cores busy during the windows."
                if busy
                else ""
            ),
        ]
    for label, entry in doc["servers"].items():
        if entry["state"] != "ready":
            lines += ["", f"**{label} not measured**: {entry['state']}"]
    delays = sorted({p["delay_us"] for p in doc["points"]})
    for delay in delays:
        lines += [
            "",
            f"## Model pause {delay / 1000:g} ms between responses",
            "",
            "| c | server | responses/s | TTFR p50 / p99 (to model p50) | gap p50 / p99 | model gap p99 | "
            "gap p99 - pause | delivery p50 / p99 | server CPU µs/resp | client cores (µs/resp) / machine busy |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in config["concurrency"]:
            for label in labels:
                cell = summary.get(f"{label}|d{delay}|c{c}")
                if cell is None:
                    skipped = [
                        p for p in doc["points"]
                        if p["server"] == label and p["delay_us"] == delay and p["c"] == c
                    ]  # fmt: skip
                    if skipped:
                        why = skipped[0].get("skipped") or "; ".join(skipped[0].get("errors", []))
                        lines.append(f"| {c} | {label} | {why or 'failed'} | | | | | | | |")
                    continue
                runs = [
                    p
                    for p in doc["points"]
                    if p["server"] == label
                    and p["delay_us"] == delay
                    and p["c"] == c
                    and p.get("requests")
                ]
                cores = "; ".join(
                    f"{p.get('client_cores')} ({_num(p.get('client_cpu_us_per_response'))}) / "
                    f"{_num(p.get('machine_busy_cores'), 1)}"
                    for p in runs
                )
                sat = " *sat*" if cell.get("client_saturated") else ""
                over = cell["gap_p99"] - delay if cell.get("gap_p99") is not None else None
                ttfr = _pair(cell, "ttfr_p50", "ttfr_p99")
                ttfr += f" ({_num(cell.get('to_model_p50'))})"
                if cell.get("ttfr_n", 0) < 100:
                    ttfr += f" n={cell.get('ttfr_n', 0)}"
                lines.append(
                    f"| {c} | {label} | {_num(cell.get('responses_per_s'))} | {ttfr} | "
                    f"{_pair(cell, 'gap_p50', 'gap_p99')} | {_num(cell.get('model_gap_p99'))} | "
                    f"{_num(over)} | {_pair(cell, 'delivery_p50', 'delivery_p99')} | "
                    f"{_num(cell.get('server_cpu_us_per_response'), 1)} | {cores}{sat} |"
                )
    if ratios:
        lines += [
            "",
            "## infermux / Triton",
            "",
            "Ratios of the medians above: responses/s above 1 = infermux ahead; times and CPU "
            "below 1 = infermux faster / cheaper.",
            "",
            "| server | pause ms | c | responses/s | TTFR p50 | TTFR p99 | gap p99 | delivery p50 "
            "| delivery p99 | server CPU/resp |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for key, entry in ratios.items():
            label, delay_key, c_key = key.split("|")
            lines.append(
                f"| {label} | {int(delay_key[1:]) / 1000:g} | {c_key[1:]} | "
                + " | ".join(_num(entry.get(name), 2) for name in RATIO_FIGURES)
                + " |"
            )
    target = [
        (label, delay, summary.get(f"{label}|d{delay}|c64"))
        for label in labels
        for delay in delays
        if delay > 0
    ]
    target = [t for t in target if t[2] and t[2].get("gap_p99") is not None]
    if target:
        lines += [
            "",
            f"## Per-response overhead at c=64 (issue 28's target: <= {TARGET_US:.0f} µs on the "
            "device host)",
            "",
            "| server | pause ms | gap p50 - pause | gap p99 - pause | delivery p50 | delivery p99 |",
            "|---|---|---|---|---|---|",
        ]
        for label, delay, cell in target:
            assert cell is not None
            lines.append(
                f"| {label} | {delay / 1000:g} | {cell['gap_p50'] - delay:.0f} | "
                f"{cell['gap_p99'] - delay:.0f} | {_num(cell.get('delivery_p50'))} | "
                f"{_num(cell.get('delivery_p99'))} |"
            )
    lines += ["", "## Commands", "", "```", doc["command"]]
    lines += [f"# {label}: {entry['command']}" for label, entry in doc["servers"].items()]
    lines += ["```", ""]
    return "\n".join(lines)
