"""The supervisor's start-up checks (the processes themselves are tested black-box in
``tests/e2e/test_frontends.py``)."""

from __future__ import annotations

import pytest

from infermux.errors import StartupError
from infermux.processes.supervisor import check_shared_memory
from infermux.settings import ServerSettings


def test_an_undersized_dev_shm_is_a_start_up_error_naming_the_flags() -> None:
    settings = ServerSettings(frontends=4, ipc_arena_mb=256)
    with pytest.raises(StartupError, match=r"--ipc-arena-mb 256 needs 2,080 MiB.*64 MiB free"):
        check_shared_memory(settings, free=64 * 2**20)
    check_shared_memory(ServerSettings(frontends=4, ipc_arena_mb=4), free=64 * 2**20)
