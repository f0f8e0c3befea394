"""Version routing in process: canary splits, sticky keys, pinned versions, promote and rollback,
and shadow runs that are compared and counted but never answer the client."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.errors import InvalidArgumentError, NotFoundError
from infermux.repository import ControlMode, ModelRepository
from infermux.routing.policy import ShadowPolicy, TrafficPolicy, parse_policy
from infermux.routing.router import Router
from infermux.types import InferRequest, Parameters, Tensor
from tests.support import IDENTITY_MODEL, write_model

PLUS_ONE = IDENTITY_MODEL.replace('r.inputs["INPUT0"]}', 'r.inputs["INPUT0"] + 1}')
ALL_VERSIONS = "version_policy: { all { } }\ndynamic_batching { }"


@pytest.fixture
async def repository(tmp_path: Path) -> AsyncIterator[ModelRepository]:
    model = write_model(tmp_path, "m", extra=ALL_VERSIONS, versions=(1, 2, 3))
    (model / "3" / "model.py").write_text(PLUS_ONE)  # version 3 answers differently
    repository = ModelRepository(
        [tmp_path], BackendRegistry(), control_mode=ControlMode.EXPLICIT, startup_models=["*"]
    )
    await repository.start()
    yield repository
    await repository.close()


def request(key: str | None = None, version: str = "", value: float = 1.0) -> InferRequest:
    data = np.full((1, 2), value, dtype=np.float32)
    parameters: Parameters = {} if key is None else {"user": key}
    tensor = Tensor("INPUT0", "FP32", (1, 2), data)
    return InferRequest("m", version, [tensor], parameters=parameters)


async def test_canary_split_is_within_3_percent_over_10k_requests(
    repository: ModelRepository,
) -> None:
    router = Router(repository, rng=random.Random(7))
    for weights in ({1: 90.0, 2: 10.0}, {1: 70.0, 2: 30.0}, {1: 1.0, 2: 1.0, 3: 2.0}):
        router.set_policy("m", TrafficPolicy(weights=weights))
        counts = Counter(router.route(request()).model.version for _ in range(10_000))
        total = sum(weights.values())
        for version, weight in weights.items():
            assert abs(counts[version] / 10_000 - weight / total) < 0.03, (weights, counts)


async def test_without_a_policy_the_highest_version_answers(repository: ModelRepository) -> None:
    router = Router(repository)
    assert {router.route(request()).model.version for _ in range(50)} == {3}
    assert router.route(request(version="1")).model.version == 1


async def test_sticky_keys_stay_on_one_version_and_few_move(repository: ModelRepository) -> None:
    router = Router(repository, rng=random.Random(1))
    router.set_policy("m", TrafficPolicy(weights={1: 90.0, 2: 10.0}, sticky_key="user"))
    keys = [f"user-{i}" for i in range(10_000)]
    before = {key: router.route(request(key)).model.version for key in keys}
    for key in keys[:100]:  # the same key, asked again, lands on the same version
        assert {router.route(request(key)).model.version for _ in range(5)} == {before[key]}
    assert abs(sum(v == 2 for v in before.values()) / 10_000 - 0.10) < 0.03
    # Weights move 10 points: about 10% of keys move, all of them from 1 to 2.
    router.set_policy("m", TrafficPolicy(weights={1: 80.0, 2: 20.0}, sticky_key="user"))
    after = {key: router.route(request(key)).model.version for key in keys}
    moved = [key for key in keys if before[key] != after[key]]
    assert all((before[k], after[k]) == (1, 2) for k in moved)
    assert 0.07 < len(moved) / 10_000 < 0.13
    # A pinned version wins over the policy; a request without the key is spread by weight.
    assert router.route(request("user-1", version="3")).model.version == 3
    assert {router.route(request()).model.version for _ in range(200)} == {1, 2}


async def test_the_routing_key_parameter_is_the_default_sticky_key(
    repository: ModelRepository,
) -> None:
    router = Router(repository)
    router.set_policy("m", TrafficPolicy(weights={1: 1.0, 2: 1.0}))
    req = request()
    req.parameters["routing_key"] = "alice"
    assert len({router.route(req).model.version for _ in range(50)}) == 1


async def test_promote_and_rollback_take_effect_for_the_next_request(
    repository: ModelRepository,
) -> None:
    router = Router(repository)
    router.set_policy("m", TrafficPolicy(weights={1: 100.0}))
    assert router.route(request()).model.version == 1
    router.promote("m", 2)
    assert {router.route(request()).model.version for _ in range(20)} == {2}
    assert router.report("m").policy == {"weights": {"2": 1.0}}
    router.rollback("m")
    assert {router.route(request()).model.version for _ in range(20)} == {1}
    router.rollback("m")  # back to no policy at all
    assert router.route(request()).model.version == 3
    assert router.report("m").source == "none"
    with pytest.raises(InvalidArgumentError, match="no traffic policy change"):
        router.rollback("m")


async def test_policies_naming_unserved_versions_are_refused(repository: ModelRepository) -> None:
    router = Router(repository)
    with pytest.raises(InvalidArgumentError, match="not served: 7"):
        router.set_policy("m", TrafficPolicy(weights={7: 1.0}))
    with pytest.raises(InvalidArgumentError, match="not served: 9"):
        router.set_policy("m", TrafficPolicy(shadow=ShadowPolicy(version=9)))
    with pytest.raises(NotFoundError):
        router.set_policy("nope", None)


async def test_the_config_policy_applies_until_an_admin_one_is_set(tmp_path: Path) -> None:
    policy = '{\\"weights\\": {\\"1\\": 1}}'
    parameter = f'parameters {{ key: "traffic_policy" value: {{ string_value: "{policy}" }} }}'
    extra = f"{ALL_VERSIONS}\n{parameter}"
    write_model(tmp_path, "m", extra=extra, versions=(1, 2))
    repository = ModelRepository([tmp_path], BackendRegistry())
    await repository.start()
    try:
        router = Router(repository)
        assert router.route(request()).model.version == 1
        assert router.report("m").source == "config"
        router.set_policy("m", TrafficPolicy(weights={2: 1.0}))
        assert router.route(request()).model.version == 2
        router.set_policy("m", None)  # DELETE: the config's again
        assert router.route(request()).model.version == 1
    finally:
        await repository.close()


async def test_a_bad_config_policy_fails_the_load_naming_the_field(tmp_path: Path) -> None:
    policy = '{\\"weights\\": {\\"1\\": -1}}'
    extra = f'parameters {{ key: "traffic_policy" value: {{ string_value: "{policy}" }} }}'
    write_model(tmp_path, "m", extra=extra)
    repository = ModelRepository([tmp_path], BackendRegistry())
    await repository.start()
    try:
        (row,) = repository.index()
        assert "weights.1" in row.reason
        assert repository.load_failures() == {"m": 1}
    finally:
        await repository.close()


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ('{"weights": {"2": -1}}', "field 'weights.2'"),
        ('{"weights": {"1": 0}}', "every weight is 0"),
        ('{"weights": {"x": 1}}', "weights"),
        ('{"shadow": {"version": 2, "fraction": 2}}', "field 'shadow.fraction'"),
        ('{"shadow": {"fraction": 0.5}}', "shadow"),
        ('{"shadow": {"version": 2, "outputs": {"O": {"atol": -1}}}}', "shadow.outputs.O"),
        ('{"nope": 1}', "nope"),
        ("{not json", "not valid JSON"),
    ],
)
def test_policy_errors_name_the_field(document: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message.replace(".", r"\.")):
        parse_policy(document)


def test_policy_round_trip() -> None:
    text = (
        '{"weights": {"1": 9, "2": 1}, "sticky_key": "user", '
        '"shadow": {"version": 3, "fraction": 0.5, "outputs": {"OUTPUT0": {"atol": 0.1}}}}'
    )
    policy = parse_policy(text)
    assert policy.weights == {1: 9.0, 2: 1.0}
    assert policy.shadow is not None
    assert policy.shadow.tolerance("OUTPUT0").atol == 0.1
    assert policy.shadow.tolerance("other").atol == 1e-5
    assert parse_policy(policy.to_json()) == policy


async def test_shadow_runs_are_compared_and_never_answer(repository: ModelRepository) -> None:
    plane = DataPlane(repository, version="test")
    plane.router.set_policy(
        "m", TrafficPolicy(weights={1: 1.0}, shadow=ShadowPolicy(version=3, fraction=1.0))
    )
    for i in range(20):
        response = await plane.infer(request(value=float(i)))
        assert response.model_version == "1"
        np.testing.assert_array_equal(response.outputs[0].data, np.full((1, 2), float(i)))
    await asyncio.sleep(0.2)  # shadow runs finish in the background
    report = plane.router.report("m")
    assert report.shadow is not None
    assert report.shadow["version"] == 3
    assert report.shadow["mirrored"] == 20
    assert report.shadow["disagreed"] == 20
    assert report.shadow["agreement_rate"] == 0.0
    assert report.shadow["max_abs_diff"] == {"OUTPUT0": 1.0}
    # Within a tolerance of 1 the same answers agree; a new experiment counts afresh.
    plane.router.set_policy(
        "m", TrafficPolicy(weights={1: 1.0}, shadow=ShadowPolicy(version=3, atol=1.0, rtol=0.0))
    )
    for i in range(10):
        await plane.infer(request(value=float(i)))
    await asyncio.sleep(0.2)
    report = plane.router.report("m")
    assert report.shadow is not None
    assert (report.shadow["agreed"], report.shadow["disagreed"]) == (10, 0)
    # Half the requests mirrored, about.
    plane.router.set_policy(
        "m", TrafficPolicy(weights={1: 1.0}, shadow=ShadowPolicy(version=2, fraction=0.5))
    )
    for _ in range(400):
        await plane.infer(request())
    await asyncio.sleep(0.2)
    report = plane.router.report("m")
    assert report.shadow is not None
    assert 140 < report.shadow["mirrored"] < 260  # type: ignore[operator]
    assert report.shadow["agreement_rate"] == 1.0
    stats = {(name, version) for name, version, _ in plane.router.shadow_stats()}
    assert stats == {("m", 3), ("m", 2)}
    plane.close()


async def test_a_changed_config_policy_applies_after_the_reload(tmp_path: Path) -> None:
    def config_with(version: int) -> str:
        policy = f'{{\\"weights\\": {{\\"{version}\\": 1}}}}'
        parameter = f'parameters {{ key: "traffic_policy" value: {{ string_value: "{policy}" }} }}'
        return f"{ALL_VERSIONS}\n{parameter}"

    model = write_model(tmp_path, "m", extra=config_with(1), versions=(1, 2))
    repository = ModelRepository(
        [tmp_path], BackendRegistry(), control_mode=ControlMode.EXPLICIT, startup_models=["*"]
    )
    await repository.start()
    try:
        router = Router(repository)
        assert router.route(request()).model.version == 1
        config = (model / "config.pbtxt").read_text()
        (model / "config.pbtxt").write_text(config.replace(config_with(1), config_with(2)))
        await repository.load("m")  # what poll mode does when the file changes
        assert {router.route(request()).model.version for _ in range(20)} == {2}
    finally:
        await repository.close()
