from __future__ import annotations

from pathlib import Path

import pytest

from infermux import __version__
from infermux.cli import main, parse_settings
from infermux.settings import builtin_repositories, builtin_repository


def test_defaults_serve_the_builtin_examples() -> None:
    settings = parse_settings([])
    assert settings.model_repositories == builtin_repositories()
    assert settings.model_repositories[0] == builtin_repository()
    assert (builtin_repository() / "simple" / "config.pbtxt").is_file()
    assert settings.host == "127.0.0.1"
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8000, 8001, 8002)
    assert settings.strict_readiness is True
    assert settings.allow_client_shm is False


def test_triton_style_flags(tmp_path: Path) -> None:
    settings = parse_settings(
        [
            "--model-repository",
            str(tmp_path),
            "--model-repository",
            str(tmp_path),
            "--model-control-mode=explicit",
            "--load-model",
            "a",
            "--load-model=*",
            "--strict-readiness=false",
            "--allow-client-shm",
            "--log-verbose=2",
            "--repository-poll-secs",
            "0.5",
            "--http-max-input-size",
            "1024",
        ]
    )
    assert settings.model_repositories == (tmp_path, tmp_path)
    assert settings.load_models == ("a", "*")
    assert settings.strict_readiness is False
    assert settings.allow_client_shm is True
    assert settings.log_verbose == 2
    assert settings.repository_poll_secs == 0.5
    assert settings.http_max_input_size == 1024


@pytest.mark.parametrize(
    "args",
    [
        ["--log-verbose", "-1"],
        ["--http-max-input-size", "0"],
        ["--repository-poll-secs", "x"],
        ["--exit-timeout-secs", "abc"],
        ["--http-port", "http"],
    ],
)
def test_invalid_values_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(args)
    assert exited.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "serve" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_unknown_command_exits_2() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["frobnicate"])
    assert exited.value.code == 2
