"""The access rules, transport-free: which token allows which kind of endpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from infermux.errors import StartupError
from infermux.frontends.access import OPEN, Access, Denied, Kind, load
from infermux.frontends.grpc.access import kind_of
from infermux.settings import ServerSettings

BOTH = Access(b"inf", b"adm")


def allowed(access: Access, kind: Kind, header: str | None) -> bool | str:
    try:
        access.check(kind, header)
    except Denied as denied:
        return "401" if denied.unauthenticated else "403"
    return True


@pytest.mark.parametrize(
    ("access", "kind", "header", "expected"),
    [
        (OPEN, Kind.ADMIN, None, True),
        (BOTH, Kind.HEALTH, None, True),
        (BOTH, Kind.INFERENCE, None, "401"),
        (BOTH, Kind.INFERENCE, "Bearer inf", True),
        (BOTH, Kind.INFERENCE, "bearer  inf ", True),
        (BOTH, Kind.INFERENCE, "Bearer adm", True),  # the admin token allows inference too
        (BOTH, Kind.INFERENCE, "Basic inf", "401"),
        (BOTH, Kind.INFERENCE, "Bearer infx", "401"),
        (BOTH, Kind.ADMIN, "Bearer inf", "401"),
        (BOTH, Kind.ADMIN, "Bearer adm", True),
        (Access(b"inf", None), Kind.ADMIN, "Bearer inf", "403"),  # admin off
        (Access(None, b"adm"), Kind.INFERENCE, None, True),  # only admin protected
        (Access(None, b"adm"), Kind.ADMIN, None, "401"),
    ],
)
def test_rules(access: Access, kind: Kind, header: str | None, expected: bool | str) -> None:
    assert allowed(access, kind, header) == expected


def test_grpc_methods_are_classified() -> None:
    service = "/inference.GRPCInferenceService/"
    assert kind_of(service + "ServerReady") is Kind.HEALTH
    assert kind_of(service + "ModelInfer") is Kind.INFERENCE
    assert kind_of(service + "ModelStreamInfer") is Kind.INFERENCE
    assert kind_of(service + "RepositoryModelLoad") is Kind.ADMIN
    assert kind_of(service + "SystemSharedMemoryRegister") is Kind.ADMIN
    assert kind_of(service + "SystemSharedMemoryStatus") is Kind.INFERENCE


def test_token_files(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("  abc\n")
    access = load(ServerSettings(auth_token_file=tmp_path / "t"))
    assert access == Access(b"abc", None)
    (tmp_path / "two").write_text("a b")
    with pytest.raises(StartupError, match=r"--admin-token-file: .* one token"):
        load(ServerSettings(admin_token_file=tmp_path / "two"))
