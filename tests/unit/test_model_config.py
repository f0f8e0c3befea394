"""The typed model configuration (``infermux.model_config``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from infermux.errors import ConfigError, InvalidArgumentError
from infermux.model_config import (
    DynamicBatchingConfig,
    InstanceGroupConfig,
    ModelConfig,
    QueuePolicyConfig,
    TensorConfig,
    VersionPolicy,
    config_datatype,
    message_to_json_dict,
    pb,
)

SOURCE = "/models/m/config.pbtxt"

BASE = """
name: "m"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

FULL = """
name: "m"
platform: "pytorch_libtorch"
backend: "python"
max_batch_size: 8
default_model_filename: "model.pt"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3, -1 ] },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ 1 ] optional: true allow_ragged_batch: true },
  { name: "INPUT2" data_type: TYPE_BF16 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } }
]
output [ { name: "OUTPUT0" data_type: TYPE_INT64 dims: [ 3, -1 ] } ]
instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0, 1 ] }, { name: "cpu" kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 2, 4 ]
  max_queue_delay_microseconds: 18446744073709551615
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { default_timeout_microseconds: 7 max_queue_size: 3 }
  priority_queue_policy { key: 1 value { default_timeout_microseconds: 9000000000 } }
  priority_queue_policy { key: 2 value { default_timeout_microseconds: 11 } }
}
version_policy { latest { num_versions: 2 } }
parameters { key: "k" value { string_value: "v" } }
model_warmup [ {
  name: "w" batch_size: 1
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 3, 5 ] zero_data: true } }
} ]
"""


def parse(text: str) -> pb.ModelConfig:
    return text_format.Parse(text, pb.ModelConfig())


def build(text: str) -> ModelConfig:
    return ModelConfig.from_proto(parse(text), SOURCE)


def _int64(field: FieldDescriptor) -> bool:
    return field.type in (
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    )


def assert_triton_json(descriptor: Descriptor, raw: dict[str, Any]) -> None:
    """Every key is a proto field name (snake_case) and every 64-bit integer is a JSON number."""
    for key, value in raw.items():
        assert key in descriptor.fields_by_name, f"{key!r} is not a field of {descriptor.name}"
        field = descriptor.fields_by_name[key]
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            value_field = sub.fields_by_name["value"]
            assert isinstance(value, dict)
            for item in value.values():
                if value_field.message_type is not None:
                    assert_triton_json(value_field.message_type, item)
                elif _int64(value_field):
                    assert type(item) is int
        elif sub is not None:
            for item in value if isinstance(value, list) else [value]:
                assert_triton_json(sub, item)
        elif _int64(field):
            for item in value if isinstance(value, list) else [value]:
                assert type(item) is int, f"{key}: {item!r} is not a JSON number"


# -- from_proto ------------------------------------------------------------------------------------


def test_from_proto_builds_the_typed_config() -> None:
    config = build(FULL)
    assert config.name == "m"
    assert config.platform == "pytorch_libtorch"
    assert config.backend == "python"
    assert config.max_batch_size == 8
    assert config.batching
    assert config.default_model_filename == "model.pt"
    assert config.inputs == (
        TensorConfig("INPUT0", "FP32", (3, -1)),
        TensorConfig("INPUT1", "BYTES", (1,), optional=True, allow_ragged_batch=True),
        TensorConfig("INPUT2", "BF16", (2, 2), reshape=(4,)),
    )
    assert config.outputs == (TensorConfig("OUTPUT0", "INT64", (3, -1)),)
    assert config.instance_groups == (
        InstanceGroupConfig("m_0", "KIND_GPU", 2, (0, 1)),
        InstanceGroupConfig("cpu", "KIND_CPU", 1, ()),
    )
    assert config.dynamic_batching == DynamicBatchingConfig(
        preferred_batch_sizes=(2, 4),
        max_queue_delay_microseconds=2**64 - 1,
        preserve_ordering=True,
        priority_levels=2,
        default_priority_level=1,
        default_queue_policy=QueuePolicyConfig(default_timeout_microseconds=7, max_queue_size=3),
        priority_queue_policy={
            1: QueuePolicyConfig(default_timeout_microseconds=9_000_000_000),
            2: QueuePolicyConfig(default_timeout_microseconds=11),
        },
    )
    assert config.dynamic_batching.policy(2).default_timeout_microseconds == 11
    assert config.dynamic_batching.policy(5).max_queue_size == 3
    assert config.version_policy == VersionPolicy(kind="latest", num_versions=2)
    assert config.parameters == {"k": "v"}
    assert config.proto.name == "m"
    assert config.input("INPUT1") is config.inputs[1]
    assert config.input("OUTPUT0") is None
    assert config.output("OUTPUT0") is config.outputs[0]
    assert config.output("INPUT0") is None


