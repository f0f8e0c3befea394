"""A tritonserver command line, black-box: ``infermux serve`` started with Triton's flags
answers Triton's clients (HTTP and gRPC) with the name they check and the extensions it serves,
warns once for each flag without effect, and honours the ones it maps."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from infermux.dataplane.assembly import extensions
from infermux.settings import ServerSettings
from tests.e2e.test_tls import Pki
from tests.support import ServerProcess, start_server, write_model

pytestmark = pytest.mark.e2e

BROKEN_MODEL = "raise RuntimeError('this model does not load')\n"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("triton_repo")
    write_model(repo, "ident")
    return repo


@pytest.fixture(scope="module")
def triton_style(repository: Path) -> Iterator[ServerProcess]:
    with start_server(
        f"--model-store={repository}",
        "--strict-model-config=false",
        "--log-verbose=1",
        "--server-name",
        "triton",
        "--exit-on-error=false",
        "--allow-client-shm=true",
        "--backend-config=python,shm-default-byte-size=1048576",
        "--pinned-memory-pool-byte-size",
        "268435456",
        "--model-control-mode=explicit",
        "--load-model=*",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
    ) as server:
        yield server
        assert server.stop() == 0


def test_http_client_sees_the_name_and_extensions(triton_style: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(triton_style.url)
    metadata = client.get_server_metadata()
    assert metadata["name"] == "triton"
    assert metadata["extensions"] == list(extensions(ServerSettings(allow_client_shm=True)))
    assert "schedule_policy" in metadata["extensions"]
    assert client.is_model_ready("ident")


def test_grpc_client_sees_the_name_and_extensions(triton_style: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(triton_style.grpc_url)
    metadata = client.get_server_metadata()
    assert metadata.name == "triton"
    assert list(metadata.extensions) == list(extensions(ServerSettings(allow_client_shm=True)))
    as_json = client.get_server_metadata(as_json=True)
    assert as_json["name"] == "triton"


def test_each_flag_without_effect_is_one_warning_line(triton_style: ServerProcess) -> None:
    for flag in ("--backend-config", "--pinned-memory-pool-byte-size"):
        lines = [line for line in triton_style.log if flag in line]
        assert len(lines) == 1, lines
        assert "WARNING" in lines[0]
    # Flags with an effect here say nothing (--strict-model-config=false: configs may be
    # completed from the model, as in Triton).
    for flag in ("--log-verbose", "--strict-model-config"):
        assert not [line for line in triton_style.log if flag in line]


def test_default_name_is_infermux(examples_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(examples_server.url)
    assert client.get_server_metadata()["name"] == "infermux"


def run_serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infermux", "serve", "--http-port", "0", "--grpc-port", "0",
         "--metrics-port", "0", "--frontends", "1", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_exit_on_error_stops_when_a_model_fails_to_load(tmp_path: Path) -> None:
    write_model(tmp_path, "ident")
    write_model(tmp_path, "broken", source=BROKEN_MODEL)
    log = tmp_path / "server.log"
    done = run_serve("--model-store", str(tmp_path), "--exit-on-error=true", f"--log-file={log}")
    assert done.returncode == 1, done.stderr
    assert "--exit-on-error: failed to load broken" in done.stderr
    assert "broken" in log.read_text()  # the load error, logged to --log-file


def test_refused_flag_exits_2_naming_it() -> None:
    done = run_serve("--http-header-forward-pattern=x-.*")
    assert done.returncode == 2
    assert "--http-header-forward-pattern x-.*: not supported" in done.stderr


def test_grpc_use_ssl_is_tls_on_grpc_only(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    with start_server(
        "--grpc-use-ssl=true",
        f"--grpc-server-cert={pki.cert}",
        "--grpc-server-key",
        str(pki.key),
    ) as server:
        assert httpx.get(f"http://{server.url}/v2/health/ready").status_code == 200
        secure = grpcclient.InferenceServerClient(
            server.grpc_url, ssl=True, root_certificates=str(pki.ca_file)
        )
        assert secure.is_server_ready()
        assert server.stop() == 0
