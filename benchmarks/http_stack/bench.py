"""HTTP/ASGI server-stack benchmark for infermux's KServe V2 hot path.

One run: for every stack, start the server (taskset -c 0, own process group), check
the responses are correct, warm up, then drive each route at concurrency 1/8/64
with wrk (taskset -c 1).  Stacks alternate across rounds (A B C ..., A B C ...).
Also measures the raw in-process cost of the handler logic (no HTTP).

  /tmp/httpbench-venv/bin/python benchmarks/http_stack/bench.py [--rounds 2] [--duration 5]

Writes benchmarks/results/http_stack.json and benchmarks/results/http_stack.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
VENV = Path(os.environ.get("HTTPBENCH_VENV", "/tmp/httpbench-venv"))
VBIN = VENV / "bin"
PY = str(VBIN / "python")
SERVER_CPU = "0"
LOADGEN_CPU = "1"

sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # benchmarks/: benchkit
import app as bench_app  # noqa: E402
import benchkit  # noqa: E402
from benchkit import stop_group  # noqa: E402

ROUTES = {
    "health": ("GET", "/v2/health/ready"),
    "simple": ("POST", "/v2/models/simple/infer"),
    "identity": ("POST", "/v2/models/identity/infer"),
}
CONCURRENCY = [1, 8, 64]


def stacks(port: int) -> dict[str, list[str]]:
    h, p = "127.0.0.1", str(port)
    return {
        "uvicorn+httptools+uvloop": [
            str(VBIN / "uvicorn"),
            "app:app",
            "--host",
            h,
            "--port",
            p,
            "--http",
            "httptools",
            "--loop",
            "uvloop",
            "--log-level",
            "warning",
            "--no-access-log",
            "--lifespan",
            "on",
        ],
        "uvicorn+h11+asyncio": [
            str(VBIN / "uvicorn"),
            "app:app",
            "--host",
            h,
            "--port",
            p,
            "--http",
            "h11",
            "--loop",
            "asyncio",
            "--log-level",
            "warning",
            "--no-access-log",
            "--lifespan",
            "on",
        ],
        "granian(asgi,uvloop)": [
            str(VBIN / "granian"),
            "--interface",
            "asgi",
            "--host",
            h,
            "--port",
            p,
            "--workers",
            "1",
            "--runtime-threads",
            "1",
            "--loop",
            "uvloop",
            "--no-ws",
            "--log-level",
            "warning",
            "--no-access-log",
            "app:app",
        ],
        "hypercorn+uvloop": [
            str(VBIN / "hypercorn"),
            "-k",
            "uvloop",
            "-w",
            "1",
            "-b",
            f"{h}:{p}",
            "--log-level",
            "warning",
            "app:app",
        ],
        # Shape infermux needs: HTTP front end + grpc.aio server in ONE uvloop loop we own.
        "embedded uvicorn.Server+grpc.aio": [
            PY,
            "embed_server.py",
            "--mode",
            "uvicorn",
            "--port",
            p,
            "--grpc-port",
            str(port + 1),
        ],
        "embedded granian.embed+grpc.aio": [
            PY,
            "embed_server.py",
            "--mode",
            "granian",
            "--port",
            p,
            "--grpc-port",
            str(port + 1),
        ],
    }


BASELINE = "uvicorn+httptools+uvloop"


# ----------------------------------------------------------------- helpers
def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s2:  # also need port+1 for gRPC
            try:
                s2.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


LUA_DONE = r"""
done = function(summary, latency, requests)
  io.write(string.format(
    '\nRESULT {"requests":%d,"duration_us":%d,"bytes":%d,"err_connect":%d,"err_read":%d,' ..
    '"err_write":%d,"err_status":%d,"err_timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
"""


def write_lua(tmp: Path) -> dict[str, Path]:
    simple = bench_app.make_simple_body()
    ident, hlen = bench_app.make_identity_body()
    (tmp / "simple.bin").write_bytes(simple)
    (tmp / "identity.bin").write_bytes(ident)
    scripts = {
        "health": LUA_DONE,
        "simple": f"""
wrk.method = "POST"
local f = io.open("{tmp}/simple.bin", "rb"); wrk.body = f:read("*a"); f:close()
wrk.headers["Content-Type"] = "application/json"
"""
        + LUA_DONE,
        "identity": f"""
wrk.method = "POST"
local f = io.open("{tmp}/identity.bin", "rb"); wrk.body = f:read("*a"); f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = "{hlen}"
"""
        + LUA_DONE,
    }
    out = {}
    for k, v in scripts.items():
        p = tmp / f"{k}.lua"
        p.write_text(v)
        out[k] = p
    return out


def run_wrk(port: int, route: str, lua: Path, conc: int, duration: float) -> dict:
    url = f"http://127.0.0.1:{port}{ROUTES[route][1]}"
    cmd = [
        "taskset",
        "-c",
        LOADGEN_CPU,
        "wrk",
        "-t1",
        f"-c{conc}",
        f"-d{max(1, round(duration))}s",
        "--timeout",
        "5s",
        "--latency",
        "-s",
        str(lua),
        url,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return {"error": f"wrk rc={p.returncode}: {p.stdout[-400:]} {p.stderr[-400:]}"}
    r = json.loads(line[len("RESULT ") :])
    dur = r["duration_us"] / 1e6
    errs = sum(r[k] for k in ("err_connect", "err_read", "err_write", "err_status", "err_timeout"))
    return {
        "rps": round(r["requests"] / dur, 1),
        "p50_ms": round(r["p50_us"] / 1000, 3),
        "p90_ms": round(r["p90_us"] / 1000, 3),
        "p99_ms": round(r["p99_us"] / 1000, 3),
        "mean_ms": round(r["mean_us"] / 1000, 3),
        "max_ms": round(r["max_us"] / 1000, 3),
        "requests": r["requests"],
        "errors": errs,
        "error_detail": {k: r[k] for k in r if k.startswith("err_") and r[k]},
    }


def http(port: int, route: str) -> tuple[int, dict, bytes]:
    method, path = ROUTES[route]
    headers, body = {}, None
    if route == "simple":
        body, headers = bench_app.make_simple_body(), {"Content-Type": "application/json"}
    elif route == "identity":
        body, hlen = bench_app.make_identity_body()
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(hlen),
        }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, method=method, headers=headers
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()


def verify(port: int) -> list[str]:
    """Functional check of all three routes; returns a list of problems."""
    import numpy as np
    import orjson

    bad = []
    st, _, body = http(port, "health")
    if st != 200 or body:
        bad.append(f"health: {st} {body[:50]!r}")
    st, hd, body = http(port, "simple")
    resp = orjson.loads(body)
    o0 = resp["outputs"][0]["data"]
    o1 = resp["outputs"][1]["data"]
    if st != 200 or o0 != [i + 1 for i in range(16)] or o1 != [i - 1 for i in range(16)]:
        bad.append(f"simple: {st} {body[:120]!r}")
    if not hd.get("content-type", "").startswith("application/json"):
        bad.append(f"simple content-type {hd.get('content-type')}")
    st, hd, body = http(port, "identity")
    hlen = int(hd.get("inference-header-content-length", -1))
    sent, shl = bench_app.make_identity_body()
    if st != 200 or hlen <= 0 or body[hlen:] != sent[shl:]:
        bad.append(f"identity: {st} hlen={hlen} len={len(body)}")
    else:
        h = orjson.loads(body[:hlen])
        arr = np.frombuffer(body[hlen:], dtype=np.float32)
        if h["outputs"][0]["parameters"]["binary_data_size"] != 65536 or arr[-1] != 16383:
            bad.append("identity: bad header/tensor")
    return bad


class Server:
    def __init__(self, name: str, cmd: list[str], port: int):
        self.name, self.cmd, self.port = name, cmd, port
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(
            "w+", prefix="httpbench-srv-", suffix=".log", delete=False
        )

    def start(self, timeout: float = 20) -> float:
        env = dict(os.environ, PYTHONPATH=str(HERE), PATH=f"{VBIN}:{os.environ.get('PATH', '')}")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            ["taskset", "-c", SERVER_CPU, *self.cmd],
            cwd=HERE,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group
        )
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited rc={self.proc.returncode}: {self.logtail()}"
                )
            try:
                if http(self.port, "health")[0] == 200:
                    return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not become ready: {self.logtail()}")

    def logtail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-1500:]

    def stop(self) -> float:
        if self.proc is None:
            return 0.0
        took = stop_group(self.proc, 10)  # stragglers (worker children) go too
        self.proc = None
        return took


# ----------------------------------------------------------------- raw in-process cost
def raw_main(seconds: float) -> None:
    """Tight loops in this process (run under taskset -c 0 by the parent)."""
    import uvloop

    simple = bench_app.make_simple_body()
    ident, hlen = bench_app.make_identity_body()

    def loop_rate(fn) -> float:
        rates = []
        for _ in range(3):
            n, t0 = 0, time.perf_counter()
            while True:
                for _ in range(200):
                    fn()
                n += 200
                dt = time.perf_counter() - t0
                if dt >= seconds / 3:
                    break
            rates.append(n / dt)
        return statistics.median(rates)

    out = {
        "handler_simple_calls_per_s": loop_rate(lambda: bench_app.simple_infer(simple)),
        "handler_identity_calls_per_s": loop_rate(lambda: bench_app.identity_infer(ident, hlen)),
    }

    # Full ASGI app call (dispatch + receive/send + handler), no server, no sockets.
    scopes = {
        "health": (
            {"type": "http", "method": "GET", "path": "/v2/health/ready", "headers": []},
            b"",
        ),
        "simple": (
            {
                "type": "http",
                "method": "POST",
                "path": "/v2/models/simple/infer",
                "headers": [(b"content-type", b"application/json")],
            },
            simple,
        ),
        "identity": (
            {
                "type": "http",
                "method": "POST",
                "path": "/v2/models/identity/infer",
                "headers": [(b"inference-header-content-length", str(hlen).encode())],
            },
            ident,
        ),
    }

    async def asgi_rate(scope, body) -> float:
        msg = {"type": "http.request", "body": body, "more_body": False}

        async def receive():
            return msg

        async def send(m):
            pass

        rates = []
        for _ in range(3):
            n, t0 = 0, time.perf_counter()
            while True:
                for _ in range(200):
                    await bench_app.app(scope, receive, send)
                n += 200
                dt = time.perf_counter() - t0
                if dt >= seconds / 3:
                    break
            rates.append(n / dt)
        return statistics.median(rates)

    async def all_asgi():
        return {f"asgi_app_{k}_calls_per_s": await asgi_rate(s, b) for k, (s, b) in scopes.items()}

    out.update(uvloop.run(all_asgi()))
    print(json.dumps({k: round(v, 1) for k, v in out.items()}))


def measure_raw(seconds: float = 3.0) -> dict:
    p = subprocess.run(
        ["taskset", "-c", SERVER_CPU, PY, __file__, "--raw", "--raw-seconds", str(seconds)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
    )
    if p.returncode != 0:
        return {"error": p.stderr[-1000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------- env info
def machine_info() -> dict:
    return benchkit.machine_info(server_cpu=SERVER_CPU, loadgen_cpu=LOADGEN_CPU)


def versions() -> dict:
    p = subprocess.run(
        [PY, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True
    )
    pk = {d["name"]: d["version"] for d in json.loads(p.stdout or "[]")}
    wrk = subprocess.run(["wrk", "--version"], capture_output=True, text=True)
    pk["wrk"] = (wrk.stdout or wrk.stderr).splitlines()[0].strip()
    return pk


def embed_checks() -> dict:
    out = {}
    for mode in ("uvicorn", "granian"):
        p = subprocess.run(
            [PY, "embed_server.py", "--mode", mode, "--check"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=HERE,
        )
        try:
            out[mode] = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            out[mode] = {"ok": False, "error": (p.stdout + p.stderr)[-800:]}
    return out


# ----------------------------------------------------------------- main
def summarize(stack_results: dict) -> dict:
    summ = {}
    for stack, routes in stack_results.items():
        summ[stack] = {}
        for route, concs in routes.items():
            summ[stack][route] = {}
            for conc, rounds in concs.items():
                ok = [r for r in rounds if "rps" in r]
                if not ok:
                    summ[stack][route][conc] = {
                        "error": rounds[-1].get("error") if rounds else "no data"
                    }
                    continue
                rps = [r["rps"] for r in ok]
                summ[stack][route][conc] = {
                    "rps": round(statistics.median(rps), 1),
                    "p50_ms": round(statistics.median(r["p50_ms"] for r in ok), 3),
                    "p99_ms": round(statistics.median(r["p99_ms"] for r in ok), 3),
                    "rps_spread_pct": round(100 * (max(rps) - min(rps)) / statistics.mean(rps), 1),
                    "errors": sum(r["errors"] for r in ok),
                    "rounds": rounds,
                }
    return summ


RAW_KEY = {
    "health": "asgi_app_health_calls_per_s",
    "simple": "handler_simple_calls_per_s",
    "identity": "handler_identity_calls_per_s",
}


def write_md(doc: dict, path: Path) -> None:
    s = doc["summary"]
    raw = doc["raw_in_process"]
    L = []
    L.append("# HTTP/ASGI stack benchmark (infermux KServe V2 hot path)\n")
    mi = doc["machine"]
    L.append(
        f"- Machine: {mi['cpu_model']}, {mi['nproc']} CPUs, {mi['platform']}, Python {mi['python']}"
    )
    L.append(
        f"- Server pinned to CPU {SERVER_CPU}, wrk (1 thread) pinned to CPU {LOADGEN_CPU}; "
        f"{doc['config']['rounds']} rounds x {doc['config']['duration_s']} s per cell, stacks alternated "
        f"per round; values are the median over rounds (`spread` = (max-min)/mean of rps across rounds)."
    )
    v = doc["versions"]
    L.append(
        "- Versions: "
        + ", ".join(
            f"{k} {v.get(k, '?')}"
            for k in (
                "uvicorn",
                "httptools",
                "uvloop",
                "h11",
                "granian",
                "Hypercorn",
                "orjson",
                "numpy",
                "grpcio",
            )
        )
        + f", {v.get('wrk')}"
    )
    L.append(
        f"- Load average at start / end: {mi['loadavg_start']} / {mi.get('loadavg_end')} (shared machine)\n"
    )
    L.append("## Raw in-process cost (no HTTP, CPU 0)\n")
    L.append("| what | calls/s | us/call |")
    L.append("|---|---:|---:|")
    for k, val in raw.items():
        if isinstance(val, (int, float)):
            L.append(f"| {k.replace('_calls_per_s', '')} | {val:,.0f} | {1e6 / val:.1f} |")
    L.append("")
    L.append(
        "`x base` = rps / rps of uvicorn+httptools+uvloop.  `% raw` = rps / raw in-process calls/s of that "
        "route's handler (simple/identity: handler function only; health: full ASGI app call) — i.e. the "
        "fraction of the single core's pure-handler throughput that survives the HTTP stack.\n"
    )
    for route in ROUTES:
        L.append(f"## {route}: {ROUTES[route][0]} {ROUTES[route][1]}\n")
        L.append("| stack | c | rps | x base | % raw | p50 ms | p99 ms | spread | errors |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        rawv = raw.get(RAW_KEY[route])
        for stack in s:
            for conc in CONCURRENCY:
                c = s[stack][route].get(str(conc)) or s[stack][route].get(conc)
                if not c or "rps" not in c:
                    L.append(
                        f"| {stack} | {conc} | ERROR | | | | | | {c.get('error') if c else ''} |"
                    )
                    continue
                b = s[BASELINE][route].get(str(conc)) or s[BASELINE][route].get(conc)
                xb = c["rps"] / b["rps"] if b and b.get("rps") else float("nan")
                pr = 100 * c["rps"] / rawv if isinstance(rawv, (int, float)) else float("nan")
                L.append(
                    f"| {stack} | {conc} | {c['rps']:,.0f} | {xb:.2f} | {pr:.0f}% | {c['p50_ms']:.3f} | "
                    f"{c['p99_ms']:.3f} | {c['rps_spread_pct']:.1f}% | {c['errors']} |"
                )
        L.append("")
    L.append("## Embeddability (one uvloop loop hosting HTTP + grpc.aio)\n")
    for mode, r in doc["embed_check"].items():
        L.append(
            f"- {mode}: ok={r.get('ok')} " + json.dumps({k: v for k, v in r.items() if k != "mode"})
        )
    L.append("")
    L.append("## Caveats\n")
    L.append(
        "- Shared 2-vCPU VM: other tenants' load shows up as round-to-round spread (see `spread`; up to ~60% "
        "on some c=1/c=8 cells) and the raw handler rate varied ~2x between a smoke run and this run. "
        "Treat differences under ~25% as noise; the large gaps (h11/hypercorn ~0.2-0.5x) are robust."
    )
    L.append(
        "- Server and its helper threads are all pinned to ONE core.  granian's Rust runtime thread therefore "
        "competes with the Python loop thread for CPU 0 and every request crosses threads, which costs "
        "latency at c=1 and wins throughput only at high concurrency (batching)."
    )
    L.append(
        "- `% raw` is low because at c=1/c=8 the client round trip (loopback, syscalls, HTTP parse) dominates "
        "the ~10-20 us of handler work."
    )
    L.append("")
    L.append("## Verification / startup\n")
    for stack, info in doc["stack_info"].items():
        L.append(
            f"- {stack}: verify={info.get('verify') or 'ok'}, startup_s={info.get('startup_s')}, "
            f"stop_s={info.get('stop_s')}"
        )
    path.write_text("\n".join(L) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of wrk per route before measuring"
    )
    ap.add_argument("--stacks", default="", help="comma-separated subset of stack names")
    ap.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--raw-seconds", type=float, default=3.0)
    ap.add_argument("--out", default=str(RESULTS / "http_stack.json"))
    ap.add_argument(
        "--md-only", action="store_true", help="regenerate the .md from an existing --out json"
    )
    a = ap.parse_args()
    if a.md_only:
        write_md(json.loads(Path(a.out).read_text()), Path(a.out).with_suffix(".md"))
        return
    if a.raw:
        raw_main(a.raw_seconds)
        return
    if not shutil.which("wrk"):
        sys.exit("wrk not found: apt-get install -y wrk")
    os.sched_setaffinity(0, {int(LOADGEN_CPU)})  # keep the driver itself off the server core

    t_start = time.time()
    doc: dict = {
        "machine": machine_info(),
        "versions": versions(),
        "config": {
            "rounds": a.rounds,
            "duration_s": a.duration,
            "warmup_s": a.warmup,
            "concurrency": CONCURRENCY,
            "wrk_threads": 1,
            "identity_tensor_bytes": 65536,
        },
    }
    print("raw in-process ...", flush=True)
    doc["raw_in_process"] = measure_raw(a.raw_seconds)
    print(doc["raw_in_process"], flush=True)
    print("embed checks ...", flush=True)
    doc["embed_check"] = embed_checks()
    print(doc["embed_check"], flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="httpbench-"))
    lua = write_lua(tmp)
    names = list(stacks(0))
    if a.stacks:
        names = [n for n in names if n in a.stacks.split(",")]
    results = {n: {r: {str(c): [] for c in CONCURRENCY} for r in ROUTES} for n in names}
    info: dict = {n: {"startup_s": [], "stop_s": []} for n in names}
    live: Server | None = None
    try:
        for rnd in range(a.rounds):
            for name in names:
                port = free_port()
                live = Server(name, stacks(port)[name], port)
                try:
                    info[name]["startup_s"].append(round(live.start(), 3))
                except RuntimeError as e:
                    print(f"[round {rnd}] {name}: START FAILED {e}", flush=True)
                    info[name]["error"] = str(e)
                    live = None
                    continue
                bad = verify(port)
                info[name].setdefault("verify", bad)
                for route in ROUTES:  # warm-up
                    run_wrk(port, route, lua[route], 8, a.warmup)
                for route in ROUTES:
                    for conc in CONCURRENCY:
                        r = run_wrk(port, route, lua[route], conc, a.duration)
                        r["round"] = rnd
                        results[name][route][str(conc)].append(r)
                        print(
                            f"[round {rnd}] {name:34s} {route:8s} c={conc:<3d} "
                            f"rps={r.get('rps', 'ERR'):>9} p50={r.get('p50_ms', '-')} "
                            f"p99={r.get('p99_ms', '-')} err={r.get('errors', r.get('error'))}",
                            flush=True,
                        )
                        time.sleep(0.2)
                info[name]["stop_s"].append(round(live.stop(), 3))
                live = None
    finally:
        if live is not None:
            live.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    doc["machine"]["loadavg_end"] = os.getloadavg()
    doc["stack_commands"] = {
        n: " ".join(["taskset", "-c", SERVER_CPU, *stacks(8000)[n]]) for n in names
    }
    doc["stack_info"] = info
    doc["summary"] = summarize(results)
    doc["wall_s"] = round(time.time() - t_start, 1)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    write_md(doc, out.with_suffix(".md"))
    print(f"wrote {out} and {out.with_suffix('.md')} in {doc['wall_s']} s", flush=True)


if __name__ == "__main__":
    main()