def test_minimal_config_defaults() -> None:
    config = build('name: "m" input [ { name: "I" data_type: TYPE_BOOL dims: [ 1 ] } ]')
    assert config.max_batch_size == 0
    assert not config.batching
    assert config.outputs == ()
    assert config.instance_groups == (InstanceGroupConfig("m_0", "KIND_CPU", 1),)
    assert config.dynamic_batching is None
    assert config.version_policy == VersionPolicy()
    assert config.version_policy.kind == "latest"
    assert config.version_policy.num_versions == 1
    assert config.parameters == {}


def test_output_optional_is_ignored() -> None:
    # ModelOutput has no 'optional' field; outputs are never optional.
    config = build(BASE)
    assert not config.outputs[0].optional


def test_equal_protos_give_equal_configs() -> None:
    assert build(FULL) == build(FULL)
    assert build(FULL) != build(BASE)


@pytest.mark.parametrize(
    ("type_name", "datatype"),
    [
        ("TYPE_STRING", "BYTES"),
        ("TYPE_FP32", "FP32"),
        ("TYPE_BF16", "BF16"),
        ("TYPE_UINT64", "UINT64"),
        ("TYPE_BOOL", "BOOL"),
    ],
)
def test_config_datatype(type_name: str, datatype: str) -> None:
    assert config_datatype(type_name) == datatype


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ('max_batch_size: 1 input [ { name: "I" data_type: TYPE_FP32 dims: [1] } ]', "name", ""),
        (BASE.replace("max_batch_size: 8", "max_batch_size: -1"), "max_batch_size", "-1"),
        (BASE.replace('name: "INPUT0" ', ""), "input[0].name", "empty"),
        (BASE.replace('name: "OUTPUT0" ', ""), "output[0].name", "empty"),
        (BASE.replace("data_type: TYPE_FP32 dims", "dims", 1), "input[0] 'INPUT0'.data_type", ""),
        (BASE.replace("dims: [ 4 ] } ]\noutput", "} ]\noutput"), "input[0] 'INPUT0'.dims", ""),
        (BASE.replace("dims: [ 4 ] } ]\noutput", "dims: [ 0 ] } ]\noutput"), "'INPUT0'.dims", ""),
        (BASE.replace("dims: [ 4 ] } ]\n", "dims: [ 4, -2 ] } ]\n", 1), "'INPUT0'.dims", "-2"),
        (
            BASE + 'input [ { name: "INPUT1" dims: [ 1 ] } ]',
            "input[1] 'INPUT1'.data_type",
            "TYPE_",
        ),
        (
            BASE + 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
            "input[1].name",
            "duplicate input name 'INPUT0'",
        ),
        (
            BASE + 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
            "output[1].name",
            "duplicate output name 'OUTPUT0'",
        ),
        (
            BASE.replace("max_batch_size: 8", "") + "dynamic_batching { }",
            "dynamic_batching",
            "max_batch_size > 0",
        ),
        (
            BASE + "dynamic_batching { preferred_batch_size: [ 16 ] }",
            "dynamic_batching.preferred_batch_size",
            "16",
        ),
        (
            BASE + "dynamic_batching { preferred_batch_size: [ 0 ] }",
            "dynamic_batching.preferred_batch_size",
            "0",
        ),
        (
            BASE + "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
            "dynamic_batching.default_priority_level",
            "3",
        ),
        (
            BASE + "dynamic_batching { priority_levels: 2 }",
            "dynamic_batching.default_priority_level",
            "",
        ),
        (BASE + "instance_group [ { count: -1 } ]", "instance_group[0].count", "-1"),
        (BASE + "instance_group [ { }, { gpus: [ 0, -1 ] } ]", "instance_group[1].gpus", ""),
        (
            BASE + "version_policy { specific { } }",
            "version_policy.specific.versions",
            "",
        ),
        (
            BASE + "version_policy { specific { versions: [ 1, 0 ] } }",
            "version_policy.specific.versions",
            "",
        ),
        (
            BASE + "version_policy { latest { } }",
            "version_policy.latest.num_versions",
            "",
        ),
    ],
)
def test_from_proto_errors_name_source_and_field(text: str, field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(text)
    error = info.value
    assert isinstance(error, InvalidArgumentError)
    assert error.source == SOURCE
    assert field in error.field
    assert SOURCE in error.message
    assert f"field '{error.field}'" in error.message
    assert problem in error.message


def test_from_proto_without_source_still_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^field 'max_batch_size'"):
        ModelConfig.from_proto(parse(BASE.replace("8", "-3", 1)))


# -- version policy --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "available", "selected"),
    [
        (VersionPolicy(), [1, 2, 3], [3]),
        (VersionPolicy(), [], []),
        (VersionPolicy(), [7], [7]),
        (VersionPolicy(kind="latest", num_versions=2), [3, 1, 2, 10], [3, 10]),
        (VersionPolicy(kind="latest", num_versions=5), [2, 1], [1, 2]),
        (VersionPolicy(kind="latest", num_versions=2), [4, 4, 1], [1, 4]),
        (VersionPolicy(kind="latest", num_versions=0), [1, 2], []),
        (VersionPolicy(kind="all"), [3, 1, 2], [1, 2, 3]),
        (VersionPolicy(kind="all"), [], []),
        (VersionPolicy(kind="specific", versions=(1, 3, 9)), [1, 2, 3], [1, 3]),
        (VersionPolicy(kind="specific", versions=(9,)), [1, 2, 3], []),
        (VersionPolicy(kind="specific", versions=(2,)), [2, 2], [2]),
    ],
)
def test_version_policy_select(
    policy: VersionPolicy, available: Sequence[int], selected: list[int]
) -> None:
    assert policy.select(available) == selected


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("", VersionPolicy()),
        ("version_policy { }", VersionPolicy()),
        ("version_policy { all { } }", VersionPolicy(kind="all")),
        ("version_policy { latest { num_versions: 3 } }", VersionPolicy("latest", 3)),
        (
            "version_policy { specific { versions: [ 4, 2 ] } }",
            VersionPolicy(kind="specific", versions=(4, 2)),
        ),
    ],
)
def test_version_policy_from_config(text: str, policy: VersionPolicy) -> None:
    assert build(BASE + text).version_policy == policy


