"""The shared V2 payloads give identical answers over HTTP JSON, HTTP binary and gRPC."""

from __future__ import annotations

import numpy as np
import pytest

from tests.payloads import TRANSPORTS, Payload, load_payloads, run_payload
from tests.support import ServerProcess

pytestmark = pytest.mark.e2e

PAYLOADS = load_payloads()


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("payload", PAYLOADS, ids=[p.name for p in PAYLOADS])
def test_payload(examples_server: ServerProcess, payload: Payload, transport: str) -> None:
    got = run_payload(payload, transport, examples_server.url, examples_server.grpc_url)
    for name, (_, expected) in payload.outputs.items():
        np.testing.assert_array_equal(got[name], expected)
        assert got[name].shape == expected.shape
