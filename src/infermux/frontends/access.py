"""Who may call what: bearer tokens for inference and for admin endpoints (``--auth-token-file``,
``--admin-token-file``), the same rules for HTTP and gRPC.

Three kinds of endpoint:

- **health** (live, ready): always open, so that load balancers and orchestrators need no secret;
- **inference** (inference, metadata, config, statistics, repository index, shared-memory
  status, the traffic report): need the inference token when one is set;
- **admin** (repository load/unload, shared-memory register/unregister, traffic policy changes,
  promote, rollback, trace and log settings): need the admin token when one is set, and are
  **refused** when only an inference token is set: a server that authenticates its clients does
  not let every client reconfigure it unless an admin token says who may.

With no token at all everything is open, as before (the server binds 127.0.0.1 by default).
Tokens come from files, not flags, so that they do not show in process listings; they are
compared in constant time. The metrics port is not covered (Prometheus scrapes it; bind it
where only the scraper reaches, as with Triton).
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass
from pathlib import Path

from infermux.errors import StartupError
from infermux.settings import ServerSettings


class Kind(enum.Enum):
    HEALTH = "health"
    INFERENCE = "inference"
    ADMIN = "admin"


class Denied(Exception):
    """The call is not allowed: ``unauthenticated`` (no or wrong token: HTTP 401, gRPC
    UNAUTHENTICATED) or not permitted at all (HTTP 403, gRPC PERMISSION_DENIED)."""

    def __init__(self, message: str, *, unauthenticated: bool) -> None:
        super().__init__(message)
        self.message = message
        self.unauthenticated = unauthenticated


@dataclass(frozen=True, slots=True)
class Access:
    inference_token: bytes | None = None
    admin_token: bytes | None = None

    @property
    def open(self) -> bool:
        """No token set: every call is allowed (nothing to check per request)."""
        return self.inference_token is None and self.admin_token is None

    def check(self, kind: Kind, authorization: str | None) -> None:
        """Raise :class:`Denied` unless ``authorization`` (the ``Authorization`` header or
        gRPC metadata value) allows a call of ``kind``."""
        if kind is Kind.HEALTH or self.open:
            return
        if kind is Kind.ADMIN:
            if self.admin_token is None:
                raise Denied(
                    "admin endpoints are disabled: start the server with --admin-token-file "
                    "to allow them",
                    unauthenticated=False,
                )
            wanted = self.admin_token
        elif self.inference_token is None:
            return  # only admin endpoints are protected
        else:
            wanted = self.inference_token
        given = _bearer(authorization)
        if given is None:
            raise Denied(
                f"{kind.value} endpoints need 'Authorization: Bearer <token>'",
                unauthenticated=True,
            )
        # An admin token also allows what the inference token allows.
        allowed = [wanted] if kind is Kind.ADMIN else [wanted, self.admin_token]
        if not any(t is not None and hmac.compare_digest(given, t) for t in allowed):
            raise Denied(f"the bearer token does not allow {kind.value} endpoints",
                         unauthenticated=True)  # fmt: skip


OPEN = Access()
"""No tokens: every call allowed."""


def _bearer(authorization: str | None) -> bytes | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip().encode()


def load(settings: ServerSettings) -> Access:
    """The server's tokens, read once at start-up (errors name the flag)."""
    return Access(
        _token("--auth-token-file", settings.auth_token_file),
        _token("--admin-token-file", settings.admin_token_file),
    )


def _token(flag: str, path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        token = path.read_bytes().strip()
    except OSError as exc:
        raise StartupError(f"{flag}: cannot read {path}: {exc.strerror}") from None
    if not token or any(c in token for c in b" \t\r\n"):
        raise StartupError(f"{flag}: {path} must hold one token (no spaces), and not be empty")
    return token
