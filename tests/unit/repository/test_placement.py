"""Instance placement: devices from the instance groups, and which executor holds each."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from infermux.model_config import InstanceGroupConfig, ModelConfig
from infermux.repository import load_model_config
from infermux.repository.placement import Placement, Shard, all_placements, placements
from infermux.settings import builtin_repository


@functools.cache
def _base() -> ModelConfig:
    return load_model_config(builtin_repository() / "simple")


def config(*groups: InstanceGroupConfig) -> ModelConfig:
    return dataclasses.replace(_base(), instance_groups=groups)


def gpu(count: int, gpus: tuple[int, ...] = ()) -> InstanceGroupConfig:
    return InstanceGroupConfig("g", "KIND_GPU", count, gpus)


def cpu(count: int) -> InstanceGroupConfig:
    return InstanceGroupConfig("c", "KIND_CPU", count)


def test_listed_gpus_get_count_instances_each() -> None:
    assert [p.device for p in all_placements(config(gpu(2, (0, 1))))] == [
        "cuda:0", "cuda:0", "cuda:1", "cuda:1",
    ]  # fmt: skip
    assert all_placements(config(gpu(1, (1,)))) == [Placement("cuda:1", "g_cuda1_0")]


def test_a_gpu_group_without_gpus_means_every_visible_gpu() -> None:
    """As in Triton: one ``count`` per GPU; GPU 0 when none is visible (the backend's load
    error then says why)."""
    assert [p.device for p in all_placements(config(gpu(1)), gpu_count=2)] == ["cuda:0", "cuda:1"]
    assert [p.device for p in all_placements(config(gpu(2)), gpu_count=0)] == ["cuda:0"] * 2


def test_gpu_instances_go_to_the_executor_of_their_gpu() -> None:
    model = config(gpu(2, (0, 1, 2)))
    by_shard = [[p.name for p in placements(model, Shard(i, 2))] for i in range(2)]
    assert by_shard == [
        ["g_cuda0_0", "g_cuda0_1", "g_cuda2_0", "g_cuda2_1"],
        ["g_cuda1_0", "g_cuda1_1"],
    ]


def test_cpu_instances_are_dealt_round_the_executors() -> None:
    model = config(cpu(3), gpu(1, (1,)))
    by_shard = [[p.name for p in placements(model, Shard(i, 2))] for i in range(2)]
    assert by_shard == [["c_cpu_0", "c_cpu_2"], ["c_cpu_1", "g_cuda1_0"]]
    # One CPU instance: executor 0 alone hosts the model.
    assert placements(config(cpu(1)), Shard(1, 3)) == []


def test_one_executor_holds_everything() -> None:
    model = config(cpu(2), gpu(1, (0, 3)))
    assert placements(model) == all_placements(model)


@pytest.mark.parametrize(("index", "count"), [(0, 0), (2, 2), (-1, 2)])
def test_a_shard_outside_its_count_is_refused(index: int, count: int) -> None:
    with pytest.raises(ValueError, match="executor shard"):
        Shard(index, count)
