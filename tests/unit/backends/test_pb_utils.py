"""The ``triton_python_backend_utils`` API as Triton's python_backend README documents it."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from infermux.backends import pb_utils, server_calls
from infermux.backends.pb_utils.custom_metrics import CUSTOM_METRICS, CustomMetrics
from infermux.backends.server_calls import ServerCalls
from infermux.errors import (
    DecoupledModelError,
    ErrorCode,
    InfermuxError,
    InternalError,
    NotFoundError,
)
from infermux.types import InferRequest, InferResponse, Tensor


@pytest.fixture(autouse=True)
def own_metrics() -> Iterator[None]:
    """Families these tests create leave the process's /metrics afterwards."""
    previous = CUSTOM_METRICS.set_owner("test_pb_utils")
    yield
    CUSTOM_METRICS.set_owner(previous)
    CUSTOM_METRICS.release("test_pb_utils")


def test_tensor_holds_the_array_itself() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("x", array)
    assert tensor.name() == "x"
    assert tensor.as_numpy() is array
    assert tensor.is_cpu()
    assert tensor.shape() == [2, 3]


def test_tensor_refuses_numpy_str_arrays_as_triton_does() -> None:
    with pytest.raises(pb_utils.TritonModelException, match=r"np\.object_"):
        pb_utils.Tensor("x", np.array(["a"]))
    pb_utils.Tensor("x", np.array([b"a"], dtype=object))  # BYTES as objects is the way


def test_dlpack_round_trip_shares_memory() -> None:
    array = np.arange(4, dtype=np.int32)
    back = pb_utils.Tensor.from_dlpack("y", pb_utils.Tensor("x", array))
    assert back.name() == "y"
    assert np.shares_memory(back.as_numpy(), array)
    capsule = pb_utils.Tensor("x", array).to_dlpack()
    assert type(capsule).__name__ == "PyCapsule"


def test_config_helpers() -> None:
    config = {"input": [{"name": "A", "data_type": "TYPE_INT32"}], "output": []}
    assert pb_utils.get_input_config_by_name(config, "A") == {
        "name": "A",
        "data_type": "TYPE_INT32",
    }
    assert pb_utils.get_input_config_by_name(config, "B") is None
    assert pb_utils.get_output_config_by_name(config, "A") is None
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_


def test_tensor_lookups_by_name() -> None:
    a, b = pb_utils.Tensor("A", np.zeros(1)), pb_utils.Tensor("B", np.ones(1))
    request = pb_utils.InferenceRequest(inputs=[a, b], requested_output_names=["C"])
    assert pb_utils.get_input_tensor_by_name(request, "B") is b
    assert pb_utils.get_input_tensor_by_name(request, "C") is None
    response = pb_utils.InferenceResponse(output_tensors=[a])
    assert pb_utils.get_output_tensor_by_name(response, "A") is a
    assert pb_utils.get_output_tensor_by_name(response, "B") is None


def test_request_accessors() -> None:
    request = pb_utils.InferenceRequest(
        request_id="r1", correlation_id=7, requested_output_names=["OUT"], parameters={"k": 1}
    )
    assert request.request_id() == "r1"
    assert request.correlation_id() == 7
    assert request.requested_output_names() == ["OUT"]
    assert json.loads(request.parameters()) == {"k": 1}
    assert not request.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="decoupled"):
        request.get_response_sender()


