"""Helper of ``ab_shm.sh``: OLD (mmap views) vs NEW (fstat + preadv copies) system shared memory.

Subcommands (stdlib only, except ``export``, which needs torch + torchvision):

- ``export --repo DIR [--device cuda|cpu] [--tiny]``: the GPU benchmark's ResNet-50 fp16 repository
  (``benchmarks/gpu/models.py``: 4 KIND_GPU instances, CUDA graphs, max_queue_delay 500 µs),
  in this process, so its CUDA context is gone before any server starts.
- ``ports``: three free loopback ports (HTTP, gRPC, metrics) on one line.
- ``wait-ready --url URL --model M --pid PID --timeout S``: poll ``/v2/health/ready`` and the
  model's ready route until both answer 200; exit 1 if PID dies or the time runs out.
- ``which``: the infermux on ``sys.path`` and whether its system shm maps regions.
- ``summarize --work DIR --out DIR``: every ``pa_<i>_<variant>_<proto>.csv/.log/.rc`` and
  ``smi_<...>.csv`` under DIR into ``NAME.json`` and ``NAME.md`` in OUT (``--name``, default
  ``ab_shm``); variants in the order of ``meta.json``'s, ratios to OLD.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import socket
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ("grpc_shm", "http")
RUN_RE = re.compile(r"^pa_(\d+)_(\w+?)_(grpc_shm|http)\.csv$")
SERVER_RE = re.compile(
    r"Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec \+ compute input "
    r"(\d+) usec \+ compute infer (\d+) usec \+ compute output (\d+) usec\)"
)
COLUMNS = {  # perf_analyzer -f CSV column -> our key (µs unless noted)
    "Inferences/Second": "img_per_s",
    "Client Send": "client_send_us",
    "Network+Server Send/Recv": "network_server_us",
    "Server Queue": "server_queue_us",
    "Server Compute Input": "server_compute_input_us",
    "Server Compute Infer": "server_compute_infer_us",
    "Server Compute Output": "server_compute_output_us",
    "Client Recv": "client_recv_us",
    "p50 latency": "p50_us",
    "p99 latency": "p99_us",
}
SMI_SKIP = 8  # samples (250 ms each) dropped at the start: perf_analyzer connecting and registering


def cmd_export(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    from models import export
    from specs import model_spec

    spec = model_spec("resnet50", args.tiny)
    started = time.perf_counter()
    done = export(
        spec,
        args.repo,
        tiny=args.tiny,
        device=args.device,
        instances=args.instances,
        queue_delay_us=args.queue_delay_us,
        cuda_graphs=True,
    )
    print(
        json.dumps(
            {
                "model_file": str(done.model_file),
                "config_pbtxt": done.config_file.read_text(),
                "trace_check_error": done.trace_check_error,
                "export_s": round(time.perf_counter() - started, 2),
            }
        )
    )


def cmd_ports(_: argparse.Namespace) -> None:
    socks = [socket.socket() for _ in range(3)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    print(*(s.getsockname()[1] for s in socks))
    for s in socks:
        s.close()


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); /proc says whether it is one
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def cmd_wait_ready(args: argparse.Namespace) -> None:
    started = time.monotonic()
    while time.monotonic() - started < args.timeout:
        if _ok(f"{args.url}/v2/health/ready") and _ok(f"{args.url}/v2/models/{args.model}/ready"):
            print(f"{time.monotonic() - started:.2f}")
            return
        if not _alive(args.pid):
            print(f"server pid {args.pid} exited before ready", file=sys.stderr)
            sys.exit(1)
        time.sleep(0.25)
    print(f"not ready after {args.timeout} s", file=sys.stderr)
    sys.exit(1)


def cmd_which(_: argparse.Namespace) -> None:
    import infermux.dataplane.shared_memory as shm

    text = Path(shm.__file__).read_text()
    print(
        json.dumps(
            {
                "infermux": str(Path(shm.__file__).parents[1]),
                "shm_maps_regions": "mmap.mmap(" in text,
                "shm_uses_preadv": "os.preadv(" in text,
            }
        )
    )


def _num(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def read_pa_csv(path: Path) -> dict[str, float | None]:
    try:
        block = path.read_text(errors="replace").split("\n\n", 1)[0]
    except FileNotFoundError:
        return {}
    rows = list(csv.DictReader(block.splitlines()))
    if not rows:
        return {}
    row = {(k or "").strip(): v for k, v in rows[-1].items()}
    return {ours: _num(row.get(theirs)) for theirs, ours in COLUMNS.items()}


def read_smi(path: Path) -> dict[str, float | None]:
    """nvidia-smi ``timestamp, utilization.gpu, memory.used`` lines (no header, no units)."""
    util: list[float] = []
    mem: list[float] = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return {"gpu_util_mean": None, "gpu_util_max": None, "gpu_mem_mib": None, "samples": 0}
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and _num(parts[1]) is not None:
            util.append(float(parts[1]))
            mem.append(_num(parts[2]) or 0.0)
    kept = util[SMI_SKIP:] if len(util) > SMI_SKIP + 4 else util
    return {
        "gpu_util_mean": round(statistics.fmean(kept), 1) if kept else None,
        "gpu_util_max": max(kept) if kept else None,
        "gpu_mem_mib": max(mem) if mem else None,
        "samples": len(kept),
    }


def read_run(work: Path, index: int, variant: str, proto: str) -> dict[str, Any]:
    stem = f"{index}_{variant}_{proto}"
    log = (
        (work / f"pa_{stem}.log").read_text(errors="replace")
        if (work / f"pa_{stem}.log").exists()
        else ""
    )
    rc_file = work / f"pa_{stem}.rc"
    rc = int(rc_file.read_text().strip() or -1) if rc_file.exists() else None
    run: dict[str, Any] = {"index": index, "variant": variant, "proto": proto, "rc": rc}
    run.update(read_pa_csv(work / f"pa_{stem}.csv"))
    found = SERVER_RE.findall(log)
    if found:
        names = ("request", "overhead", "queue", "compute_input", "compute_infer", "compute_output")
        run["server_log_us"] = dict(zip(names, map(int, found[-1]), strict=True))
    run.update(read_smi(work / f"smi_{stem}.csv"))
    run["server_overhead_us"] = run.get("server_log_us", {}).get("overhead")
    run["ok"] = rc == 0 and run.get("img_per_s") is not None
    if not run["ok"]:
        run["errors"] = [
            ln.strip() for ln in log.splitlines() if re.search(r"error|fail|unstable", ln, re.I)
        ][:5]
    return run


def _stats(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    med = statistics.median(values)
    return {
        "median": round(med, 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
        "spread_pct": round(100 * (max(values) - min(values)) / med, 1) if med else None,
        "n": len(values),
        "values": [round(v, 1) for v in values],
    }


FIGURES = (
    "img_per_s",
    "server_compute_input_us",
    "server_compute_infer_us",
    "server_compute_output_us",
    "server_queue_us",
    "server_overhead_us",
    "p50_us",
    "p99_us",
    "gpu_util_mean",
)


def summarize(work: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Per (protocol, variant) statistics over rounds; ratios to OLD (the first variant if no
    OLD was measured)."""
    runs = []
    for path in sorted(work.glob("pa_*.rc")):
        m = RUN_RE.match(path.name.replace(".rc", ".csv"))
        if m:
            runs.append(read_run(work, int(m.group(1)), m.group(2), m.group(3)))
    runs.sort(key=lambda r: (r["index"], PROTOS.index(r["proto"])))
    variants = list(meta.get("variants") or [])
    variants += [v for v in dict.fromkeys(r["variant"] for r in runs) if v not in variants]
    variants = [v for v in variants if any(r["variant"] == v for r in runs)]
    protos = [p for p in PROTOS if any(r["proto"] == p for r in runs)]
    baseline = "old" if "old" in variants else (variants[0] if variants else "")
    cells: dict[str, dict[str, Any]] = {}
    for proto in protos:
        for variant in variants:
            ok = [r for r in runs if r["proto"] == proto and r["variant"] == variant and r["ok"]]
            cells[f"{proto}|{variant}"] = {
                f: _stats([float(r[f]) for r in ok if r.get(f) is not None]) for f in FIGURES
            }
    ratios: dict[str, dict[str, float | None]] = {}
    for proto in protos:
        base = cells[f"{proto}|{baseline}"]["img_per_s"]
        ratios[proto] = {}
        for variant in variants:
            cell = cells[f"{proto}|{variant}"]["img_per_s"]
            ok = base and cell and base["median"]
            ratios[proto][variant] = round(cell["median"] / base["median"], 3) if ok else None
    return {
        "meta": meta,
        "variants": variants,
        "protos": protos,
        "baseline": baseline,
        "runs": runs,
        "cells": cells,
        "ratio_to_baseline": ratios,
        "ratio_new_over_old": {p: ratios[p].get("new") for p in protos}
        if baseline == "old"
        else {},
    }


