"""The HTTP API's OpenAPI document: served at /openapi.json, the committed file, describing every
route the server has; and schemathesis fuzzing every operation it describes, black-box.

The fuzzed server runs with every optional operation on (explicit model control, client shared
memory), so that a 5xx can only be a fault. The checks: no 5xx (a 501/503 still counts as a
fault unless it carries the error document saying why, e.g. a ``file:`` load override, which
infermux refuses by design), and every status, content type and JSON response body as the
document says.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from importlib import resources
from typing import Any, cast

import pytest

from tests.support import ServerProcess, start_server

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.checks import not_a_server_error, positive_data_acceptance  # noqa: E402

from infermux.dataplane import Operations  # noqa: E402
from infermux.frontends.http.app import HttpApp  # noqa: E402

EXAMPLES = int(os.environ.get("INFERMUX_OPENAPI_EXAMPLES", "40"))  # per operation
MODELS = ["simple", "simple_string", "simple_identity", "identity_fp32"]  # the built-in examples
# not_a_server_error is replaced by the check above; positive_data_acceptance expects a 2xx for
# any schema-valid request, but a valid model name need not name a model (404), and Triton's
# protocol answers "not ready" with 400.
EXCLUDED = [not_a_server_error, positive_data_acceptance]
COMMITTED = (resources.files("infermux.frontends.http") / "openapi.json").read_bytes()


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with start_server(
        "--model-control-mode=explicit", "--load-model=*", "--allow-client-shm"
    ) as server:
        yield server
        assert server.stop() == 0


def fetch(server: ServerProcess, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{server.url}{path}", timeout=10) as response:
        return response.read()  # type: ignore[no-any-return]


def test_the_served_document_is_the_committed_one(server: ServerProcess) -> None:
    assert fetch(server, "/openapi.json") == COMMITTED
    document = json.loads(COMMITTED)
    assert document["openapi"].startswith("3.")


def example_path(template: str) -> str:
    return (
        template.replace("{model}", "simple")
        .replace("{version}", "1")
        .replace("{repository}", "main")
        .replace("{region}", "r0")
    )


def test_every_route_is_documented_and_every_documented_path_is_routed() -> None:
    documented = [example_path(p) for p in json.loads(COMMITTED)["paths"]]
    routes = HttpApp(cast(Operations, object())).route_patterns
    for pattern in routes:
        assert any(pattern.match(path) for path in documented), f"{pattern.pattern} undocumented"
    for path in documented:
        assert any(pattern.match(path) for pattern in routes), f"{path} is not served"


@pytest.fixture(scope="module")
def api(server: ServerProcess) -> Any:
    return schemathesis.openapi.from_url(f"http://{server.url}/openapi.json")


OPERATIONS = [
    (method.upper(), path)
    for path, methods in json.loads(COMMITTED)["paths"].items()
    for method in methods
]


# Parametrized by hand over the committed document (schemathesis' own pytest loader does not
# work with pytest 9); each operation gets its own Hypothesis run of generated requests.
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_fuzzed_operations_never_fault(api: Any, method: str, path: str) -> None:
    operation = api[path][method]

    @given(case=operation.as_strategy(), model=st.sampled_from(MODELS) | st.none())
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    def fuzz(case: Any, model: str | None) -> None:
        if model is not None and "model" in (case.path_parameters or {}):
            case.path_parameters["model"] = model  # reach a real model's code, not only 404s
        response = case.call(timeout=30)
        if response.status_code >= 500:
            refusal = response.status_code in (501, 503) and "error" in _json(response)
            assert refusal, (
                f"{method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
            )
        case.validate_response(response, excluded_checks=EXCLUDED)

    fuzz()


def _json(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
