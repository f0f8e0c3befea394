"""The GPU benchmark's bucket readings and runs (``benchmarks/gpu/``): executions by batch size
over a window from two statistics answers, what padding them up to the CUDA graph buckets costs
(the figure that says whether finer buckets would pay), and bucket variants as server runs over
one export (the A/B that decides it)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parents[2] / "benchmarks" / "gpu"


def load(name: str) -> Any:
    # The GPU bench's modules import their siblings by name, and benchkit from benchmarks/.
    for folder in (HERE, HERE.parent):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(f"gpu_bench_{name}", HERE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def stats_document(batches: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """A statistics-extension answer whose only news is ``batch_stats``."""
    return {
        "model_stats": [
            {
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": {"count": count, "ns": 0},
                        "compute_infer": {"count": count, "ns": ns},
                        "compute_output": {"count": count, "ns": 0},
                    }
                    for size, (count, ns) in batches.items()
                ]
            }
        ]
    }


def test_the_window_counts_only_its_own_executions() -> None:
    readings = load("readings")
    before = readings.batch_counters(stats_document({1: (5, 5_000_000), 32: (10, 80_000_000)}))
    after = readings.batch_counters(
        stats_document({1: (5, 5_000_000), 32: (14, 120_000_000), 36: (2, 18_000_000)})
    )
    delta = readings.batch_delta(before, after)
    # Size 1 ran nothing in the window; 32 ran 4 more (10 ms each), 36 appeared (9 ms each).
    assert delta == {
        "batch_sizes": {"32": 4, "36": 2},
        "compute_infer_us_by_batch": {"32": 10_000.0, "36": 9_000.0},
    }


@pytest.mark.parametrize(
    ("sizes", "buckets", "padded"),
    [
        ({"32": 4}, [1, 2, 4, 8, 16, 32, 64], 0.0),  # every batch fills its graph
        ({"33": 1}, [1, 2, 4, 8, 16, 32, 64], 48.4),  # 33 rows replay the 64-row graph
        ({"34": 3, "40": 1}, [32, 40, 48], 11.2),  # 3 x 6 padded of 4 x 40 run
        ({"200": 2}, [8, 128], 0.0),  # past the largest bucket: eager, unpadded
    ],
)
def test_padding_is_the_share_of_graph_rows_that_were_not_requests(
    sizes: dict[str, int], buckets: list[int], padded: float
) -> None:
    readings = load("readings")
    assert readings.padding(sizes, buckets) == {"padded_rows_pct": padded}


def test_no_padding_figure_without_graphs_or_batches() -> None:
    readings = load("readings")
    assert readings.padding({"8": 3}, []) is None
    assert readings.padding({}, [8, 16]) is None


def test_the_report_lists_the_common_sizes_and_the_padding() -> None:
    tables = load("report_tables")
    point = {
        "protocol": "pa_grpc_shm",
        "concurrency": 256,
        "items_per_s": 100.0,
        "batch_sizes": {"34": 30, "40": 10, "2": 1},
        "compute_infer_us_by_batch": {"34": 10_300.0, "40": 10_900.0, "2": 1_500.0},
        "padded_rows_pct": 11.2,
    }
    entry = {"servers": {"infermux": {"points": [point, {**point, "concurrency": 64}]}}}
    (line,) = tables.batches(entry, 256)
    assert "41 executions" in line
    assert "2 x1 (1,500 µs), 34 x30 (10,300 µs), 40 x10 (10,900 µs)" in line
    assert "graph padding 11.2% of the rows run" in line


def test_the_report_names_each_runs_graph_buckets() -> None:
    tables = load("report_tables")
    entry = {
        "servers": {
            "infermux-g0": {"graph_buckets": [1, 2, 4, 8], "points": []},
            "infermux-g1": {"graph_buckets": [], "points": []},  # eager: nothing to name
            "litserve": {"points": []},
        }
    }
    assert tables.batches(entry, 256) == ["- infermux-g0: CUDA graph buckets 1, 2, 4, 8."]


def test_graph_variants_share_one_export_and_rewrite_only_the_graph_line() -> None:
    specs = load("specs")
    text = 'name: "m"\nmax_batch_size: 8\noptimization { cuda { graphs: true } }\n'
    pinned = specs.with_graphs(text, (1, 4, 8))
    assert pinned == (
        'name: "m"\nmax_batch_size: 8\n'
        "optimization { cuda { graphs: true graph_spec [ "
        "{ batch_size: 1 }, { batch_size: 4 }, { batch_size: 8 } ] } }\n"
    )
    assert specs.with_graphs(pinned, ()) == text  # 'default': infermux's own buckets again


def test_server_runs_cross_front_end_counts_with_bucket_variants() -> None:
    run = load("run")
    args = run.argparse.Namespace(
        servers=["infermux", "litserve"],
        frontends=[4, 8],
        graph_variants=run.graph_variants("default/1,2,4,8"),
    )
    assert run.server_runs(args) == [
        ("infermux-f4-g0", "infermux", 4, ()),
        ("infermux-f4-g1", "infermux", 4, (1, 2, 4, 8)),
        ("infermux-f8-g0", "infermux", 8, ()),
        ("infermux-f8-g1", "infermux", 8, (1, 2, 4, 8)),
        ("litserve", "litserve", 1, None),
    ]
    args.frontends, args.graph_variants = [12], []
    assert run.server_runs(args)[0] == ("infermux", "infermux", 12, None)


@contextlib.contextmanager
def signalled_worker(script: str, env: dict[str, str]) -> Iterator[int]:
    """A Python process running ``script`` (which prints "ready" once it may be signalled) with
    ``env`` added to its environment: its pid, until the block ends and it is killed."""
    import os
    import subprocess

    child = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, **env}, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        yield child.pid
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_the_cprofile_hook_profiles_a_process_between_the_two_signals(tmp_path: Path) -> None:
    # run.py --profile-cprofile: every process of the server imports the hook's sitecustomize;
    # SIGUSR1 starts a profile of its main thread, SIGUSR2 writes it; summary() reads it.
    import time

    cprofiling = load("cprofiling")
    script = (
        "import sys, time\n"
        "def spin_between_signals():\n"
        "    return sum(range(1000))\n"
        "print('ready', flush=True)\n"
        "end = time.monotonic() + 30\n"
        "while time.monotonic() < end:\n"
        "    spin_between_signals()\n"
    )
    with signalled_worker(script, cprofiling.server_env(tmp_path / "dumps")) as pid:
        cprofiling.start([pid])
        time.sleep(0.5)
        cprofiling.stop([pid])
        text = cprofiling.summary(tmp_path / "dumps", [pid], "a worker")
    assert f"pid {pid}, by tottime" in text
    assert "spin_between_signals" in text
    missing = cprofiling.summary(tmp_path / "dumps", [pid + 1_000_000], "x", wait_s=0.1)
    assert "no dump" in missing


def gpu_event(stream: int, start: float, dur: float, cat: str = "kernel", name: str = "k") -> Any:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": start,
        "dur": dur,
        "args": {"stream": stream},
    }


def test_the_gpu_trace_says_how_long_streams_overlapped_and_idled() -> None:
    # Stream 7 busy 0-40 and 60-100 (one kernel overlapping another), stream 8 busy 20-80 with a
    # host-to-device copy; a CPU event and an instant event are not the GPU's.
    gputrace = load("gputrace")
    events = [
        gpu_event(7, 0, 30),
        gpu_event(7, 10, 30),
        gpu_event(7, 60, 40),
        gpu_event(8, 20, 10, "gpu_memcpy", "Memcpy HtoD (Pinned -> Device)"),
        gpu_event(8, 30, 50),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": -50, "dur": 500},
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 500},
    ]
    figures = gputrace.analyze(events)
    assert figures["gpu_events"] == 5
    assert figures["span_us"] == 100
    seven, eight = figures["streams"]
    assert (seven["stream"], seven["busy_pct"], seven["kernels"], seven["gaps"]) == (7, 80, 3, 1)
    assert (seven["gap_p50_us"], seven["gaps_pct"]) == (20, 20)
    assert (eight["stream"], eight["busy_pct"], eight["kernels"], eight["gaps"]) == (8, 60, 1, 0)
    # 0-20 one stream, 20-40 two, 40-60 one, 60-80 two, 80-100 one: never idle.
    assert figures["busy_at_once_pct"] == {1: 60, 2: 40}
    assert figures["any_busy_pct"] == 100
    assert figures["copies_pct"] == {"HtoD": 10}
    text = gputrace.render(figures, "pid 1")
    assert "any stream busy 100.0%" in text
    assert "1: 60.0%, 2: 40.0%" in text
    assert (
        gputrace.render(gputrace.analyze(events[-2:]), "x") == "## x: no GPU activity in the trace"
    )


def test_the_gpu_trace_hook_records_between_the_signals_on_an_event_loop(tmp_path: Path) -> None:
    # run.py --profile-gpu-trace: SIGUSR1 starts torch's profiler on the process's loop thread
    # (CPU activity where there is no GPU), stops it after INFERMUX_BENCH_GPU_TRACE_SECONDS,
    # and SIGUSR2 writes the trace, which summary() reads.
    import time

    pytest.importorskip("torch")
    gputrace = load("gputrace")
    script = (
        "import asyncio, torch\n"
        "async def main():\n"
        "    x = torch.ones(64, 64)\n"
        "    print('ready', flush=True)\n"
        "    for _ in range(3000):\n"
        "        x = torch.mm(x, x).clamp(max=1.0)\n"
        "        await asyncio.sleep(0.01)\n"
        "asyncio.run(main())\n"
    )
    env = {
        **gputrace.server_env(tmp_path / "traces"),
        "INFERMUX_BENCH_GPU_TRACE_SECONDS": "0.3",
    }
    with signalled_worker(script, env) as pid:
        gputrace.start([pid])
        time.sleep(1.0)  # past the timed stop
        gputrace.stop([pid])
        text = gputrace.summary(tmp_path / "traces", [pid], "a worker", wait_s=30)
    trace = tmp_path / "traces" / f"gputrace-{pid}.json"
    assert "aten::mm" in trace.read_text()  # CPU activity: this machine has no GPU
    assert f"pid {pid}: no GPU activity" in text
    missing = gputrace.summary(tmp_path / "traces", [pid + 1_000_000], "x", wait_s=0.1)
    assert "no trace" in missing


def test_perf_analyzer_runs_with_the_environment_it_is_given(tmp_path: Path) -> None:
    """``--pa-grpc-channel-share`` works through perf_analyzer's environment: the variable must
    reach the process (it did not: the H200 run meant to give each thread its own connection
    kept perf_analyzer's default, 43 connections at c=256)."""
    perfanalyzer = load("perfanalyzer")
    stand_in = tmp_path / "perf_analyzer"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import os\n"
        'print("share", os.environ.get("TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT"))\n'
        'print("path set", bool(os.environ.get("PATH")))\n'
    )
    stand_in.chmod(0o755)
    log = tmp_path / "pa.log"
    argv = [str(stand_in), "-f", str(tmp_path / "pa.csv")]
    env = {"TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": "1"}
    perfanalyzer.run(argv, log, warmup=0.01, timeout=30, env=env)
    assert "share 1" in log.read_text()
    assert "path set True" in log.read_text()  # added to the environment, not instead of it


