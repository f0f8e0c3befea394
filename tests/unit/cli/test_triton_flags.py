"""tritonserver's flags on ``infermux serve``: mapped ones land in the same settings as
infermux's own, the others warn once naming the flag, or are refused naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from infermux.cli import parse_settings
from infermux.cli.serve_options import parse_serve
from infermux.cli.triton_flags import FOREIGN


@pytest.mark.parametrize(
    ("triton", "own"),
    [
        (["--model-store", "{tmp}"], ["--model-repository", "{tmp}"]),
        (["--model-store={tmp}", "--model-store", "{tmp}"], ["--model-repository", "{tmp}"] * 2),
        (["--id", "triton"], ["--server-name", "triton"]),
        (["--id=triton"], ["--server-name=triton"]),
        (["--http-address", "0.0.0.0"], ["--host", "0.0.0.0"]),
        (["--grpc-address=0.0.0.0"], ["--host", "0.0.0.0"]),
        (["--metrics-address", "::1"], ["--host", "::1"]),
        (["--http-address", "0.0.0.0", "--grpc-address", "0.0.0.0"], ["--host", "0.0.0.0"]),
        (["--log-verbose=true"], ["--log-verbose", "1"]),
        (["--log-verbose", "false"], []),
        (["--model-control-mode=EXPLICIT"], ["--model-control-mode", "explicit"]),
        (["--exit-on-error=false"], []),
        (["--reuse-http-port=false", "--allow-cpu-metrics=0", "--rate-limit=off"], []),
        (["--model-namespacing=false", "--grpc-use-ssl-mutual=false"], []),
        (["--allow-sagemaker=false", "--allow-vertex-ai=off"], []),
        (["--grpc-infer-response-compression-level=NONE"], []),
        (["--model-load-retry-count=0"], []),
        (["--allow-http=true", "--allow-grpc=1", "--allow-metrics=on"], []),
    ],
)
def test_mapped_flags_land_in_the_same_settings(
    triton: list[str], own: list[str], tmp_path: Path
) -> None:
    def fill(args: list[str]) -> list[str]:
        return [a.replace("{tmp}", str(tmp_path)) for a in args]

    settings, warnings = parse_serve(fill(triton))
    assert settings == parse_settings(fill(own))
    assert warnings == []


@pytest.mark.parametrize(
    ("argv", "completes"),
    [
        ([], True),
        (["--strict-model-config=false"], True),
        (["--strict-model-config=true"], False),
        (["--disable-auto-complete-config"], False),
        (["--strict-model-config=false", "--disable-auto-complete-config"], False),
    ],
)
def test_auto_complete_flags_mean_what_they_mean_in_triton(
    argv: list[str], completes: bool
) -> None:
    settings, warnings = parse_serve(argv)
    assert settings.auto_complete_config is completes
    assert warnings == []


def test_flags_with_settings_of_their_own(tmp_path: Path) -> None:
    settings, warnings = parse_serve(
        [
            "--exit-on-error=true",
            "--model-load-thread-count",
            "2",
            "--log-file",
            str(tmp_path / "log"),
            "--log-info=false",
            "--log-warning",
            "false",
            "--log-error=0",
            "--exit-timeout-secs=0",
        ]
    )
    assert warnings == []
    assert settings.exit_on_error is True
    assert settings.model_load_threads == 2
    assert settings.log_file == tmp_path / "log"
    assert (settings.log_info, settings.log_warning, settings.log_error) == (False, False, False)
    assert settings.exit_timeout_secs == 0
    defaults = parse_settings([])
    assert defaults.exit_on_error is False
    assert defaults.model_load_threads == 4
    assert (defaults.log_info, defaults.log_warning, defaults.log_error) == (True, True, True)
    assert defaults.server_name == "infermux"
    assert defaults.host == "127.0.0.1"


def test_grpc_ssl_flags_are_tls_on_grpc_only(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    settings, warnings = parse_serve(
        ["--grpc-use-ssl=true", "--grpc-server-cert", str(cert), "--grpc-server-key", str(key)]
    )
    assert warnings == []
    assert (settings.tls_cert, settings.tls_key, settings.tls_http) == (cert, key, False)
    both = parse_settings(["--tls-cert", str(cert), "--tls-key", str(key)])
    assert (both.tls_cert, both.tls_key, both.tls_http) == (cert, key, True)


# One value of each flag infermux accepts with a warning (what a launch script might pass).
WARNED = {
    "--backend-config": "python,shm-default-byte-size=1048576",
    "--backend-directory": "/opt/tritonserver/backends",
    "--repoagent-directory": "/opt/tritonserver/repoagents",
    "--model-load-retry-count": "2",
    "--http-thread-count": "8",
    "--reuse-http-port": "true",
    "--reuse-grpc-port": "true",
    "--grpc-infer-allocation-pool-size": "16",
    "--grpc-infer-response-compression-level": "high",
    "--grpc-keepalive-time": "7200000",
    "--grpc-keepalive-timeout": "20000",
    "--grpc-keepalive-permit-without-calls": "true",
    "--grpc-http2-max-pings-without-data": "2",
    "--grpc-http2-min-recv-ping-interval-without-data": "300000",
    "--grpc-http2-max-ping-strikes": "2",
    "--grpc-max-connection-age": "60000",
    "--grpc-max-connection-age-grace": "5000",
    "--allow-cpu-metrics": "true",
    "--metrics-interval-ms": "2000",
    "--metrics-config": "summary_latencies=true",
    "--trace-file": "/tmp/trace.json",
    "--trace-level": "TIMESTAMPS",
    "--trace-rate": "100",
    "--trace-count": "-1",
    "--trace-log-frequency": "50",
    "--response-cache-byte-size": "1048576",
    "--cache-config": "local,size=1048576",
    "--cache-directory": "/opt/tritonserver/caches",
    "--rate-limit": "execution_count",
    "--rate-limit-resource": "R1:10:0",
    "--pinned-memory-pool-byte-size": "268435456",
    "--cuda-memory-pool-byte-size": "0:67108864",
    "--cuda-virtual-address-size": "0:1073741824",
    "--min-supported-compute-capability": "6.0",
    "--buffer-manager-thread-count": "2",
    "--host-policy": "gpu_0,numa-node=0",
    "--model-load-gpu-limit": "0:0.8",
}
REFUSED = {
    "--model-namespacing": "true",
    "--http-header-forward-pattern": "x-.*",
    "--grpc-header-forward-pattern": "x-.*",
    "--http-restricted-api": "model-repository:admin-key=secret",
    "--grpc-restricted-protocol": "model-repository:admin-key=secret",
    "--grpc-use-ssl-mutual": "true",
    "--allow-sagemaker": "true",
    "--allow-vertex-ai": "true",
}


def test_every_foreign_flag_is_exercised_here() -> None:
    assert {spec.flag for spec in FOREIGN} == set(WARNED) | set(REFUSED)
    assert {spec.flag for spec in FOREIGN if spec.action == "refuse"} == set(REFUSED)


@pytest.mark.parametrize(("flag", "value"), sorted(WARNED.items()))
@pytest.mark.parametrize("spelling", ["equals", "separate"])
def test_a_flag_without_effect_warns_once_naming_it(flag: str, value: str, spelling: str) -> None:
    argv = [f"{flag}={value}"] if spelling == "equals" else [flag, value]
    settings, warnings = parse_serve(argv)
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{flag} {value} ")
    assert settings == parse_settings([])


def test_a_repeated_flag_is_still_one_line() -> None:
    _, warnings = parse_serve(
        [
            "--backend-config",
            "python,a=1",
            "--backend-config=onnxruntime,b=2",
            "--http-thread-count=4",
        ]
    )
    assert warnings == [
        "--backend-config python,a=1 onnxruntime,b=2 is tritonserver's and has no effect: "
        "backends take their options from the model config's parameters (docs/backends.md)",
        "--http-thread-count 4 is tritonserver's and has no effect: HTTP runs on each "
        "front-end process's event loop (see --frontends)",
    ]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--grpc-server-cert", "c.pem"], "--grpc-server-cert c.pem"),
        (["--grpc-root-cert=ca.pem"], "--grpc-root-cert ca.pem"),
        (
            [
                "--grpc-use-ssl",
                "--grpc-server-cert=c.pem",
                "--grpc-server-key=k.pem",
                "--grpc-root-cert=ca.pem",
            ],
            "--grpc-root-cert ca.pem",
        ),
    ],
)
def test_flags_with_no_effect_in_context_warn(argv: list[str], named: str) -> None:
    _, warnings = parse_serve(argv)
    assert len(warnings) == 1
    assert warnings[0].startswith(named)


def exit_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        parse_serve(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize(("flag", "value"), sorted(REFUSED.items()))
def test_a_refused_flag_exits_2_naming_it(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert f"{flag} {value}: not supported" in exit_line([f"{flag}={value}"], capsys)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--exit-on-error=maybe"], "--exit-on-error"),
        (["--exit-on-error"], ""),  # a bare boolean means true: no error
        (["--strict-model-config", "sometimes"], "--strict-model-config"),
        (["--log-info=yes please"], "--log-info"),
        (["--log-verbose=loud"], "--log-verbose"),
        (["--model-load-thread-count=0"], "--model-load-thread-count"),
        (["--exit-timeout-secs=-1"], "--exit-timeout-secs"),
        (["--model-control-mode=sometimes"], "--model-control-mode"),
        (["--backend-config=python"], "--backend-config"),
        (["--backend-config=python,x="], "--backend-config"),
        (["--cuda-memory-pool-byte-size=67108864"], "--cuda-memory-pool-byte-size"),
        (["--model-load-gpu-limit=0:most"], "--model-load-gpu-limit"),
        (["--pinned-memory-pool-byte-size=lots"], "--pinned-memory-pool-byte-size"),
        (["--rate-limit=sometimes"], "--rate-limit"),
        (["--http-thread-count=0"], "--http-thread-count"),
        (["--reuse-grpc-port=2"], "--reuse-grpc-port"),
        (["--http-address=0.0.0.0", "--grpc-address=127.0.0.1"], "--http-address 0.0.0.0"),
        (["--host=127.0.0.1", "--metrics-address=0.0.0.0"], "--metrics-address 0.0.0.0"),
        (["--grpc-use-ssl=true", "--grpc-server-cert=c.pem"], "--grpc-server-key"),
        (
            ["--grpc-use-ssl", "--grpc-server-cert=c", "--grpc-server-key=k", "--tls-cert=c"],
            "--tls-cert",
        ),
    ],
)
def test_bad_values_exit_2_naming_the_flag(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if not named:
        parse_serve(argv)
        return
    assert named in exit_line(argv, capsys)