# -- shapes ----------------------------------------------------------------------------------------


def test_full_shape_prepends_the_batch_dimension_when_batching() -> None:
    config = build(FULL)
    assert config.full_shape(config.inputs[0]) == (-1, 3, -1)
    assert config.full_shape(config.inputs[1]) == (-1, 1)


def test_full_shape_is_dims_without_batching() -> None:
    config = build(
        FULL.replace("max_batch_size: 8", "max_batch_size: 0").split("dynamic_batching")[0]
    )
    assert config.full_shape(config.inputs[0]) == (3, -1)
    assert config.full_shape(config.outputs[0]) == (3, -1)


# -- Triton's JSON ---------------------------------------------------------------------------------


def test_to_json_dict_is_tritons_json() -> None:
    raw = build(FULL).to_json_dict()
    assert raw["name"] == "m"
    assert raw["max_batch_size"] == 8
    assert raw["input"][0]["dims"] == [3, -1]
    assert raw["input"][0]["data_type"] == "TYPE_FP32"
    assert raw["input"][1]["data_type"] == "TYPE_STRING"
    assert raw["input"][2]["reshape"] == {"shape": [4]}
    assert raw["output"][0]["dims"] == [3, -1]
    dynamic = raw["dynamic_batching"]
    assert dynamic["max_queue_delay_microseconds"] == 2**64 - 1
    assert dynamic["preferred_batch_size"] == [2, 4]
    assert dynamic["default_queue_policy"]["default_timeout_microseconds"] == 7
    assert dynamic["default_queue_policy"]["timeout_action"] == "REJECT"
    assert dynamic["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 9000000000
    assert dynamic["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 11
    assert raw["version_policy"] == {"latest": {"num_versions": 2}}
    assert raw["parameters"] == {"k": {"string_value": "v"}}
    assert raw["model_warmup"][0]["inputs"]["INPUT0"]["dims"] == [3, 5]
    assert raw["instance_group"][0]["kind"] == "KIND_GPU"
    assert raw["instance_group"][0]["gpus"] == [0, 1]
    assert_triton_json(pb.ModelConfig.DESCRIPTOR, raw)
    # As JSON text: numbers, not strings.
    text = json.dumps(raw)
    assert '"max_queue_delay_microseconds": 18446744073709551615' in text
    assert '"dims": [3, -1]' in text
    assert '"default_timeout_microseconds": 9000000000' in text


def test_to_json_dict_has_every_field() -> None:
    raw = build(BASE).to_json_dict()
    for field in pb.ModelConfig.DESCRIPTOR.fields:
        if not field.has_presence:  # scalars, repeated fields and maps are always printed
            assert field.name in raw, field.name
    for field in pb.ModelInput.DESCRIPTOR.fields:
        if not field.has_presence:
            assert field.name in raw["input"][0], field.name
    assert raw["platform"] == ""
    assert raw["backend"] == ""
    assert raw["batch_input"] == []
    # Completed as Triton does: the default instance group and version policy are spelled out.
    assert raw["instance_group"] == [
        {
            "name": "m_0",
            "kind": "KIND_CPU",
            "count": 1,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ]
    assert raw["version_policy"] == {"latest": {"num_versions": 1}}
    assert raw["parameters"] == {}
    assert raw["input"][0]["is_shape_tensor"] is False
    assert raw["input"][0]["format"] == "FORMAT_NONE"


def test_to_json_dict_int64_in_other_messages() -> None:
    config = build(
        BASE
        + """
        sequence_batching { max_sequence_idle_microseconds: 5000000000 }
        model_warmup [ { name: "w" inputs { key: "A" value { dims: [ 2, 3 ] } } } ]
        """
    )
    raw = config.to_json_dict()
    assert raw["sequence_batching"]["max_sequence_idle_microseconds"] == 5000000000
    assert raw["model_warmup"][0]["inputs"]["A"]["dims"] == [2, 3]
    assert_triton_json(pb.ModelConfig.DESCRIPTOR, raw)


def test_to_json_dict_parses_back_to_the_same_proto() -> None:
    config = build(FULL)
    again = json_format.ParseDict(config.to_json_dict(), pb.ModelConfig())
    assert again == config.proto


def test_message_to_json_dict_of_a_sub_message() -> None:
    policy = pb.ModelQueuePolicy(default_timeout_microseconds=2**63, max_queue_size=4)
    raw = message_to_json_dict(policy)
    assert raw["default_timeout_microseconds"] == 2**63
    assert raw["allow_timeout_override"] is False
    assert_triton_json(pb.ModelQueuePolicy.DESCRIPTOR, raw)
