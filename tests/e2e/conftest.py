from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.otlp import Collector
from tests.support import (
    PICKY_MODEL,
    SLOW_MODEL,
    ServerProcess,
    start_server,
    write_datatype_repository,
    write_model,
)


@pytest.fixture(scope="session")
def examples_server() -> Iterator[ServerProcess]:
    """``infermux serve`` with no repository: the built-in examples."""
    with start_server(no_arg_default=True) as server:
        yield server
        assert server.stop() == 0


@pytest.fixture(scope="session")
def test_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    write_datatype_repository(repo)
    write_model(repo, "picky", datatype="INT32", source=PICKY_MODEL)
    write_model(repo, "slow", datatype="FP32", source=SLOW_MODEL, max_batch_size=0)
    write_model(repo, "fixed", datatype="INT32", dims="[ 2, 3 ]", max_batch_size=4)
    broken = repo / "broken"
    broken.mkdir()
    (broken / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\ninput [ {')
    return repo


@pytest.fixture(scope="session")
def test_server(test_repository: Path) -> Iterator[ServerProcess]:
    """A server over the test repository (one model in it fails to load on purpose)."""
    with start_server(
        "--model-repository", str(test_repository), "--http-max-input-size", "1000000"
    ) as server:
        yield server
        assert server.stop() == 0


@pytest.fixture
def collector() -> Iterator[Collector]:
    """An OTLP/HTTP receiver that servers started with its url export their spans to."""
    collector = Collector()
    collector.thread.start()
    yield collector
    collector.server.shutdown()
    collector.server.server_close()
