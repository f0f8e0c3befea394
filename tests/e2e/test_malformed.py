"""10,000 malformed requests against a running ``infermux serve``: no 5xx, no crash, and the
server healthy and answering correctly afterwards (issue 11's fuzzing target, black-box).

Requests are valid ones mutated by a seeded generator (so a failure replays): truncated or
bit-flipped bodies, wrong ``Inference-Header-Content-Length``, JSON with fields of the wrong type
or size, unknown models and versions, wrong methods and paths, garbage compression headers;
over gRPC, protobuf requests with fuzzed names, datatypes, shapes, contents and shared-memory
references.
"""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tests.support import ServerProcess, start_server

HTTP_REQUESTS = 8_000
GRPC_REQUESTS = 2_000
VALID = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]
}
WRONG = [None, True, -1, 0, 2**63, 1.5, "", "x" * 300, [], {}, [[1]], {"a": 1}, "FP32", [-1, 16]]
PATHS = ["/v2/models/simple/infer", "/v2/models/simple/versions/1/infer", "/v2/models/nope/infer",
         "/v2/models/simple/versions/99/infer", "/v2/models/simple/versions/x/infer",
         "/v2/models/%2e%2e/infer", "/v2/models/simple/config", "/v2/repository/index",
         "/v2/systemsharedmemory/region/r/register", "/v2/models/simple/traffic",
         "/v2/models/simple/traffic/promote", "/v2//models",
         "/v2/models/" + "a" * 2000 + "/infer"]  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with start_server("--allow-client-shm") as running:
        yield running
        assert running.stop() == 0


def _wrong(rng: random.Random) -> Any:
    return copy.deepcopy(rng.choice(WRONG))  # a fresh value: mutations must not build cycles


def _mutated_body(rng: random.Random) -> tuple[bytes, dict[str, str]]:
    doc: Any = json.loads(json.dumps(VALID))
    headers: dict[str, str] = {"content-type": "application/json"}
    for _ in range(rng.randint(1, 3)):
        inputs = doc.get("inputs") if isinstance(doc, dict) else None
        item = rng.choice(inputs) if isinstance(inputs, list) and inputs else {}
        choice = rng.randrange(6)
        if choice == 0 and isinstance(item, dict):
            item[rng.choice(["name", "datatype", "shape", "data", "parameters"])] = rng.choice(
                WRONG
            )
        elif choice == 1 and isinstance(doc, dict):
            doc[rng.choice(["inputs", "outputs", "id", "parameters"])] = _wrong(rng)
        elif choice == 2 and isinstance(item, dict):
            item.pop("data", None)
            item["parameters"] = {"binary_data_size": rng.choice([-1, 0, 3, 64, 2**40])}
        elif choice == 3 and isinstance(item, dict):
            item["shape"] = [rng.randint(-3, 2**31) for _ in range(rng.randint(0, 4))]
            if rng.random() < 0.2:  # past numpy's 64 dimensions (issue 23: was a 500)
                item["shape"] = [1] * rng.randint(60, 70)
        elif choice == 4 and isinstance(item, dict):
            item["parameters"] = {"shared_memory_region": rng.choice(["r", "", 5]),
                                  "shared_memory_byte_size": rng.choice([-1, 64, 2**62]),
                                  "shared_memory_offset": rng.choice([-5, 0, "x"])}  # fmt: skip
        else:
            doc = rng.choice([_wrong(rng), doc])
    body = json.dumps(doc).encode()
    style = rng.randrange(5)
    if style == 0:
        body = body[: rng.randrange(len(body) + 1)]
    elif style == 1 and body:
        flipped = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        body = bytes(flipped)
    elif style == 2:
        headers["inference-header-content-length"] = str(rng.randint(-5, len(body) + 50))
        body += rng.randbytes(rng.randint(0, 64))
    elif style == 3:
        headers["content-encoding"] = rng.choice(["gzip", "deflate", "br", "x"])
    return body, headers


def test_ten_thousand_malformed_requests_get_4xx_and_the_server_stays_healthy(
    server: ServerProcess,
) -> None:
    rng = random.Random(11)
    statuses: Counter[int] = Counter()
    with httpx.Client(base_url=f"http://{server.url}", timeout=30) as client:
        for _ in range(HTTP_REQUESTS):
            body, headers = _mutated_body(rng)
            method = rng.choices(["POST", "GET", "PUT", "DELETE"], weights=[8, 1, 1, 1])[0]
            path = rng.choice(PATHS) if rng.random() < 0.3 else PATHS[0]
            reply = client.request(method, path, content=body, headers=headers)
            statuses[reply.status_code] += 1
            assert reply.status_code < 500, (method, path, body[:200], headers, reply.text)
    statuses.update(_grpc_fuzz(server, rng))
    with httpx.Client(base_url=f"http://{server.url}", timeout=30) as client:
        assert client.get("/v2/health/live").status_code == 200
        assert client.get("/v2/health/ready").status_code == 200
        good = client.post("/v2/models/simple/infer", json=VALID)
        assert good.status_code == 200
        assert good.json()["outputs"][0]["data"] == [i + 1 for i in range(16)]
    assert server.process.poll() is None
    assert sum(statuses.values()) == HTTP_REQUESTS + GRPC_REQUESTS
    assert statuses[200] < HTTP_REQUESTS // 2, statuses  # they were mostly malformed


def _grpc_fuzz(server: ServerProcess, rng: random.Random) -> Counter[int]:
    """Fuzzed ModelInferRequests; a bad one must be a client error, never INTERNAL/UNKNOWN."""
    outcomes: Counter[int] = Counter()
    bad = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}
    datatypes = ["INT32", "FP32", "BYTES", "BOOL", "int32", "", "FP8"]
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for _ in range(GRPC_REQUESTS):
            request = service_pb2.ModelInferRequest(
                model_name=rng.choice(["simple", "simple", "nope", ""]),
                model_version=rng.choice(["", "", "1", "7", "x"]),
            )
            for name in rng.sample(["INPUT0", "INPUT1", "X", ""], rng.randint(0, 3)):
                tensor = request.inputs.add(
                    name=name,
                    datatype=rng.choice(datatypes),
                    shape=[rng.choice([1, 16, -1, 0, 2**40]) for _ in range(rng.randint(0, 3))]
                    if rng.random() < 0.9
                    else [1] * rng.randint(60, 70),  # past numpy's 64 dimensions
                )
                if rng.random() < 0.4:
                    tensor.contents.int_contents.extend(range(rng.randint(0, 20)))
                if rng.random() < 0.2:
                    tensor.parameters["shared_memory_region"].string_param = "r"
                    tensor.parameters["shared_memory_byte_size"].int64_param = rng.randint(-1, 99)
                if rng.random() < 0.5:
                    request.raw_input_contents.append(
                        np.arange(rng.randint(0, 20), dtype=np.int32).tobytes()
                    )
            try:
                call(request.SerializeToString(), timeout=30)
                outcomes[200] += 1
            except grpc.RpcError as exc:
                outcomes[400] += 1
                failure = (exc.code(), exc.details(), request)
            else:
                continue
            assert failure[0] not in bad, failure
    return outcomes
