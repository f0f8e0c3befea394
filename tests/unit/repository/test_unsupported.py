"""Config fields infermux does not support yet fail the load, naming the field, instead of being
ignored (``check_supported``, applied by ``load_model_config``); unknown platforms and backends
fail the whole model with a reason naming the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infermux.backends import BackendRegistry
from infermux.errors import ConfigError
from infermux.repository import ControlMode, ModelRepository
from infermux.repository.config_file import load_model_config
from tests.support import write_model

HEAD = """
name: "m"
backend: "python"
max_batch_size: 8
"""
INPUT = 'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] %s } ]\n'
OUTPUT = 'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] %s } ]\n'
PLAIN = HEAD + INPUT % "" + OUTPUT % ""

REFUSED = {
    "sequence_batching": PLAIN + "sequence_batching { }",
    "response_cache": PLAIN + "response_cache { enable: true }",
    "instance_group[1].rate_limiter": PLAIN
    + "instance_group [ { kind: KIND_CPU }, { kind: KIND_CPU rate_limiter { priority: 2 } } ]",
    "instance_group[0].passive": PLAIN + "instance_group [ { kind: KIND_CPU passive: true } ]",
    "ensemble_scheduling": PLAIN
    + 'ensemble_scheduling { step [ { model_name: "x" model_version: -1 } ] }',
    "input[0].allow_ragged_batch": HEAD + INPUT % "allow_ragged_batch: true" + OUTPUT % "",
    "output[0].is_shape_tensor": HEAD + INPUT % "" + OUTPUT % "is_shape_tensor: true",
    "batch_input": PLAIN
    + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 '
    'source_input: "INPUT0" } ]',
    "batch_output": PLAIN
    + 'batch_output [ { target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
    'source_input: "INPUT0" } ]',
    "model_repository_agents": PLAIN
    + 'model_repository_agents { agents [ { name: "checksum" } ] }',
}

# The same fields set to what they mean when absent, and fields that only describe: accepted.
ACCEPTED = [
    PLAIN + "model_transaction_policy { decoupled: false }",
    # Refused at load by backends that do not answer decoupled (tests/unit/repository/
    # test_decoupled_load.py), not by the config.
    PLAIN + "model_transaction_policy { decoupled: true }",
    PLAIN + "response_cache { enable: false }",
    HEAD + INPUT % "allow_ragged_batch: false" + OUTPUT % 'label_filename: "labels.txt"',
    PLAIN + 'metric_tags { key: "team" value: "a" }',
]


def model_dir(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m"
    path.mkdir(exist_ok=True)
    (path / "config.pbtxt").write_text(text)
    return path


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_an_unsupported_field_is_refused_naming_it(tmp_path: Path, field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{field} is not supported yet")) as caught:
        load_model_config(model_dir(tmp_path, REFUSED[field]))
    assert caught.value.field == field


def test_the_ensemble_platform_is_refused_without_its_block(tmp_path: Path) -> None:
    text = PLAIN.replace('backend: "python"', 'platform: "ensemble"')
    with pytest.raises(ConfigError, match="ensemble_scheduling is not supported yet"):
        load_model_config(model_dir(tmp_path, text))


@pytest.mark.parametrize("text", ACCEPTED)
def test_fields_that_change_nothing_are_accepted(tmp_path: Path, text: str) -> None:
    assert load_model_config(model_dir(tmp_path, text)).name == "m"


def test_a_config_override_is_checked_too(tmp_path: Path) -> None:
    override = '{"backend": "python", "sequence_batching": {}}'
    with pytest.raises(ConfigError, match="sequence_batching is not supported yet"):
        load_model_config(model_dir(tmp_path, PLAIN), override)


async def test_the_index_and_the_failure_count_say_why(tmp_path: Path) -> None:
    write_model(tmp_path, "seq", extra="sequence_batching { }")
    write_model(tmp_path, "ok")
    (tmp_path / "tf").mkdir()
    (tmp_path / "tf" / "config.pbtxt").write_text(
        (tmp_path / "ok" / "config.pbtxt")
        .read_text()
        .replace('name: "ok"', 'name: "tf"')
        .replace('backend: "python"', 'platform: "tensorflow_graphdef"')
    )
    (tmp_path / "tf" / "1").mkdir()
    mixed = (tmp_path / "ok" / "config.pbtxt").read_text().replace('name: "ok"', 'name: "mixed"')
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "config.pbtxt").write_text(
        mixed.replace('backend: "python"', 'backend: "python"\nplatform: "onnxruntime_onnx"')
    )
    repository = ModelRepository([tmp_path], BackendRegistry(), control_mode=ControlMode.NONE)
    await repository.start()
    rows = {r.name: r for r in repository.index()}
    assert (rows["ok"].version, rows["ok"].state) == ("1", "READY")
    assert (rows["seq"].version, rows["seq"].state) == ("", "UNAVAILABLE")
    assert "sequence_batching is not supported yet" in rows["seq"].reason
    assert rows["tf"].state == "UNAVAILABLE"
    assert "platform 'tensorflow_graphdef' is not supported" in rows["tf"].reason
    assert rows["mixed"].state == "UNAVAILABLE"
    assert "platform 'onnxruntime_onnx' is not supported with backend 'python'" in (
        rows["mixed"].reason
    )
    failures = repository.load_failures()
    assert (failures["seq"], failures["tf"], failures["mixed"], failures["ok"]) == (1, 1, 1, 0)
    await repository.close()
