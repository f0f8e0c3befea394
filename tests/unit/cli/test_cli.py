from __future__ import annotations

from pathlib import Path

import pytest

from infermux import __version__
from infermux.cli import auto_executors, main, parse_settings
from infermux.settings import (
    HttpLimits,
    ServerSettings,
    TraceSettings,
    builtin_repositories,
    builtin_repository,
    default_channel_poll_us,
    parse_trace_config,
)


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
        ["--executors", "0"],
        ["--executors", "17"],
        ["--executors", "some"],
        ["--frontends", "65"],
        ["--max-shm-regions", "0"],
        ["--executor-ready-timeout-ms", "0"],
        ["--tls-cert", "c.pem"],
        ["--frontend-heartbeat-timeout-secs", "-1"],
        ["--frontend-heartbeat-timeout-secs", "nan"],
        ["--executor-heartbeat-timeout-secs", "soon"],
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


def test_the_readiness_bound_defaults_to_a_second() -> None:
    assert parse_settings([]).executor_ready_timeout_ms == 1000
    given = parse_settings(["--executor-ready-timeout-ms", "250"])
    assert given.executor_ready_timeout_ms == 250


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_unknown_command_exits_2() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["frobnicate"])
    assert exited.value.code == 2


@pytest.mark.parametrize(
    ("flag", "setting"),
    [
        ("--gpu-completion-spin-us", "gpu_completion_spin_us"),
        ("--channel-poll-us", "channel_poll_us"),
    ],
)
def test_low_load_polling_flags(flag: str, setting: str) -> None:
    default = default_channel_poll_us() if setting == "channel_poll_us" else 2000
    assert getattr(parse_settings([]), setting) == default
    assert getattr(parse_settings([flag, "0"]), setting) == 0
    assert getattr(parse_settings([flag, "700"]), setting) == 700
    with pytest.raises(SystemExit):
        parse_settings([flag, "-1"])


def test_the_channel_polls_by_default_only_with_cores_to_spare() -> None:
    """Both ends of a channel spin while they poll: on 2 cores that took the client's CPU."""
    assert default_channel_poll_us(2) == 0
    assert default_channel_poll_us(3) == 0
    assert default_channel_poll_us(4) == 2000
    assert default_channel_poll_us(16) == 2000
    assert ServerSettings().channel_poll_us == default_channel_poll_us()


def test_observability_flags() -> None:
    defaults = parse_settings([])
    assert defaults.allow_metrics is True
    assert defaults.allow_gpu_metrics is True
    assert defaults.trace.enabled is False
    assert defaults.log_format == "default"
    settings = parse_settings(
        [
            "--allow-metrics=false",
            "--allow-gpu-metrics",
            "false",
            "--log-format",
            "json",
            "--trace-config",
            "mode=opentelemetry",
            "--trace-config",
            "rate=10",
            "--trace-config",
            "opentelemetry,url=http://collector:4318/v1/traces",
            "--trace-config",
            "opentelemetry,resource=deployment.environment=prod",
        ]
    )
    assert settings.allow_metrics is False
    assert settings.allow_gpu_metrics is False
    assert settings.log_format == "json"
    assert settings.trace == TraceSettings(
        level="TIMESTAMPS",
        rate=10,
        url="http://collector:4318/v1/traces",
        resource=(("deployment.environment", "prod"),),
    )
    assert settings.trace.enabled
    # An explicit level wins over the one naming the mode implies, in either order.
    off = parse_settings(["--trace-config", "level=OFF", "--trace-config", "mode=opentelemetry"])
    assert not off.trace.enabled


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("mode=triton", "only mode=opentelemetry"),
        ("rate=0", "rate must be a positive integer"),
        ("rate=x", "rate must be a positive integer"),
        ("level=TENSORS", "level must be OFF or TIMESTAMPS"),
        ("opentelemetry,url=collector:4318", "url must be an http(s) OTLP endpoint"),
        ("opentelemetry,resource=novalue", "resource must be KEY=VALUE"),
        ("triton,file=/tmp/trace.json", "only opentelemetry settings"),
        ("count=5", "unknown setting 'count'"),
        ("rate", "expected SETTING=VALUE"),
    ],
)
def test_bad_trace_config_exits_2_naming_the_item(
    item: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--trace-config", item])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"--trace-config '{item}'" in err
    assert message in err


def test_parse_trace_config_directly() -> None:
    assert parse_trace_config([]) == TraceSettings()
    with pytest.raises(ValueError, match="'rate=-1'"):
        parse_trace_config(["rate=-1"])


def test_heartbeat_flags() -> None:
    defaults = parse_settings([])
    assert defaults.frontend_heartbeat_timeout_secs == 5.0
    assert defaults.executor_heartbeat_timeout_secs == 0.0  # executors are not killed unasked
    settings = parse_settings(
        ["--frontend-heartbeat-timeout-secs", "0", "--executor-heartbeat-timeout-secs", "30"]
    )
    assert settings.frontend_heartbeat_timeout_secs == 0.0
    assert settings.executor_heartbeat_timeout_secs == 30.0


def test_executors_flag() -> None:
    assert parse_settings([]).executors == 1
    assert parse_settings(["--executors", "3", "--frontends", "2"]).executors == 3
    assert parse_settings(["--executors", "auto"]).executors >= 1


@pytest.mark.parametrize(
    ("visible", "expected"), [("0,1", 2), ("3", 1), ("", 1), ("-1", 1), ("0,1,2,3", 4)]
)
def test_auto_executors_counts_the_visible_gpus(visible: str, expected: int) -> None:
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("one executor off x86-64")
    assert auto_executors({"CUDA_VISIBLE_DEVICES": visible}) == expected


def test_http_limit_flags() -> None:
    assert parse_settings([]).http_limits == HttpLimits()
    limits = parse_settings(
        ["--http-max-header-size", "4096", "--http-max-header-line-size", "1024",
         "--http-max-header-count", "20", "--http-header-timeout", "0.5",
         "--http-body-timeout", "2.5", "--http-keep-alive-timeout", "1",
         "--http-max-connections", "7"]
    ).http_limits  # fmt: skip
    assert limits == HttpLimits(
        max_header_size=4096, max_header_line_size=1024, max_header_count=20,
        header_timeout=0.5, body_timeout=2.5, keep_alive_timeout=1.0, max_connections=7,
    )  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [["--http-header-timeout", "0"], ["--http-max-connections", "-1"],
     ["--http-max-header-size", "x"], ["--http-header-timeout", "nan"],
     ["--http-body-timeout", "inf"], ["--execution-timeout-ms", "nan"]],
)  # fmt: skip
def test_bad_http_limits_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings(args)
    assert info.value.code == 2
    assert args[0] in capsys.readouterr().err
