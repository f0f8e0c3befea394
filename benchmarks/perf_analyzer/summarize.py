"""Turn run.sh's perf_analyzer outputs (OUT/<mode>.csv, .log, .rc, .cmd) into OUT.json and OUT.md.

Usage: python summarize.py [OUT_DIR] [--json PATH] [--md PATH]
Defaults: OUT_DIR=benchmarks/results/perf_analyzer, JSON=OUT_DIR.json, MD=OUT_DIR.md. Stdlib only.

perf_analyzer's CSV columns depend on what the server offers: without the `statistics` extension it has
only Concurrency, Inferences/Second, Client Send, Client Recv and the latency percentiles; with it the
server columns (Server Queue, Server Compute Input/Infer/Output, Network+Server Send/Recv) appear too.
All times are microseconds.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

MODES = ("http", "grpc", "http_shm", "grpc_shm")
MODE_LABELS = {
    "http": "HTTP",
    "grpc": "gRPC",
    "http_shm": "HTTP + system shm",
    "grpc_shm": "gRPC + system shm",
}
ERROR_RE = re.compile(r"error|failed|unable|unstable", re.IGNORECASE)


def _num(value: str | None) -> float | int | None:
    if value is None or value.strip() == "":
        return None
    try:
        f = float(value)
    except ValueError:
        return None
    return int(f) if f.is_integer() else f


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return None


def read_csv(path: Path) -> list[dict[str, float | int | None]]:
    """perf_analyzer's -f CSV: one row per load level; after the first blank line come optional extras."""
    text = _read_text(path)
    if not text:
        return []
    block = text.split("\n\n", 1)[0]
    rows = []
    for raw in csv.DictReader(block.splitlines()):
        rows.append({k.strip(): _num(v) for k, v in raw.items() if k})
    return rows


def server_block(log: str) -> list[str]:
    """The indented lines under '  Server:' (present only when the server reports statistics)."""
    lines, inside = [], False
    for line in log.splitlines():
        if line.strip() == "Server:":
            inside = True
            continue
        if inside and line.startswith("    "):
            lines.append(line.strip())
            continue
        inside = False
    return lines


def summarize_mode(out: Path, mode: str) -> dict | None:
    log = _read_text(out / f"{mode}.log")
    rc_text = _read_text(out / f"{mode}.rc")
    if log is None and rc_text is None:
        return None
    rc = _num(rc_text.strip()) if rc_text else None
    log = log or ""
    rows = read_csv(out / f"{mode}.csv")
    # run.sh uses a single concurrency level; if several were run, report the highest-throughput row.
    row = max(rows, key=lambda r: r.get("Inferences/Second") or 0) if rows else {}
    m = re.search(r"Throughput:\s*([\d.]+)\s*infer/sec", log)
    throughput = row.get("Inferences/Second") or (float(m.group(1)) if m else None)

    def col(name: str):
        return row.get(name)

    compute_parts = [
        col("Server Compute Input"),
        col("Server Compute Infer"),
        col("Server Compute Output"),
    ]
    compute = (
        sum(p for p in compute_parts if p is not None)
        if any(p is not None for p in compute_parts)
        else None
    )
    errors = [ln.strip() for ln in log.splitlines() if ERROR_RE.search(ln)]
    # Collapse repeats (every worker thread prints the same error).
    seen, unique_errors = set(), []
    for e in errors:
        if e not in seen:
            seen.add(e)
            unique_errors.append(e)
    cmd = (_read_text(out / f"{mode}.cmd") or "").strip()
    return {
        "mode": mode,
        "label": MODE_LABELS.get(mode, mode),
        "exit_status": rc,
        "ok": rc == 0 and bool(row),
        "concurrency": col("Concurrency"),
        "throughput_infer_per_s": throughput,
        "p50_us": col("p50 latency"),
        "p90_us": col("p90 latency"),
        "p95_us": col("p95 latency"),
        "p99_us": col("p99 latency"),
        "client_send_us": col("Client Send"),
        "client_recv_us": col("Client Recv"),
        "network_server_send_recv_us": col("Network+Server Send/Recv"),
        "server_queue_us": col("Server Queue"),
        "server_compute_input_us": col("Server Compute Input"),
        "server_compute_infer_us": col("Server Compute Infer"),
        "server_compute_output_us": col("Server Compute Output"),
        "server_compute_us": compute,
        "server_lines": server_block(log),
        "errors": unique_errors[:10],
        "command": cmd,
        "csv_rows": rows,
    }


def fmt(v, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def to_markdown(doc: dict) -> str:
    out = [
        "# perf_analyzer vs infermux",
        "",
        f"Model `{doc['model']}`, concurrency {doc['concurrency'] or '?'}, from `{doc['source']}`. "
        "Latencies in µs; server columns need the `statistics` extension (- = not reported).",
        "",
        "| mode | exit | throughput (infer/s) | p50 µs | p99 µs | server queue µs | server compute µs | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        note = "" if r["ok"] else (r["errors"][0] if r["errors"] else "no CSV written")
        note = note.replace("|", "\\|")
        out.append(
            f"| {r['label']} | {fmt(r['exit_status'])} | {fmt(r['throughput_infer_per_s'], 1)} | "
            f"{fmt(r['p50_us'])} | {fmt(r['p99_us'])} | {fmt(r['server_queue_us'])} | "
            f"{fmt(r['server_compute_us'])} | {note} |"
        )
    if doc.get("server_metadata"):
        out += ["", f"Server metadata (`GET /v2`): `{json.dumps(doc['server_metadata'])}`"]
    out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="benchmarks/results/perf_analyzer")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--md", dest="md_path")
    a = ap.parse_args()
    out = Path(a.out)
    json_path = Path(a.json_path) if a.json_path else out.with_name(out.name + ".json")
    md_path = Path(a.md_path) if a.md_path else out.with_name(out.name + ".md")

    known = list(MODES) + sorted(p.stem for p in out.glob("*.rc") if p.stem not in MODES)
    results = [r for m in known if (r := summarize_mode(out, m)) is not None]
    meta_text = _read_text(out / "server_metadata.json")
    try:
        meta = json.loads(meta_text) if meta_text else None
    except json.JSONDecodeError:
        meta = None
    model = "simple"
    conc = None
    for r in results:
        mm = re.search(r"(?:^|\s)-m\s+(\S+)", r["command"])
        if mm:
            model = mm.group(1)
        cm = re.search(r"--concurrency-range\s+(\S+)", r["command"])
        if cm:
            conc = cm.group(1)
    doc = {
        "tool": "perf_analyzer",
        "model": model,
        "concurrency": conc,
        "source": str(out),
        "server_metadata": meta,
        "results": results,
    }
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    md_path.write_text(to_markdown(doc))
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
