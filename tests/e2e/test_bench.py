"""``infermux bench`` against a real ``infermux serve`` (the CI smoke): small runs over HTTP,
gRPC, system shared memory and open loop from two processes, checked against the server's own
statistics; reports and errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from infermux.bench.options import parse_options
from infermux.bench.run import BenchError, run
from tests.support import ServerProcess, start_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with start_server("--allow-client-shm") as server:
        yield server


@pytest.mark.parametrize(
    ("protocol", "extra"),
    [("http", []), ("grpc", []), ("http", ["--shared-memory", "system"]),
     ("grpc", ["--shared-memory", "system"]),
     ("http", ["--request-rate-range", "200", "--request-distribution", "poisson"])],
)  # fmt: skip
def test_a_small_run_against_a_real_server(
    server: ServerProcess, tmp_path: Path, protocol: str, extra: list[str]
) -> None:
    url = server.grpc_url if protocol == "grpc" else server.url
    args = ["simple", "-u", url, "-i", protocol, "--concurrency-range", "1:2", "-p", "0.5"]
    args += ["--warmup", "0.2", "--max-trials", "3", "--processes", "2", *extra]
    args += ["--json", str(tmp_path / "r.json"), "-f", str(tmp_path / "r.csv")]
    levels = run(parse_options(args))
    assert levels
    for level in levels:
        assert level.failures == 0
        assert level.requests_per_s > 0
        # The server saw the measured requests (its counters bracket the windows).
        assert level.server["requests"] > 0
        assert level.server["compute_infer_us"] > 0
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["tool"] == "infermux bench"
    assert len(doc["levels"]) == len(levels)
    assert len((tmp_path / "r.csv").read_text().splitlines()) == len(levels) + 1


def test_errors_are_clear(server: ServerProcess) -> None:
    with pytest.raises(BenchError, match="cannot reach model 'nope'"):
        run(parse_options(["nope", "-u", server.url]))
    with pytest.raises(BenchError, match="--input-data /nowhere"):
        run(parse_options(["simple", "-u", server.url, "--input-data", "/nowhere"]))


def test_plot(server: ServerProcess, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    for name in ("plot.png", "plot.html"):
        args = ["simple", "-u", server.url, "-p", "0.3", "--warmup", "0", "--max-trials", "3"]
        run(parse_options([*args, "--plot", str(tmp_path / name)]))
        assert (tmp_path / name).stat().st_size > 1000


def test_cli_entry(server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    from infermux.cli import main

    assert (
        main(
            ["bench", "simple", "-u", server.url, "-p", "0.3", "--warmup", "0", "--max-trials", "3"]
        )
        == 0
    )
    assert main(["bench", "nope", "-u", server.url]) == 1
    assert "infermux bench: error" in capsys.readouterr().err