def _fmt(cell: dict[str, Any] | None, digits: int = 0) -> str:
    if not cell:
        return "-"
    return f"{cell['median']:,.{digits}f}"


def _range(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "-"
    return f"{cell['min']:,.0f}-{cell['max']:,.0f} ({cell['spread_pct']}%, n={cell['n']})"


def render_md(summary: dict[str, Any]) -> str:
    meta = summary["meta"]
    lines = [
        "# System shared memory A/B: OLD mmap views vs NEW fstat + preadv copies",
        "",
        f"- OLD: {meta.get('old_commit', '?')} ({meta.get('old_which', '?')})",
        f"- NEW: {meta.get('new_commit', '?')} ({meta.get('new_which', '?')})",
        f"- Device: {meta.get('device', '?')}; {meta.get('cores', '?')} cores; {meta.get('python', '?')}",
        "- Model: ResNet-50 fp16 TorchScript (benchmarks/gpu/models.py), 4 KIND_GPU instances, CUDA "
        "graphs, dynamic batching max_queue_delay 500 µs; `infermux serve --frontends 4`.",
        f"- Load: perf_analyzer, batch 1, {meta.get('pa_flags', '?')}; GPU util = nvidia-smi every "
        f"250 ms beside each run (first 2 s dropped), mean.",
        f"- Order: {meta.get('order_done', '?')} (one server start per variant and round; grpc_shm then http).",
        "",
        "## Medians over rounds",
        "",
        f"| protocol | variant | img/s (median) | img/s min-max (spread, n) | "
        f"÷ {summary['baseline'].upper()} | GPU util % | "
        "compute input µs | compute infer µs | compute output µs | queue µs | overhead µs | p50 µs | p99 µs |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for proto in summary["protos"]:
        for variant in summary["variants"]:
            c = summary["cells"][f"{proto}|{variant}"]
            ratio = summary["ratio_to_baseline"][proto][variant]
            ratio = None if variant == summary["baseline"] else ratio
            lines.append(
                f"| {proto} | {variant.upper()} | {_fmt(c['img_per_s'])} | {_range(c['img_per_s'])} | "
                f"{'' if ratio is None else f'{ratio:.3f}'} | {_fmt(c['gpu_util_mean'], 1)} | "
                f"{_fmt(c['server_compute_input_us'])} | {_fmt(c['server_compute_infer_us'])} | "
                f"{_fmt(c['server_compute_output_us'])} | {_fmt(c['server_queue_us'])} | "
                f"{_fmt(c['server_overhead_us'])} | "
                f"{_fmt(c['p50_us'])} | {_fmt(c['p99_us'])} |"
            )
    lines += [
        "",
        "## Every run",
        "",
        "| # | variant | protocol | rc | img/s | GPU util % (max) | compute input µs | compute infer µs | "
        "queue µs | p50 µs | p99 µs |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summary["runs"]:

        def g(key: str, r: dict[str, Any] = r) -> str:
            v = r.get(key)
            return "-" if v is None else f"{v:,.0f}"

        lines.append(
            f"| {r['index']} | {r['variant'].upper()} | {r['proto']} | {r['rc']} | {g('img_per_s')} | "
            f"{'-' if r.get('gpu_util_mean') is None else r['gpu_util_mean']} "
            f"({'-' if r.get('gpu_util_max') is None else r['gpu_util_max']:}) | "
            f"{g('server_compute_input_us')} | {g('server_compute_infer_us')} | "
            f"{g('server_queue_us')} | {g('p50_us')} | {g('p99_us')} |"
        )
        if not r["ok"] and r.get("errors"):
            lines.append(
                f"|  |  | error: {'; '.join(r['errors'])[:300].replace('|', '/')} | | | | | | | | |"
            )
    return "\n".join(lines) + "\n"


def cmd_summarize(args: argparse.Namespace) -> None:
    meta: dict[str, Any] = {}
    meta_file = args.work / "meta.json"
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
    summary = summarize(args.work, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(render_md(summary))
    for proto in summary["protos"]:
        figures = ", ".join(
            f"{v.upper()} {_fmt(summary['cells'][f'{proto}|{v}']['img_per_s'])} "
            f"({summary['ratio_to_baseline'][proto][v]})"
            for v in summary["variants"]
        )
        print(f"{proto} img/s (÷ {summary['baseline'].upper()}): {figures}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--repo", type=Path, required=True)
    e.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    e.add_argument("--tiny", action="store_true")
    e.add_argument("--instances", type=int, default=4)
    e.add_argument("--queue-delay-us", type=int, default=500)
    e.set_defaults(fn=cmd_export)
    sub.add_parser("ports").set_defaults(fn=cmd_ports)
    sub.add_parser("which").set_defaults(fn=cmd_which)
    w = sub.add_parser("wait-ready")
    w.add_argument("--url", required=True)
    w.add_argument("--model", default="resnet50")
    w.add_argument("--pid", type=int, required=True)
    w.add_argument("--timeout", type=float, default=120)
    w.set_defaults(fn=cmd_wait_ready)
    s = sub.add_parser("summarize")
    s.add_argument("--work", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--name", default="ab_shm", help="OUT/NAME.json and OUT/NAME.md")
    s.set_defaults(fn=cmd_summarize)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
