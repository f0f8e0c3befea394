"""The supervisor's start-up checks (the processes themselves are tested black-box in
``tests/e2e/test_frontends.py``)."""

from __future__ import annotations

import pytest

from infermux.errors import StartupError
from infermux.ipc.ring import ORDERED_STORES
from infermux.processes.common import check_shared_memory
from infermux.settings import ServerSettings


def test_an_undersized_dev_shm_is_a_start_up_error_naming_the_flags() -> None:
    settings = ServerSettings(frontends=4, ipc_arena_mb=256)
    with pytest.raises(StartupError, match=r"--ipc-arena-mb 256 needs 2,080 MiB.*64 MiB free"):
        check_shared_memory(settings, free=64 * 2**20)
    check_shared_memory(ServerSettings(frontends=4, ipc_arena_mb=4), free=64 * 2**20)


@pytest.mark.skipif(not ORDERED_STORES, reason="auto is 1 off x86-64")
def test_auto_frontends_follow_cores_and_fit_dev_shm() -> None:
    from infermux.ipc.channel import DEFAULT_RING_BYTES
    from infermux.settings import IPC_RING_BYTES, auto_frontends

    assert IPC_RING_BYTES == DEFAULT_RING_BYTES
    big = 64 * 2**30
    assert auto_frontends(cores=2, shm_free=big) == 1
    assert auto_frontends(cores=16, shm_free=big) == 4
    assert auto_frontends(cores=64, shm_free=big) == 8
    # Docker's default 64 MiB /dev/shm holds no 256 MiB arenas: one process, not a crash later.
    assert auto_frontends(cores=16, ipc_arena_mb=256, shm_free=64 * 2**20) == 1
    assert auto_frontends(cores=16, ipc_arena_mb=4, shm_free=64 * 2**20) == 4
