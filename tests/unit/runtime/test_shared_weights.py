"""The shared-weights cache: one load per key, reference counts, freeing after the last user."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from infermux.runtime import SharedWeights


class Weights:
    """Stands in for a loaded module."""


def cache() -> tuple[SharedWeights[Weights], list[str], list[Weights]]:
    freed: list[str] = []
    loaded: list[Weights] = []
    return SharedWeights(freed.append), freed, loaded


def loader(loaded: list[Weights]) -> Weights:
    weights = Weights()
    loaded.append(weights)
    return weights


@pytest.fixture
def model_file(tmp_path: Path) -> str:
    path = tmp_path / "model.pt"
    path.write_bytes(b"weights")
    return str(path)


def test_instances_on_one_device_share_one_load(model_file: str) -> None:
    weights, freed, loaded = cache()
    leases = [weights.acquire(model_file, "cuda:0", lambda: loader(loaded)) for _ in range(4)]
    assert len(loaded) == 1
    assert all(lease.value is loaded[0] for lease in leases)
    assert weights.users(leases[0].key) == 4
    for lease in leases[:3]:
        lease.release()
    assert weights.users(leases[0].key) == 1
    assert freed == []
    leases[3].release()
    assert weights.users(leases[0].key) == 0
    assert weights.held() == []
    assert freed == ["cuda:0"]


def test_another_device_or_a_rewritten_file_is_another_load(model_file: str) -> None:
    weights, freed, loaded = cache()
    first = weights.acquire(model_file, "cuda:0", lambda: loader(loaded))
    other_gpu = weights.acquire(model_file, "cuda:1", lambda: loader(loaded))
    stat = os.stat(model_file)
    os.utime(model_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    rewritten = weights.acquire(model_file, "cuda:0", lambda: loader(loaded))
    assert len(loaded) == 3
    assert len({first.key, other_gpu.key, rewritten.key}) == 3
    first.release()
    assert freed == ["cuda:0"]  # the old file's weights go although cuda:0 still has users
    other_gpu.release()
    rewritten.release()
    assert freed == ["cuda:0", "cuda:1", "cuda:0"]


def test_releasing_a_lease_twice_counts_once(model_file: str) -> None:
    weights, freed, loaded = cache()
    a = weights.acquire(model_file, "cuda:0", lambda: loader(loaded))
    b = weights.acquire(model_file, "cuda:0", lambda: loader(loaded))
    a.release()
    a.release()
    assert weights.users(b.key) == 1
    assert freed == []
    b.release()
    assert freed == ["cuda:0"]


def test_a_failed_load_caches_nothing_and_the_next_user_retries(model_file: str) -> None:
    weights, freed, loaded = cache()

    def broken() -> Weights:
        raise RuntimeError("corrupt file")

    with pytest.raises(RuntimeError, match="corrupt file"):
        weights.acquire(model_file, "cuda:0", broken)
    assert weights.held() == []
    assert freed == ["cuda:0"]
    lease = weights.acquire(model_file, "cuda:0", lambda: loader(loaded))
    assert lease.value is loaded[0]
    lease.release()


def test_concurrent_first_users_load_once(model_file: str) -> None:
    weights, _, loaded = cache()

    def slow() -> Weights:
        time.sleep(0.05)  # wide enough for every thread to arrive while the first one loads
        return loader(loaded)

    values: list[Weights] = []
    threads = [
        threading.Thread(
            target=lambda: values.append(weights.acquire(model_file, "cuda:0", slow).value)
        )
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loaded) == 1
    assert values == loaded * 8
    assert weights.users(weights.held()[0]) == 8


def test_a_missing_file_is_an_error_before_loading(tmp_path: Path) -> None:
    weights, _, loaded = cache()
    with pytest.raises(FileNotFoundError):
        weights.acquire(str(tmp_path / "nope.pt"), "cuda:0", lambda: loader(loaded))
    assert loaded == []


def test_cpu_memory_is_not_handed_to_cuda() -> None:
    from infermux.runtime import release_device_memory

    release_device_memory("cpu")  # must not import or touch CUDA
