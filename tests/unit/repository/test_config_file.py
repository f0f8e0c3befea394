"""Reading config.pbtxt / config.yaml (``infermux.repository.config_file``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infermux.errors import ConfigError
from infermux.model_config import VersionPolicy
from infermux.repository.config_file import (
    config_path,
    load_model_config,
    parse_config_text,
)

PBTXT = """
name: "simple"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ -1 ] optional: true }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] reshape: { shape: [ 4, 4 ] } } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 4 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  priority_queue_policy { key: 2 value { default_timeout_microseconds: 5000 } }
}
version_policy { specific { versions: [ 1, 3 ] } }
parameters { key: "EXECUTION_ENV_PATH" value { string_value: "/env.tar.gz" } }
"""

YAML = """
name: simple
backend: python
max_batch_size: 8
input:
  - name: INPUT0
    data_type: TYPE_INT32
    dims: [16]
  - name: INPUT1
    data_type: TYPE_STRING
    dims: [-1]
    optional: true
output:
  - name: OUTPUT0
    data_type: TYPE_FP32
    dims: [16]
    reshape: {shape: [4, 4]}
instance_group:
  - count: 2
    kind: KIND_CPU
dynamic_batching:
  preferred_batch_size: [4]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  priority_queue_policy:
    2: {default_timeout_microseconds: 5000}
version_policy:
  specific: {versions: [1, 3]}
parameters:
  EXECUTION_ENV_PATH: {string_value: /env.tar.gz}
