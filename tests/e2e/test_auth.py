"""``--auth-token-file`` / ``--admin-token-file``: bearer tokens over HTTP and gRPC, black-box.

Health is always open; inference, metadata and statistics need the inference token; admin
endpoints (repository load/unload, shared-memory registration, traffic changes) need the admin
token, and are refused outright when only an inference token is set.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess, start_server

TOKEN, ADMIN = "inference-secret", "admin-secret"
SIMPLE = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def metadata(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}  # gRPC metadata keys are lower-case


def serve(tmp: Path, *, admin: bool, frontends: int = 1) -> ServerProcess:
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "admin").write_text(ADMIN)
    flags = ["--auth-token-file", str(tmp / "token")]
    if admin:
        flags += ["--admin-token-file", str(tmp / "admin")]
    return start_server(*flags, "--model-control-mode", "explicit", "--load-model", "simple",
                        "--allow-client-shm", "--frontends", str(frontends),
                        "--ipc-arena-mb", "4")  # fmt: skip


@pytest.fixture(scope="module")
def inference_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serve(tmp_path_factory.mktemp("auth"), admin=False) as server:
        yield server
        assert server.stop() == 0


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-front-ends"])
def both(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with serve(tmp_path_factory.mktemp("auth"), admin=True, frontends=request.param) as server:
        yield server
        assert server.stop() == 0


def test_health_is_open_and_inference_needs_the_token(inference_only: ServerProcess) -> None:
    base = f"http://{inference_only.url}"
    with httpx.Client(base_url=base, timeout=10) as client:
        assert client.get("/v2/health/ready").status_code == 200
        missing = client.post("/v2/models/simple/infer", json=SIMPLE)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Bearer")
        assert "Authorization: Bearer" in missing.json()["error"]
        wrong = client.post("/v2/models/simple/infer", json=SIMPLE, headers=bearer("nope"))
        assert wrong.status_code == 401
        assert client.get("/v2/models/simple", headers=bearer("nope")).status_code == 401
        right = client.post("/v2/models/simple/infer", json=SIMPLE, headers=bearer(TOKEN))
        assert right.status_code == 200, right.text
        assert client.get("/v2/models/stats", headers=bearer(TOKEN)).status_code == 200
        # No admin token configured: admin endpoints are off, whatever the token.
        load = client.post("/v2/repository/models/simple/load", headers=bearer(TOKEN))
        assert load.status_code == 403
        assert "--admin-token-file" in load.json()["error"]
        register = client.post(
            "/v2/systemsharedmemory/region/r/register",
            json={"key": "k", "offset": 0, "byte_size": 8},
            headers=bearer(TOKEN),
        )
        assert register.status_code == 403


def test_grpc_takes_the_token_from_metadata(inference_only: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(inference_only.grpc_url) as client:
        assert client.is_server_live()
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
            client.get_model_metadata("simple")
        meta = client.get_model_metadata("simple", headers=metadata(TOKEN))
        assert meta.name == "simple"
        tensors = []
        for name in ("INPUT0", "INPUT1"):
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            tensor.set_data_from_numpy(np.full((1, 16), 2, dtype=np.int32))
            tensors.append(tensor)
        out = client.infer("simple", tensors, headers=metadata(TOKEN)).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, np.full((1, 16), 4, dtype=np.int32))
        with pytest.raises(InferenceServerException, match="PERMISSION_DENIED"):
            client.unload_model("simple", headers=metadata(TOKEN))


def test_admin_endpoints_need_the_admin_token(both: ServerProcess) -> None:
    with httpx.Client(base_url=f"http://{both.url}", timeout=30) as client:
        # Inference: the inference token, or the admin token.
        for token in (TOKEN, ADMIN):
            reply = client.post("/v2/models/simple/infer", json=SIMPLE, headers=bearer(token))
            assert reply.status_code == 200, reply.text
        # Admin: only the admin token.
        for path in ("/v2/repository/models/simple/load", "/v2/models/simple/traffic/rollback"):
            assert client.post(path, headers=bearer(TOKEN)).status_code == 401
        assert client.get("/v2/models/simple/traffic", headers=bearer(TOKEN)).status_code == 200
        policy = client.post(
            "/v2/models/simple/traffic", content=b'{"weights": {"1": 1}}', headers=bearer(TOKEN)
        )
        assert policy.status_code == 401
        load = client.post("/v2/repository/models/simple/load", headers=bearer(ADMIN))
        assert load.status_code == 200, load.text
    with grpcclient.InferenceServerClient(both.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
            client.load_model("simple", headers=metadata(TOKEN))
        client.load_model("simple", headers=metadata(ADMIN))
        assert client.is_model_ready("simple", headers=metadata(TOKEN))


def test_a_missing_token_file_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="--auth-token-file: cannot read"):
        start_server("--auth-token-file", str(tmp_path / "missing"), timeout=60)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(RuntimeError, match=r"--admin-token-file: .* must hold one token"):
        start_server("--admin-token-file", str(tmp_path / "empty"), timeout=60)
