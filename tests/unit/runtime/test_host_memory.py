"""The registry of host memory the GPU may copy from directly, without a CUDA driver: offers are
looked up by address; a range that cannot be pinned is refused once and stays refused."""

from __future__ import annotations

import pytest

from infermux.runtime import host_memory
from infermux.runtime.host_memory import HostMemory


class FakeDriver:
    def __init__(self, error: int = 0) -> None:
        self.error = error
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []

    def host_register(self, start: int, size: int) -> int:
        self.registered.append((start, size))
        return self.error

    def host_unregister(self, start: int) -> int:
        self.unregistered.append(start)
        return 0


def test_an_offered_range_is_pinned_on_first_use_and_only_for_addresses_inside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = FakeDriver()
    monkeypatch.setattr(host_memory, "DRIVER", driver)
    memory = HostMemory()
    memory.offer(1000, 100, "a")
    memory.offer(5000, 50, "b")
    assert not memory.pinned(10, 5)  # below every range
    assert not memory.pinned(1090, 20)  # runs past the end of "a"
    assert driver.registered == []
    assert memory.pinned(1000, 100)
    assert memory.pinned(1050, 10)
    assert driver.registered == [(1000, 100)]  # once
    assert not memory.pinned(1100, 1)  # between the ranges
    assert memory.pinned_bytes == 100
    assert memory.pinned(5010, 40)
    assert memory.pinned_bytes == 150


def test_a_range_the_driver_refuses_stays_staged_and_is_asked_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    driver = FakeDriver(error=2)
    monkeypatch.setattr(host_memory, "DRIVER", driver)
    memory = HostMemory()
    memory.offer(1000, 100 << 20, "the arena")
    assert not memory.pinned(1000, 10)
    assert not memory.pinned(1000, 10)
    assert len(driver.registered) == 1
    assert "cannot pin the arena (100 MiB)" in caplog.text
    assert memory.pinned_bytes == 0


def test_withdrawing_a_range_forgets_it_and_unpins_it_only_if_pinned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = FakeDriver()
    monkeypatch.setattr(host_memory, "DRIVER", driver)
    monkeypatch.setattr(
        host_memory, "_unregister", lambda found: driver.host_unregister(found.start)
    )
    memory = HostMemory()
    memory.offer(1000, 100, "a")
    memory.offer(2000, 100, "b")
    assert memory.pinned(1000, 1)
    memory.withdraw(1000)
    memory.withdraw(2000)  # offered, never pinned: nothing to undo
    memory.withdraw(3000)  # never offered
    assert driver.unregistered == [1000]
    assert not memory.pinned(1000, 1)
    assert not memory.pinned(2000, 1)


def test_what_the_real_driver_cannot_pin_is_refused_not_raised() -> None:
    memory = HostMemory()
    memory.offer(1000, 100, "a")
    # The real binding: no libcuda on a CPU machine; on a GPU one, no context is current here
    # and address 1000 is not mapped. Either way the range is refused and inputs are staged.
    assert not memory.pinned(1000, 1)
    assert memory.pinned_bytes == 0