"""


def model_dir(tmp_path: Path, files: dict[str, str], name: str = "simple") -> Path:
    path = tmp_path / name
    path.mkdir(parents=True)
    for file, text in files.items():
        (path / file).write_text(text, encoding="utf-8")
    return path


def test_pbtxt_and_yaml_give_equal_configs(tmp_path: Path) -> None:
    from_pbtxt = load_model_config(model_dir(tmp_path / "a", {"config.pbtxt": PBTXT}))
    from_yaml = load_model_config(model_dir(tmp_path / "b", {"config.yaml": YAML}))
    assert from_pbtxt == from_yaml
    assert from_pbtxt.proto == from_yaml.proto
    assert from_pbtxt.to_json_dict() == from_yaml.to_json_dict()
    # And the content is what both files say.
    assert from_yaml.inputs[1].datatype == "BYTES"
    assert from_yaml.inputs[1].optional
    assert from_yaml.outputs[0].reshape == (4, 4)
    assert from_yaml.instance_groups[0].kind == "KIND_CPU"
    assert from_yaml.version_policy == VersionPolicy(kind="specific", versions=(1, 3))
    assert from_yaml.parameters == {"EXECUTION_ENV_PATH": "/env.tar.gz"}
    queue = from_yaml.proto.dynamic_batching.priority_queue_policy[2]
    assert queue.default_timeout_microseconds == 5000


def test_config_yml_is_accepted(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {"config.yml": YAML})
    assert config_path(path) == path / "config.yml"
    assert load_model_config(path).name == "simple"


def test_yaml_accepts_json_camel_case_names_too(tmp_path: Path) -> None:
    # ParseDict takes both spellings; snake_case is what the docs use.
    text = YAML.replace("max_batch_size", "maxBatchSize")
    assert load_model_config(model_dir(tmp_path, {"config.yaml": text})).max_batch_size == 8


def test_config_path_finds_the_pbtxt(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {"config.pbtxt": PBTXT})
    assert config_path(path) == path / "config.pbtxt"


def test_missing_config_names_the_directory(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {})
    (path / "1").mkdir()
    with pytest.raises(ConfigError, match=r"config\.pbtxt") as info:
        load_model_config(path)
    assert info.value.source == str(path)
    assert str(path) in info.value.message
    assert "config.yaml" in info.value.message


def test_config_pbtxt_directory_is_not_a_config(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {})
    (path / "config.pbtxt").mkdir()
    with pytest.raises(ConfigError, match="no config"):
        config_path(path)


@pytest.mark.parametrize("other", ["config.yaml", "config.yml"])
def test_two_config_files_are_an_error(tmp_path: Path, other: str) -> None:
    path = model_dir(tmp_path, {"config.pbtxt": PBTXT, other: YAML})
    with pytest.raises(ConfigError, match="keep exactly one") as info:
        load_model_config(path)
    assert "config.pbtxt" in info.value.message
    assert other in info.value.message
    assert info.value.source == str(path)


@pytest.mark.parametrize(
    ("file", "text"),
    [
        ("config.pbtxt", PBTXT.replace('name: "simple"', 'name: "other"')),
        ("config.yaml", YAML.replace("name: simple", "name: other")),
    ],
)
def test_name_must_match_the_directory(tmp_path: Path, file: str, text: str) -> None:
    path = model_dir(tmp_path, {file: text})
    with pytest.raises(ConfigError, match=r"'other'.*'simple'") as info:
        load_model_config(path)
    assert info.value.field == "name"
    assert info.value.source == str(path / file)
    assert str(path / file) in info.value.message


@pytest.mark.parametrize(
    ("file", "text"),
    [
        ("config.pbtxt", PBTXT.replace('name: "simple"', "")),
        ("config.yaml", YAML.replace("name: simple", "")),
    ],
)
def test_name_defaults_to_the_directory(tmp_path: Path, file: str, text: str) -> None:
    config = load_model_config(model_dir(tmp_path, {file: text}, name="renamed"))
    assert config.name == "renamed"
    assert config.proto.name == "renamed"
    assert config.instance_groups[0].name == "renamed_0"


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_empty_yaml_is_an_empty_config(tmp_path: Path, text: str) -> None:
    config = load_model_config(model_dir(tmp_path, {"config.yaml": text}))
    assert config.name == "simple"
    assert config.inputs == ()


@pytest.mark.parametrize(
    ("file", "text"),
    [
        ("config.pbtxt", 'name: "simple'),
        ("config.pbtxt", 'input [ { name: "A" '),
        ("config.pbtxt", "max_batch_size: 8 }"),
        ("config.yaml", "name: simple\n  bad: ["),
        ("config.yaml", "input: [\n"),
        ("config.yaml", "- a list\n- not a mapping\n"),
        ("config.yaml", "just a string"),
    ],
)
def test_syntax_errors_name_the_file(tmp_path: Path, file: str, text: str) -> None:
    path = model_dir(tmp_path, {file: text})
    with pytest.raises(ConfigError) as info:
        load_model_config(path)
    assert info.value.source == str(path / file)
    assert str(path / file) in info.value.message


def test_pbtxt_syntax_error_gives_line_and_column(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {"config.pbtxt": 'backend: "python"\nname: "simple'})
    with pytest.raises(ConfigError, match="2:7"):
        load_model_config(path)


def test_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {})
    (path / "config.pbtxt").write_bytes(b'name: "\xff\xfe"')
    with pytest.raises(ConfigError, match="cannot read") as info:
        load_model_config(path)
    assert info.value.source == str(path / "config.pbtxt")


@pytest.mark.parametrize(
    ("file", "text", "field"),
    [
        ("config.pbtxt", PBTXT.replace("backend:", "backendz:"), "backendz"),
        ("config.pbtxt", PBTXT.replace("dims: [ 16 ] }", "dimz: [ 16 ] }", 1), "dimz"),
        ("config.yaml", YAML.replace("backend:", "backendz:"), "backendz"),
        ("config.yaml", YAML.replace("dims: [16]", "dimz: [16]", 1), "dimz"),
    ],
)
def test_unknown_field_names_the_field(tmp_path: Path, file: str, text: str, field: str) -> None:
    path = model_dir(tmp_path, {file: text})
    with pytest.raises(ConfigError, match=field) as info:
        load_model_config(path)
    assert info.value.field == field
    assert info.value.source == str(path / file)
    assert str(path / file) in info.value.message


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("max_batch_size: 1.5", "max_batch_size"),
        ("max_batch_size: lots", "max_batch_size"),
        ("name: [1]", "name"),
        ("input: not-a-list", "input"),
        ("input: [{name: A, data_type: TYPE_NOPE, dims: [1]}]", "input"),
    ],
)
def test_yaml_wrong_value_types_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = model_dir(tmp_path, {"config.yaml": text})
    with pytest.raises(ConfigError) as info:
        load_model_config(path)
    assert info.value.field == field
    assert str(path / "config.yaml") in info.value.message


def test_semantic_errors_name_the_file(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {"config.pbtxt": PBTXT.replace("max_batch_size: 8", "")})
    with pytest.raises(ConfigError, match="max_batch_size > 0") as info:
        load_model_config(path)
    assert info.value.field == "dynamic_batching"
    assert info.value.source == str(path / "config.pbtxt")


def test_yaml_semantic_errors_name_the_file_and_field(tmp_path: Path) -> None:
    text = YAML.replace("dims: [16]", "dims: [0]", 1)
    path = model_dir(tmp_path, {"config.yaml": text})
    with pytest.raises(ConfigError, match="INPUT0") as info:
        load_model_config(path)
    assert info.value.field == "input[0] 'INPUT0'.dims"
    assert info.value.source == str(path / "config.yaml")


# -- JSON override -------------------------------------------------------------------------------


def test_json_override_replaces_the_file(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {"config.pbtxt": PBTXT})
    override = json.dumps(
        {
            "max_batch_size": 0,
            "input": [{"name": "X", "data_type": "TYPE_FP16", "dims": [2]}],
            "output": [{"name": "Y", "dataType": "TYPE_FP16", "dims": ["2"]}],
        }
    )
    config = load_model_config(path, override)
    assert config.name == "simple"  # defaults to the directory
    assert config.max_batch_size == 0
    assert [(t.name, t.datatype, t.dims) for t in config.inputs] == [("X", "FP16", (2,))]
    assert [(t.name, t.datatype, t.dims) for t in config.outputs] == [("Y", "FP16", (2,))]
    assert config.backend == ""


def test_json_override_needs_no_file(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {})
    config = load_model_config(path, '{"name": "simple", "backend": "python"}')
    assert config.backend == "python"


def test_json_override_name_must_match(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {"config.pbtxt": PBTXT})
    with pytest.raises(ConfigError, match="'other'") as info:
        load_model_config(path, '{"name": "other"}')
    assert info.value.field == "name"
    assert info.value.source == "simple (config override)"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ('{"nmae": "simple"}', "nmae"),
        ('{"input": [{"name": "A", "dimz": [1]}]}', "dimz"),
        ('{"max_batch_size": "many"}', "max_batch_size"),
    ],
)
def test_json_override_errors_name_the_field(tmp_path: Path, override: str, field: str) -> None:
    path = model_dir(tmp_path, {"config.pbtxt": PBTXT})
    with pytest.raises(ConfigError, match=field) as info:
        load_model_config(path, override)
    assert info.value.field == field
    assert "config override" in info.value.message


def test_json_override_syntax_error(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {"config.pbtxt": PBTXT})
    with pytest.raises(ConfigError, match="config override") as info:
        load_model_config(path, '{"name": ')
    assert info.value.source == "simple (config override)"


# -- parse_config_text -----------------------------------------------------------------------------


def test_parse_config_text_does_no_validation() -> None:
    message = parse_config_text("max_batch_size: -4", "src")
    assert message.max_batch_size == -4
    assert message.name == ""
    message = parse_config_text("max_batch_size: -4", "src", yaml_format=True)
    assert message.max_batch_size == -4


def test_parse_config_text_errors_use_the_given_source() -> None:
    with pytest.raises(ConfigError, match=r"^my-source: .*nope") as info:
        parse_config_text("nope: 1", "my-source")
    assert info.value.field == "nope"
    with pytest.raises(ConfigError, match=r"^my-source: .*nope"):
        parse_config_text("nope: 1", "my-source", yaml_format=True)


def test_override_must_be_a_json_object(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    with pytest.raises(ConfigError, match="ModelConfig JSON object"):
        load_model_config(model_dir, override_json="[]")


def test_protobuf_makes_its_lazy_import_before_configs_are_parsed_in_threads() -> None:
    # The repository parses configs in worker threads at once; protobuf's first parse of a
    # map-like field imports descriptor_pb2, and on Python 3.11 threads making that first
    # import together failed one with KeyError (a server that never started, in CI). Importing
    # the config reader now makes that import on the importing thread.
    code = (
        "import sys\n"
        "import infermux.repository.config_file\n"
        "sys.exit(0 if 'google.protobuf.descriptor_pb2' in sys.modules else 1)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
