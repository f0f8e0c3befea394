"""The example Grafana dashboard and Prometheus config in deploy/: the dashboard imports (unique
panel ids, a data source and queries on every panel) and asks only for metrics infermux exposes,
so renaming a metric fails here; Prometheus scrapes the metrics port at /metrics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import ProcessCollector

from infermux.observability.metrics import names
from infermux.settings import ServerSettings

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "infermux-dashboard.json"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
METRIC = re.compile(r"\b(nv_|infermux_|process_)[a-z0-9_]+")
RANGE = re.compile(r"\[([^\]]*)\]")


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return dashboard


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def data_panels() -> list[dict[str, Any]]:
    return [p for p in all_panels(load_dashboard()["panels"]) if p["type"] != "row"]


def exprs() -> list[str]:
    return [target["expr"] for panel in data_panels() for target in panel["targets"]]


def variable_queries() -> list[str]:
    variables = load_dashboard()["templating"]["list"]
    return [v["query"] for v in variables if v["type"] == "query"]


def process_metrics() -> set[str]:
    """Series names prometheus-client's process collector produces on this platform."""
    collector = ProcessCollector(registry=None)
    return {sample.name for family in collector.collect() for sample in family.samples}


def test_dashboard_is_importable() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] == 39
    assert dashboard["id"] is None
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for name in ("model", "version"):
        assert variables[name]["multi"] is True
        assert variables[name]["includeAll"] is True
        assert variables[name]["datasource"]["uid"] == "${DS_PROMETHEUS}"
    assert variables["model"]["query"].startswith("label_values(nv_inference_request_success")
    assert variables["model"]["query"].endswith(", model)")


def test_every_panel_has_a_unique_id_a_data_source_and_a_query() -> None:
    panels = list(all_panels(load_dashboard()["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), ids
    data = data_panels()
    assert len(data) >= 15
    for panel in data:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys(), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit") or panel["type"] == "heatmap"
    refs = [[t["refId"] for t in panel["targets"]] for panel in data]
    assert all(len(r) == len(set(r)) for r in refs), refs


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in all_panels(load_dashboard()["panels"]):
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, (panel["title"], cells[(x, y)])
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("expr", [*exprs(), *variable_queries()])
def test_queries_use_declared_metrics(expr: str) -> None:
    referenced = {match.group(0) for match in METRIC.finditer(expr)}
    assert referenced, expr
    known = names() | process_metrics()
    assert referenced <= known, f"not exposed by infermux: {sorted(referenced - known)}"


def test_dashboard_covers_the_main_metrics() -> None:
    referenced = {m.group(0) for expr in exprs() for m in METRIC.finditer(expr)}
    wanted = {
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_pending_request_count",
        "infermux_requests_in_flight",
        "infermux_request_duration_seconds_bucket",
        "infermux_queue_duration_seconds_bucket",
        "infermux_compute_duration_seconds_bucket",
        "infermux_batch_size_bucket",
        "infermux_instance_busy_seconds_total",
        "infermux_model_memory_bytes",
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_power_usage",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    }
    assert wanted <= referenced, sorted(wanted - referenced)


def test_rates_use_the_rate_interval() -> None:
    for expr in exprs():
        assert set(RANGE.findall(expr)) <= {"$__rate_interval"}, expr


def test_prometheus_scrapes_the_metrics_port() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    job = jobs["infermux"]
    assert job["scrape_interval"] == "5s"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets == [f"localhost:{ServerSettings().metrics_port}"]
    assert ServerSettings().metrics_port == 8002