def test_response_and_error() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="must be a list"):
        pb_utils.InferenceResponse(output_tensors="nope")  # type: ignore[arg-type]
    ok = pb_utils.InferenceResponse(output_tensors=[])
    assert not ok.has_error()
    assert ok.error() is None
    error = pb_utils.TritonError("bad input")
    failed = pb_utils.InferenceResponse(output_tensors=[], error=error)
    assert failed.has_error()
    assert failed.error() is error
    assert error.message() == "bad input"
    assert error.code() == pb_utils.TritonError.INTERNAL


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (pb_utils.TritonError.UNKNOWN, ErrorCode.UNKNOWN),
        (pb_utils.TritonError.INTERNAL, ErrorCode.INTERNAL),
        (pb_utils.TritonError.NOT_FOUND, ErrorCode.NOT_FOUND),
        (pb_utils.TritonError.INVALID_ARG, ErrorCode.INVALID_ARG),
        (pb_utils.TritonError.UNAVAILABLE, ErrorCode.UNAVAILABLE),
        (pb_utils.TritonError.UNSUPPORTED, ErrorCode.UNSUPPORTED),
        (pb_utils.TritonError.ALREADY_EXISTS, ErrorCode.ALREADY_EXISTS),
        (pb_utils.TritonError.CANCELLED, ErrorCode.CANCELLED),
    ],
)
def test_error_codes_map_onto_infermux_codes(code: int, expected: ErrorCode) -> None:
    exc = pb_utils.TritonError("why", code).as_exception()
    assert exc.code is expected
    assert exc.message == "why"
    assert pb_utils.TritonError.of(InfermuxError("why", expected)).code() == code


def test_logger_writes_through_logging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="infermux.models"):
        pb_utils.Logger.log_info("i")
        pb_utils.Logger.log_warn("w")
        pb_utils.Logger.log_error("e")
        pb_utils.Logger.log_verbose("v")
    assert [(r.levelno, r.message) for r in caplog.records] == [
        (logging.INFO, "i"),
        (logging.WARNING, "w"),
        (logging.ERROR, "e"),
        (logging.DEBUG, "v"),
    ]


def test_auto_complete_config_fills_and_checks() -> None:
    from infermux.model_config import pb

    config = pb_utils.ModelConfig(pb.ModelConfig(name="m", backend="python"))
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})  # same: fine
    config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    with pytest.raises(pb_utils.TritonModelException, match="data_type"):
        config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [4]})
    message = config.to_message()
    assert [t.name for t in message.input] == ["IN"]
    assert message.max_batch_size == 8
    assert message.HasField("dynamic_batching")
    assert config.as_dict()["output"][0]["name"] == "OUT"


# -- BLS ----------------------------------------------------------------------------------------


@pytest.fixture
def seen() -> list[InferRequest]:
    """The requests the server below received."""
    return []