def test_each_point_is_set_beside_the_raw_model_at_the_batch_it_served() -> None:
    tables = load("report_tables")
    curve = {"16": 12_000.0, "32": 16_000.0, "64": 17_000.0}
    assert tables.curve_at(curve, 24) == 14_000.0
    assert tables.curve_at(curve, 16) == 12_000.0
    assert tables.curve_at(curve, 64) == 17_000.0
    assert tables.curve_at(curve, 8) is None  # below what was measured: not extrapolated
    assert tables.curve_at(curve, 100) is None
    served = {"protocol": "pa_grpc_shm", "concurrency": 256, "items_per_s": 12_600.0}
    entry = {
        "servers": {
            "infermux": {"points": [{**served, "avg_batch": 24.0}, {**served, "avg_batch": 4.0}]},
            "litserve": {"points": [{**served, "avg_batch": 24.0}]},
        }
    }
    (line,) = tables.at_served_batch(entry, curve)
    assert line.startswith("- infermux pa_grpc_shm c=256: 12,600 items/s")
    assert "average batch of 24.0" in line
    assert "14,000 items/s: **0.90x**" in line


@contextlib.contextmanager
def floor_server(kind: str) -> Iterator[int]:
    """benchmarks/gpu/c1_floor.py's bare ``kind`` server on a free port, until the block ends."""
    import subprocess

    load("perfanalyzer")  # puts benchmarks/ (benchkit) on the path
    benchkit: Any = importlib.import_module("benchkit")
    port = benchkit.free_port()
    server = subprocess.Popen(
        [sys.executable, str(HERE / "c1_floor.py"), "--serve", kind, str(port), "4", "0", "spin"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None
        assert "ready" in server.stdout.readline()
        yield port
    finally:
        benchkit.stop_group(server)
        assert server.stdout is not None
        server.stdout.close()


def test_the_c1_floor_server_speaks_enough_kserve_for_perf_analyzer() -> None:
    """The bare gRPC floor server: metadata, config and an inference that echoes its input,
    over tritonclient's gRPC client (perf_analyzer asks for the same)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    with floor_server("aio") as port:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.get_model_metadata("floor").inputs[0].name == "INPUT0"
        assert client.get_model_config("floor").config.max_batch_size == 8
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        infer_input = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        infer_input.set_data_from_numpy(x)
        result = client.infer("floor", [infer_input])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
        client.close()


def test_the_c1_floor_http_server_speaks_enough_kserve_for_perf_analyzer() -> None:
    """The bare HTTP floor server: health, metadata, config, and an inference with a binary
    input (as perf_analyzer sends) answered with a binary output, over tritonclient's HTTP
    client."""
    import numpy as np
    import tritonclient.http as httpclient

    with floor_server("http") as port:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_ready()
        assert client.is_model_ready("floor")
        assert client.get_model_metadata("floor")["inputs"][0]["name"] == "INPUT0"
        assert client.get_model_config("floor")["max_batch_size"] == 8
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        for binary in (True, False):
            infer_input = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            infer_input.set_data_from_numpy(x, binary_data=binary)
            result = client.infer("floor", [infer_input], request_id="r1")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
            assert result.get_response()["id"] == "r1"
        client.close()


def test_the_c1_floor_runs_each_server_over_the_protocols_it_speaks() -> None:
    c1_floor = load("c1_floor")
    args = c1_floor.argparse.Namespace(
        protocols="pa_grpc,pa_http",
        servers="aio,http,infermux-f1",
        work_us="0,900",
        waits="spin,sleep",
    )
    assert c1_floor.points(args) == [
        ("pa_grpc", "aio", 0, "spin"),
        ("pa_grpc", "aio", 900, "spin"),
        ("pa_grpc", "aio", 900, "sleep"),
        ("pa_grpc", "infermux-f1", 0, "spin"),
        ("pa_grpc", "infermux-f1", 900, "spin"),
        ("pa_http", "http", 0, "spin"),
        ("pa_http", "http", 900, "spin"),
        ("pa_http", "http", 900, "sleep"),
        ("pa_http", "infermux-f1", 0, "spin"),
        ("pa_http", "infermux-f1", 900, "spin"),
    ]


def test_a_run_lets_the_warm_up_register_two_regions_per_slot_at_its_top_concurrency() -> None:
    # Every c=256 warm-up over gRPC + shm failed with "256 regions are registered" (infermux's
    # default limit) and so verified no answer: the bench now raises the limit to fit.
    run = load("run")
    clients = load("clients")
    assert clients.SharedRegions.PER_SLOT == 2
    assert run.shm_regions([1, 16, 64, 256]) >= 2 * 256
    assert run.shm_regions([1, 16]) == 256  # never below the server's default


def test_a_refused_registration_leaves_no_region_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    import tritonclient.grpc as grpcclient

    clients, specs = load("clients"), load("specs")

    class Refusing:
        """A server that takes three registrations, then refuses (its region limit)."""

        def __init__(self, url: str) -> None:
            self.registered: list[str] = []

        def register_system_shared_memory(self, name: str, key: str, size: int) -> None:
            if len(self.registered) == 3:
                raise RuntimeError("256 regions are registered")
            self.registered.append(name)

        def unregister_system_shared_memory(self, name: str) -> None:
            self.registered.remove(name)

    monkeypatch.setattr(grpcclient, "InferenceServerClient", Refusing)
    spec = specs.model_spec("resnet50", True)
    target = clients.Target("grpc_shm", "resnet50", True, str(tmp_path), grpc_target="x:1")
    regions = clients.SharedRegions(target, spec, specs.reference_inputs(spec))
    prefix = f"{clients.SHM_PREFIX}_{os.getpid()}_"
    with pytest.raises(RuntimeError, match="256 regions"):
        regions.create(4)
    assert regions._client.registered == []
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]


def test_a_perf_analyzer_that_outlasts_its_time_keeps_its_last_pass(tmp_path: Path) -> None:
    """At c=256 on the H200 perf_analyzer ran two passes over gRPC and over HTTP without a stable
    window and was stopped at the point's time limit: the point was lost. Its last pass is kept,
    marked unstable, as when perf_analyzer itself gives up (rc 2)."""
    perfanalyzer = load("perfanalyzer")
    stand_in = tmp_path / "perf_analyzer"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import time\n"
        'print("Pass [1] throughput: 9629.66 infer/sec. Avg latency: 26247 usec (std 10 usec)")\n'
        'print("Pass [2] throughput: 9724.4 infer/sec. Avg latency: 26152 usec (std 11 usec)",'
        " flush=True)\n"
        "time.sleep(60)\n"
    )
    stand_in.chmod(0o755)
    argv = [str(stand_in), "-f", str(tmp_path / "pa.csv")]
    result = perfanalyzer.run(argv, tmp_path / "pa.log", warmup=0.01, timeout=1.5)
    assert result["pa_rc"] is None
    assert result["items_per_s"] == 9724.4
    assert result["mean_ms"] == 26.152
    assert result["unstable"] is True
    assert "error" not in result
    assert result["pa_note"].startswith("perf_analyzer timed out")


def test_the_gpu_work_of_the_batches_served_splits_feeding_from_batch_sizes() -> None:
    tables = load("report_tables")
    # Rows cost 50 µs each plus 0.2 ms per batch: 16 rows -> 1.0 ms, 32 -> 1.8, 128 -> 6.6.
    curve = {"16": 16 / 1.0e-3, "32": 32 / 1.8e-3}
    per_batch, per_row = tables.batch_cost(curve, (128, 128 / 6.6e-3))
    assert per_batch == pytest.approx(0.2e-3)
    assert per_row == pytest.approx(50e-6)
    assert tables.batch_cost({"16": 16_000.0}, None) is None  # one size: no line to fit
    raw = {
        "max_batch": 128,
        "ceiling_items_per_s": 128 / 6.6e-3,
        "graph": {"batch_curve": curve, "multi_stream_items_per_s": 128 / 6.6e-3},
    }
    # 1,000 batches of 30 rows, run padded to the 32-row graph: 1.8 s of GPU work in 3 s.
    point = {
        "protocol": "pa_grpc_shm",
        "concurrency": 256,
        "items_per_s": 9_000.0,
        "server_window_s": 3.0,
        "batch_sizes": {"30": 1000},
        "gpu_util_mean": 70.0,
    }
    entry = {"servers": {"infermux": {"graph_buckets": [16, 32, 128], "points": [point]}}}
    cost, line = tables.gpu_work(entry, raw, 256)
    assert "0.200 ms + 50.0 µs x b" in cost
    assert "needed the GPU **60%** of the window (NVML: 70%)" in line
    assert "this batch mix gives 16,667 items/s" in line  # 30,000 rows in 1.8 s
    assert tables.gpu_work(entry, raw, 64) == [cost]  # no point at that concurrency


def test_the_report_names_the_tuning_hooks_variables_of_a_variant() -> None:
    # A variants run (issue24_steps.sh) differs only by these: its result must say which it was.
    import json

    report = load("report")
    result = Path(__file__).parents[2] / "benchmarks" / "results" / "gpu" / "issue24"
    doc = json.loads(
        (result / "exread-variants-c6ef981" / "var-head" / "gpu_bench.json").read_text()
    )
    assert not any("Tuning hook" in line for line in report.render(doc))
    doc["tuning"] = {"INFERMUX_BENCH_FRONTEND_SHM": "0"}
    lines = report.render(doc)
    named = [line for line in lines if "Tuning hook" in line]
    assert named == [
        "- Tuning hook (a benchmark aid, not server settings): `INFERMUX_BENCH_FRONTEND_SHM=0`."
    ]
    assert lines.index(named[0]) < next(
        i for i, line in enumerate(lines) if line.startswith("- Wall")
    )


def test_ab_summary_sums_the_front_ends_timings(tmp_path: Path) -> None:
    summary = load("ab_summary")
    assert summary.frontend_timing(tmp_path) is None
    timing = tmp_path / "fe-timing"
    timing.mkdir()
    for pid, calls in ((1, 1000), (2, 3000)):
        sums = {"calls": calls, "handler_ns": calls * 900_000, "executor_ns": calls * 600_000}
        sums |= {"holds": calls // 4, "hold_ns": calls // 4 * 1_500_000}
        (timing / f"fe-{pid}.json").write_text(json.dumps(sums))
    line = summary.frontend_timing(tmp_path)
    assert line == (
        "front ends (2, 4,000 calls): handler 900 µs per call, of which the executor call 600 "
        "and the handler's own work 300; 1,000 micro-batches held 1,500 µs each"
    )


def test_ab_summary_sets_the_executors_residence_beside_the_front_ends(tmp_path: Path) -> None:
    summary = load("ab_summary")
    timing = tmp_path / "fe-timing"
    timing.mkdir()
    front = {"calls": 100, "handler_ns": 100 * 900_000, "executor_ns": 100 * 600_000}
    front |= {"holds": 0, "hold_ns": 0, "lag_probes": 4, "lag_ns": 400_000, "lag_max_ns": 250_000}
    (timing / "fe-7.json").write_text(json.dumps(front))
    inside = {"frames": 25, "requests": 100, "start_wait_ns": 100 * 20_000}
    inside |= {"residence_ns": 100 * 450_000, "lag_probes": 2, "lag_ns": 60_000}
    inside |= {"lag_max_ns": 40_000}
    (timing / "ex-9.json").write_text(json.dumps(inside))
    lines = summary.frontend_timing(tmp_path).splitlines()
    assert lines[0].endswith(
        "; a callback waited 100 µs on average (at most 250, 4 probes) in the front ends' loops"
    )
    assert lines[1] == (
        "executor (25 frames, 100 requests): 450 µs per request from its frame's dispatch to its "
        "answer's send (waiting to start 20); the executor call's rest, ring hops and the "
        "answers' wake-ups with the hold: 150 µs; a callback waited 30 µs on average (at most "
        "40, 2 probes) in the executor's loop"
    )


def test_ab_summary_leaves_the_first_pass_out_of_the_steady_figure() -> None:
    summary = load("ab_summary")
    passes = [{"items_per_s": 50.0}, {"items_per_s": 90.0}, {"items_per_s": 110.0}]
    point = {
        "protocol": "pa_grpc_shm",
        "concurrency": 256,
        "items_per_s": 83.4,
        "pa_passes": passes,
        "batch_sizes": {"2": 3, "63": 1, "64": 4, "128": 2},
        "avg_batch": 40.0,
        "pa_client_send_us": 6.0,
        "pa_network_server_us": 9279.0,
        "pa_client_recv_us": 1.0,
    }
    doc = {
        "models": {
            "m": {
                "raw": {"ceiling_items_per_s": 200.0, "max_batch": 128},
                "servers": {"infermux-b2": {"points": [point]}},
            }
        }
    }
    [row] = summary.rows(doc)
    assert row[1:4] == ["infermux-b2", "pa_grpc_shm c=256", "83 (0.417x)"]
    assert row[4] == "100 (0.500x)"  # passes 2 and 3 only
    assert row[7] == "40%"  # 2 and 63 rows are below half of 128
    assert row[10] == "9.3 (1)"  # 9.286 ms x 83.4 requests/s: Little's law
    assert summary.outside({"items_per_s": 1.0}) == "-"
    assert summary.steady(passes[:1]) is None
