"""Reduced precision black-box: ``infermux serve`` loads an ONNX model at int8, calibrating it
once; a restarted server reuses the calibration cache (its metric says ``hit``); the guard's
figures are exported; a bad precision setting leaves only that model unavailable, naming it."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.support import ServerProcess, parameter, start_server

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from tests.onnx_models import CLASSIFIER_CONFIG, WIDTH, classifier, write_onnx_model  # noqa: E402

pytestmark = pytest.mark.e2e


def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    int8 = parameter("precision", "int8") + parameter("calibration_data", "cal.npz")
    model_dir = write_onnx_model(repo, "q8", classifier(), CLASSIFIER_CONFIG + int8)
    np.savez(model_dir / "cal.npz", X=rows(64, seed=1))
    write_onnx_model(repo, "fp32", classifier(), CLASSIFIER_CONFIG)
    write_onnx_model(repo, "bad", classifier(), CLASSIFIER_CONFIG + parameter("precision", "fp7"))
    return repo


def rows(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, WIDTH)).astype(np.float32)


def samples(server: ServerProcess, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    found = {}
    for metric in text_string_to_metric_families(text):
        for sample in metric.samples:
            if sample.name.removesuffix("_total") == family.removesuffix("_total"):
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def infer(server: ServerProcess, model: str, x: np.ndarray) -> np.ndarray:
    with httpclient.InferenceServerClient(server.url) as client:
        tensor = httpclient.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer(model, [tensor])
        answer = result.as_numpy("Y")
        assert answer is not None
        return np.asarray(answer)


def test_int8_is_calibrated_once_and_a_restart_reuses_the_cache(tmp_path: Path) -> None:
    repo = repository(tmp_path)
    x = rows(6, seed=2)
    cache = repo / "q8" / "1" / ".infermux-cache"
    with start_server("--model-repository", str(repo)) as server:
        with httpclient.InferenceServerClient(server.url) as client:
            index = {m["name"]: m for m in client.get_model_repository_index()}
            assert index["q8"]["state"] == "READY"
            assert index["fp32"]["state"] == "READY"
            assert index["bad"]["state"] == "UNAVAILABLE"
            assert (
                "parameter precision must be one of fp32, fp16, bf16, int8"
                in (index["bad"]["reason"])
            )
        quantised, exact = infer(server, "q8", x), infer(server, "fp32", x)
        error = np.linalg.norm(quantised - exact) / np.linalg.norm(exact)
        assert 0 < error < 0.15
        loads = samples(server, "infermux_calibration_cache_loads_total")
        assert loads == {(("model", "q8"), ("result", "miss"), ("version", "1")): 1}
        errors = samples(server, "infermux_model_precision_error")
        key = (("model", "q8"), ("output", "Y"), ("precision", "int8"), ("version", "1"))
        assert 0 < errors[key] < 0.15
        assert 0.5 < samples(server, "infermux_model_precision_top1_agreement")[key] <= 1
        assert server.stop() == 0
    (entry,) = cache.iterdir()
    meta = json.loads((entry / "meta.json").read_text())

    with start_server("--model-repository", str(repo)) as server:
        loads = samples(server, "infermux_calibration_cache_loads_total")
        assert loads == {(("model", "q8"), ("result", "hit"), ("version", "1")): 1}
        np.testing.assert_array_equal(infer(server, "q8", x), quantised)
        assert server.stop() == 0
    assert [p.name for p in cache.iterdir()] == [entry.name]
    assert json.loads((entry / "meta.json").read_text())["created"] == meta["created"]
