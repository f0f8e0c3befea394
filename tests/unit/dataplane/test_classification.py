"""Triton's classification extension: top-N classes of an output, as Triton's classification.cc
formats them, with labels read at load; through the HTTP app over a real data plane."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.dataplane.classification import classified, wanted_classes
from infermux.errors import InvalidArgumentError, ModelLoadError
from infermux.frontends.http import HttpApp
from infermux.model_config import ModelConfig
from infermux.repository import ControlMode, ModelRepository
from infermux.repository.config_file import parse_config_text
from infermux.repository.loader import read_labels
from infermux.types import Parameters, RequestedOutput, Tensor
from tests.support import write_classifier, write_model


def top(data: np.ndarray, count: int, *, batched: bool, labels: tuple[str, ...] = ()) -> Tensor:
    tensor = Tensor("OUT", "X", data.shape, data)
    (result,) = classified([tensor], {"OUT": count}, batched=batched, labels={"OUT": labels})
    return result


def test_floats_print_six_decimals_per_batch_row_highest_first() -> None:
    result = top(np.array([[0.1, 0.7, 0.2], [3.0, 1.0, 2.0]], np.float32), 2, batched=True)
    assert result.datatype == "BYTES"
    assert result.shape == (2, 2)
    assert result.data.tolist() == [
        [b"0.700000:1", b"0.200000:2"],
        [b"3.000000:0", b"2.000000:2"],
    ]


def test_integers_print_as_they_are_and_labels_follow_where_there_is_one() -> None:
    data = np.array([5, -1, 9, 7], np.int64)
    result = top(data, 3, batched=False, labels=("cat", "dog", "", "eel"))
    assert result.shape == (3,)
    # Index 2 has an empty line: no label, as Triton gives none.
    assert result.data.tolist() == [b"9:2", b"7:3:eel", b"5:0:cat"]
    unsigned = top(np.array([[200, 255]], np.uint8), 1, batched=True, labels=("a",))
    assert unsigned.data.tolist() == [[b"255:1"]]  # beyond the labels: none


def test_a_count_beyond_the_classes_and_ties() -> None:
    result = top(np.array([[1.0, 2.0, 2.0]], np.float64), 10, batched=True)
    assert result.shape == (1, 3)
    assert result.data.tolist() == [[b"2.000000:1", b"2.000000:2", b"1.000000:0"]]
    # A model that does not batch: the whole output, flattened.
    flat = top(np.array([[1, 3], [2, 0]], np.int32), 2, batched=False)
    assert flat.shape == (2,)
    assert flat.data.tolist() == [b"3:1", b"2:2"]


def config(datatype: str = "FP32") -> ModelConfig:
    text = (
        'name: "m" backend: "python" max_batch_size: 4 '
        f'input [ {{ name: "INPUT0", data_type: TYPE_{datatype}, dims: [ -1 ] }} ] '
        f'output [ {{ name: "OUTPUT0", data_type: TYPE_{datatype}, dims: [ -1 ] }} ]'
    )
    return ModelConfig.from_proto(parse_config_text(text, "m"))


def test_wanted_classes_checks_before_anything_runs() -> None:
    assert wanted_classes(config(), [RequestedOutput("OUTPUT0", {"binary_data": True})]) == {}
    assert wanted_classes(config(), [RequestedOutput("OUTPUT0", {"classification": 0})]) == {}
    wanted = wanted_classes(config(), [RequestedOutput("OUTPUT0", {"classification": 3})])
    assert wanted == {"OUTPUT0": 3}
    refusals: list[tuple[ModelConfig, Parameters, str]] = [
        (config(), {"classification": "3"}, "must be an integer"),
        (config(), {"classification": -1}, "must be an integer"),
        (config(), {"classification": True}, "must be an integer"),
        (config("STRING"), {"classification": 2}, "unsupported type 'BYTES'"),
        (config("FP16"), {"classification": 2}, "unsupported type 'FP16'"),
        (
            config(),
            {"classification": 2, "shared_memory_region": "r", "shared_memory_byte_size": 8},
            "shared memory",
        ),
    ]
    for cfg, parameters, fragment in refusals:
        with pytest.raises(InvalidArgumentError, match=fragment):
            wanted_classes(cfg, [RequestedOutput("OUTPUT0", parameters)])


def test_labels_are_read_at_load_and_a_missing_file_fails_it(tmp_path: Path) -> None:
    model_dir = write_classifier(tmp_path, "c", ["cat", "dog"])
    cfg = ModelConfig.from_proto(parse_config_text((model_dir / "config.pbtxt").read_text(), "c"))
    assert read_labels(cfg, model_dir) == {"OUTPUT0": ("cat", "dog")}
    (model_dir / "labels.txt").unlink()
    with pytest.raises(ModelLoadError, match=r"label_filename 'labels\.txt' cannot be read"):
        read_labels(cfg, model_dir)


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    write_classifier(tmp_path, "batched", ["zero", "one", "two"])
    write_classifier(tmp_path, "single", ["zero", "one", "two"], max_batch_size=0)
    write_model(tmp_path, "text", datatype="BYTES")
    repository = ModelRepository(
        [tmp_path], BackendRegistry(), control_mode=ControlMode.EXPLICIT, startup_models=["*"]
    )
    await repository.start()
    transport = httpx.ASGITransport(app=HttpApp(DataPlane(repository, version="test")))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client
    await repository.close()


def body(shape: list[int], data: list[float], **parameters: object) -> dict[str, object]:
    return {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": data}],
        "outputs": [{"name": "OUTPUT0", "parameters": parameters}],
    }


async def test_json_and_binary_answers(http: httpx.AsyncClient) -> None:
    reply = await http.post(
        "/v2/models/batched/infer",
        json=body([2, 3], [0.1, 0.5, 0.4, 0.9, 0.0, 0.3], classification=2),
    )
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    assert output["datatype"] == "BYTES"
    assert output["shape"] == [2, 2]
    assert output["data"] == [
        "0.500000:1:one",
        "0.400000:2:two",
        "0.900000:0:zero",
        "0.300000:2:two",
    ]
    reply = await http.post(
        "/v2/models/single/infer", json=body([3], [1, 3, 2], classification=5, binary_data=True)
    )
    assert reply.status_code == 200, reply.text
    length = int(reply.headers["Inference-Header-Content-Length"])
    (output,) = httpx.Response(200, content=reply.content[:length]).json()["outputs"]
    assert output["shape"] == [3]
    raw, items = reply.content[length:], []
    while raw:
        size = int.from_bytes(raw[:4], "little")
        items.append(raw[4 : 4 + size].decode())
        raw = raw[4 + size :]
    assert items == ["3.000000:1:one", "2.000000:2:two", "1.000000:0:zero"]


async def test_refusals(http: httpx.AsyncClient) -> None:
    text = {
        "inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "data": ["a"]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 1}}],
    }
    reply = await http.post("/v2/models/text/infer", json=text)
    assert reply.status_code == 400
    assert "class result not available for output due to unsupported type 'BYTES'" in reply.text
    reply = await http.post(
        "/v2/models/batched/infer", json=body([1, 3], [1, 2, 3], classification=-2)
    )
    assert reply.status_code == 400
    assert "'classification'" in reply.json()["error"]
