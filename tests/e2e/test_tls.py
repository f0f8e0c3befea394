"""``--tls-cert`` / ``--tls-key``: HTTPS and gRPC over TLS, black-box.

A throw-away CA and a server certificate for 127.0.0.1 are made in the test (trustme); clients
that trust the CA get answers over both protocols, with one process and with several; plain
clients get none; a bad pair stops the server at start-up, naming the flag.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import trustme
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess, start_server

SIMPLE = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]
}


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca = trustme.CA()
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.cert, self.key, self.ca_file = root / "cert.pem", root / "key.pem", root / "ca.pem"
        server.cert_chain_pems[0].write_to_path(str(self.cert))
        for extra in server.cert_chain_pems[1:]:
            extra.write_to_path(str(self.cert), append=True)
        server.private_key_pem.write_to_path(str(self.key))
        self.ca.cert_pem.write_to_path(str(self.ca_file))

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-front-ends"])
def server(request: pytest.FixtureRequest, pki: Pki) -> Iterator[ServerProcess]:
    frontends = str(request.param)
    with start_server("--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
                      "--frontends", frontends, "--ipc-arena-mb", "4") as running:  # fmt: skip
        yield running
        assert running.stop() == 0


def test_https_answers_a_client_that_trusts_the_ca(server: ServerProcess, pki: Pki) -> None:
    assert any("HTTP on https://" in line for line in server.log)
    with httpx.Client(verify=pki.client_context()) as client:
        assert client.get(f"https://{server.url}/v2/health/ready").status_code == 200
        answer = client.post(f"https://{server.url}/v2/models/simple/infer", json=SIMPLE)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    assert outputs["OUTPUT0"] == [i + 1 for i in range(16)]


def test_plain_http_gets_no_answer(server: ServerProcess) -> None:
    with pytest.raises(httpx.HTTPError), httpx.Client() as client:
        client.get(f"http://{server.url}/v2/health/ready", timeout=5)


def test_grpc_over_tls(server: ServerProcess, pki: Pki) -> None:
    with grpcclient.InferenceServerClient(
        server.grpc_url, ssl=True, root_certificates=str(pki.ca_file)
    ) as client:
        assert client.is_server_ready()
        tensors = []
        for name in ("INPUT0", "INPUT1"):
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            tensor.set_data_from_numpy(np.full((1, 16), 3, dtype=np.int32))
            tensors.append(tensor)
        out = client.infer("simple", tensors).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, np.full((1, 16), 6, dtype=np.int32))


def test_plaintext_grpc_gets_no_answer(server: ServerProcess) -> None:
    with (
        grpcclient.InferenceServerClient(server.grpc_url) as client,
        pytest.raises(InferenceServerException),
    ):
        client.is_server_ready(client_timeout=5)


def _serve(*flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "infermux", "serve", "--http-port", "0", "--grpc-port", "0",
               "--metrics-port", "0", "--frontends", "1", *flags]  # fmt: skip
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)


def test_a_key_that_is_not_the_certificates_stops_the_start(tmp_path: Path, pki: Pki) -> None:
    other = Pki(tmp_path)
    done = _serve("--tls-cert", str(pki.cert), "--tls-key", str(other.key))
    assert done.returncode != 0
    assert "--tls-cert" in done.stderr
    assert "ready" not in done.stderr


def test_a_certificate_without_its_key_is_refused(pki: Pki) -> None:
    done = _serve("--tls-cert", str(pki.cert))
    assert done.returncode == 2
    assert "--tls-cert and --tls-key go together" in done.stderr


def test_an_unreadable_certificate_is_named(tmp_path: Path, pki: Pki) -> None:
    done = _serve("--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", str(pki.key))
    assert done.returncode != 0
    assert "--tls-cert: cannot read" in done.stderr
