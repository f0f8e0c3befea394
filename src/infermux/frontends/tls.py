"""TLS for the HTTP and gRPC front ends (``--tls-cert`` / ``--tls-key``).

One certificate and key (PEM) serve both protocols: HTTPS on every HTTP socket (one uvicorn
server serves them all, so ``--http-uds`` speaks TLS too), TLS on gRPC's TCP port; gRPC's unix
socket stays plain (who may connect is the socket file's permissions).
With ``--grpc-use-ssl`` (tritonserver's flags, ``settings.tls_http`` false) only gRPC is TLS.
The metrics port stays plain HTTP, as Triton's does (scrapers reach it inside the cluster).
The pair is loaded once at start-up, so a wrong path, a key that does not match the
certificate or an encrypted key fails there, naming the flag, before any model loads.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infermux.errors import StartupError
from infermux.settings import ServerSettings


@dataclass(frozen=True, slots=True)
class Tls:
    cert: Path
    key: Path
    cert_pem: bytes
    key_pem: bytes

    def grpc_credentials(self) -> Any:
        import grpc

        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)])


def load(settings: ServerSettings) -> Tls | None:
    """The server's TLS pair, checked; None when TLS is off."""
    cert, key = settings.tls_cert, settings.tls_key
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        missing = "--tls-cert" if cert is None else "--tls-key"
        raise StartupError(f"{missing} is needed too: TLS takes a certificate and its key")
    try:
        cert_pem, key_pem = cert.read_bytes(), key.read_bytes()
    except OSError as exc:
        flag = "--tls-cert" if exc.filename == str(cert) else "--tls-key"
        raise StartupError(f"{flag}: cannot read {exc.filename}: {exc.strerror}") from None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise StartupError(
            f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its unencrypted "
            f"private key ({exc.reason or exc})"
        ) from None
    return Tls(cert, key, cert_pem, key_pem)
