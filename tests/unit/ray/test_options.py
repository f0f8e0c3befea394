"""A model config as a Ray Serve deployment: replicas, resources, autoscaling, backpressure."""

from __future__ import annotations

import pytest

from infermux.errors import ConfigError
from infermux.model_config import ModelConfig
from infermux.ray.options import DeploymentOptions, deployment_options
from infermux.repository.config_file import parse_config_text


def config(text: str) -> ModelConfig:
    base = (
        'name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
    )
    return ModelConfig.from_proto(parse_config_text(base + text, "m/config.pbtxt"), "m")


def parameters(**values: str) -> str:
    return "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items()
    )


def test_resources_follow_the_instance_groups() -> None:
    cpu = deployment_options(config("instance_group [ { kind: KIND_CPU, count: 3 } ]"))
    assert cpu == DeploymentOptions(num_replicas=1, max_ongoing_requests=48, num_cpus=3.0)
    gpu = deployment_options(
        config("instance_group [ { kind: KIND_GPU, count: 2, gpus: [0, 1] } ]")
    )
    assert (gpu.num_cpus, gpu.num_gpus) == (0.0, 2.0)
    assert deployment_options(config("instance_group [ { kind: KIND_GPU } ]")).num_gpus == 1.0
    kwargs = cpu.as_kwargs()
    assert kwargs["ray_actor_options"] == {"num_cpus": 3.0, "num_gpus": 0.0}
    assert kwargs["num_replicas"] == 1
    assert kwargs["max_queued_requests"] == -1
    assert "autoscaling_config" not in kwargs


def test_parameters_override_replicas_resources_and_queue_bounds() -> None:
    options = deployment_options(
        config(
            parameters(
                ray_num_replicas="3",
                ray_num_cpus="0.5",
                ray_max_ongoing_requests="4",
                ray_max_queued_requests="10",
                ray_resources="node_a=1, accelerator_x=0.25",
            )
        )
    )
    kwargs = options.as_kwargs()
    assert kwargs["num_replicas"] == 3
    assert kwargs["ray_actor_options"] == {
        "num_cpus": 0.5,
        "num_gpus": 0.0,
        "resources": {"node_a": 1.0, "accelerator_x": 0.25},
    }
    assert (kwargs["max_ongoing_requests"], kwargs["max_queued_requests"]) == (4, 10)


def test_autoscaling_on_queue_depth() -> None:
    auto = deployment_options(config(parameters(ray_num_replicas="auto")))
    assert auto.as_kwargs()["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 8.0,
    }
    assert "num_replicas" not in auto.as_kwargs()
    bounded = deployment_options(
        config(
            parameters(ray_min_replicas="2", ray_max_replicas="6", ray_target_ongoing_requests="3")
        )
    )
    assert bounded.autoscaling == {
        "min_replicas": 2,
        "max_replicas": 6,
        "target_ongoing_requests": 3.0,
    }


@pytest.mark.parametrize(
    ("values", "field", "problem"),
    [
        ({"ray_num_replicas": "two"}, "parameters.ray_num_replicas", "must be a number"),
        ({"ray_num_replicas": "0"}, "parameters.ray_num_replicas", "must be >= 1"),
        ({"ray_num_replicas": "1.5"}, "parameters.ray_num_replicas", "whole number"),
        ({"ray_max_queued_requests": "-2"}, "parameters.ray_max_queued_requests", ">= -1"),
        (
            {"ray_min_replicas": "5", "ray_max_replicas": "2"},
            "parameters.ray_max_replicas",
            "below",
        ),
        ({"ray_resources": "gpu_x"}, "parameters.ray_resources", "name=amount"),
        ({"ray_resources": "x=-1"}, "parameters.ray_resources", "name=amount"),
        ({"ray_replicas": "2"}, "parameters.ray_replicas", "unknown Ray setting"),
    ],
)
def test_bad_settings_name_the_parameter(values: dict[str, str], field: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as error:
        deployment_options(config(parameters(**values)))
    assert error.value.field == field