@pytest.fixture
def server(seen: list[InferRequest]) -> Iterator[ServerCalls]:
    """A server loop on another thread answering with INPUT doubled, or NOT_FOUND."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def infer(request: InferRequest) -> InferResponse:
        seen.append(request)
        if request.model_name == "square":
            raise DecoupledModelError("model 'square' is decoupled", "square")
        if request.model_name != "double":
            raise NotFoundError(f"no model '{request.model_name}'")
        data = request.inputs[0].data * 2
        out = Tensor("OUT", request.inputs[0].datatype, request.inputs[0].shape, data)
        return InferResponse(request.model_name, "1", [out])

    async def stream(request: InferRequest) -> AsyncIterator[InferResponse]:
        # "square": IN[0] responses of OUT=IN (a negative value: an error between two), then
        # the final flag alone, as Triton's square_int32 example; the others answer once.
        if request.model_name != "square":
            yield await infer(request)
            return
        value = int(request.inputs[0].data[0])
        for i in range(abs(value)):
            if value < 0 and i == 1:
                yield InferResponse("square", "1", [], final=False, error=InternalError("odd"))
            out = Tensor("OUT", "INT32", (1,), np.array([value], np.int32))
            yield InferResponse("square", "1", [out], final=False)
        yield InferResponse("square", "1", [], final=True, flag_only=True)

    calls = ServerCalls()
    calls.attach(infer, stream)
    calls.serve_on(loop)
    previous = server_calls.set_current(calls)
    yield calls
    server_calls.set_current(previous)
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def bls(model: str, array: np.ndarray) -> pb_utils.InferenceRequest:
    return pb_utils.InferenceRequest(
        model_name=model, inputs=[pb_utils.Tensor("IN", array)], requested_output_names=["OUT"]
    )


def test_exec_calls_the_server_and_waits(server: ServerCalls) -> None:
    response = bls("double", np.arange(3, dtype=np.float32)).exec()
    assert not response.has_error()
    out = pb_utils.get_output_tensor_by_name(response, "OUT")
    assert out is not None
    np.testing.assert_array_equal(out.as_numpy(), [0, 2, 4])


def test_exec_errors_come_back_in_the_response(server: ServerCalls) -> None:
    response = bls("missing", np.zeros(1)).exec()
    assert response.has_error()
    error = response.error()
    assert error is not None
    assert error.code() == pb_utils.TritonError.NOT_FOUND
    assert "no model 'missing'" in error.message()


def test_async_exec_from_a_loop_of_its_own(server: ServerCalls) -> None:
    async def two() -> list[pb_utils.InferenceResponse]:
        return list(
            await asyncio.gather(
                bls("double", np.ones(2)).async_exec(), bls("missing", np.ones(2)).async_exec()
            )
        )

    first, second = asyncio.run(two())
    out = first.output_tensors()[0].as_numpy()
    np.testing.assert_array_equal(out, [2, 2])
    assert second.has_error()


def test_exec_outside_a_server_says_why() -> None:
    previous = server_calls.set_current(None)
    try:
        with pytest.raises(pb_utils.TritonModelException, match="isolation: process"):
            bls("double", np.ones(1)).exec()
    finally:
        server_calls.set_current(previous)


def outs(responses: pb_utils.ResponseIterator) -> list[int | None]:
    """OUT of each response (None: an empty one, -1: a failed one)."""
    got: list[int | None] = []
    for response in responses:
        if response.has_error():
            got.append(-1)
        elif response.output_tensors():
            got.append(int(response.output_tensors()[0].as_numpy()[0]))
        else:
            got.append(None)
    return got


def test_decoupled_exec_yields_each_response_then_the_empty_final_one(server: ServerCalls) -> None:
    responses = bls("square", np.array([3], np.int32)).exec(decoupled=True)
    assert outs(responses) == [3, 3, 3, None]
    assert outs(responses) == [3, 3, 3, None]  # iterating again replays them, as in Triton
    assert outs(bls("square", np.array([0], np.int32)).exec(decoupled=True)) == [None]


def test_decoupled_exec_errors_are_responses_and_the_stream_goes_on(server: ServerCalls) -> None:
    assert outs(bls("square", np.array([-2], np.int32)).exec(decoupled=True)) == [-2, -1, -2, None]
    failed = list(bls("missing", np.zeros(1)).exec(decoupled=True))
    assert len(failed) == 1
    error = failed[0].error()
    assert error is not None
    assert error.code() == pb_utils.TritonError.NOT_FOUND


def test_decoupled_exec_on_a_model_that_answers_once_yields_that_answer(
    server: ServerCalls,
) -> None:
    (response,) = list(bls("double", np.ones(2, np.float32)).exec(decoupled=True))
    np.testing.assert_array_equal(response.output_tensors()[0].as_numpy(), [2, 2])


def test_exec_on_a_decoupled_model_without_decoupled_says_how(server: ServerCalls) -> None:
    response = bls("square", np.array([2], np.int32)).exec()
    error = response.error()
    assert error is not None
    assert error.code() == pb_utils.TritonError.UNSUPPORTED
    assert "exec(decoupled=True)" in error.message()


def test_async_exec_decoupled_reads_with_for_and_async_for(server: ServerCalls) -> None:
    async def both() -> tuple[list[int | None], list[int | None]]:
        first, second = await asyncio.gather(
            bls("square", np.array([2], np.int32)).async_exec(decoupled=True),
            bls("square", np.array([1], np.int32)).async_exec(decoupled=True),
        )
        streamed = [
            int(r.output_tensors()[0].as_numpy()[0]) if r.output_tensors() else None
            async for r in second
        ]
        return outs(first), streamed

    assert asyncio.run(both()) == ([2, 2, None], [1, None])


def test_cancel_ends_the_iteration(server: ServerCalls) -> None:
    responses = bls("square", np.array([5], np.int32)).exec(decoupled=True)
    assert next(responses).output_tensors()
    responses.cancel()
    with pytest.raises(StopIteration):
        next(responses)
    assert outs(responses) == [5]  # a new iteration replays what was read


def test_timeout_and_sequence_travel_as_a_clients_request_parameters(
    server: ServerCalls, seen: list[InferRequest]
) -> None:
    bls("double", np.ones(1)).exec()
    assert seen[-1].parameters == {}
    request = pb_utils.InferenceRequest(
        model_name="double",
        inputs=[pb_utils.Tensor("IN", np.ones(1))],
        requested_output_names=["OUT"],
        correlation_id=7,
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        timeout=2500,
        parameters={"k": "v"},
    )
    request.exec()
    assert seen[-1].parameters == {
        "k": "v",
        "timeout": 2500,
        "sequence_id": 7,
        "sequence_start": True,
    }


def test_using_decoupled_model_transaction_policy() -> None:
    decoupled = {"model_transaction_policy": {"decoupled": True}}
    assert pb_utils.using_decoupled_model_transaction_policy(decoupled)
    assert not pb_utils.using_decoupled_model_transaction_policy({})
    assert not pb_utils.using_decoupled_model_transaction_policy(
        {"model_transaction_policy": {"decoupled": False}}
    )


# -- custom metrics -----------------------------------------------------------------------------


def test_metric_kinds_are_enforced() -> None:
    counter = pb_utils.MetricFamily("t_counter", "c", pb_utils.MetricFamily.COUNTER).Metric()
    counter.increment(2)
    assert counter.value() == 2
    with pytest.raises(pb_utils.TritonModelException, match="negative"):
        counter.increment(-1)
    with pytest.raises(pb_utils.TritonModelException, match="GAUGE"):
        counter.set(1)
    gauge = pb_utils.MetricFamily("t_gauge", "g", pb_utils.GAUGE).Metric(labels={"a": "b"})
    gauge.set(5)
    gauge.increment(-2)
    assert gauge.value() == 3
    with pytest.raises(pb_utils.TritonModelException, match="exists as a counter"):
        pb_utils.MetricFamily("t_counter", "c", pb_utils.GAUGE)
    with pytest.raises(pb_utils.TritonModelException, match="reserved"):
        pb_utils.MetricFamily("nv_inference_count", "x", pb_utils.COUNTER)
    with pytest.raises(pb_utils.TritonModelException, match="buckets"):
        pb_utils.MetricFamily("t_hist", "h", pb_utils.HISTOGRAM).Metric()


def test_same_name_and_labels_share_one_series() -> None:
    assert not any(f.name == "t_shared" for f in CUSTOM_METRICS.collect())  # released
    one = pb_utils.MetricFamily("t_shared", "first", pb_utils.COUNTER).Metric({"m": "x"})
    two = pb_utils.MetricFamily("t_shared", "second", pb_utils.COUNTER).Metric({"m": "x"})
    one.increment(1)
    two.increment(1)
    assert one.value() == two.value() == 2


def test_families_leave_with_their_last_owner() -> None:
    metrics = CustomMetrics()
    for owner in ("a", "b"):
        metrics.set_owner(owner)
        family = metrics.family("t_owned", "d", pb_utils.HISTOGRAM)
        metrics.observe(metrics.series(family, {}, [1.0]), 0.5)
    (exported,) = metrics.collect()
    samples = {(s.name, s.labels.get("le")): s.value for s in exported.samples}
    assert samples == {
        ("t_owned_bucket", "1"): 2,
        ("t_owned_bucket", "+Inf"): 2,
        ("t_owned_count", None): 2,
        ("t_owned_sum", None): 1.0,
    }
    metrics.release("a")
    assert len(metrics.collect()) == 1
    metrics.release("b")
    assert metrics.collect() == []
