"""Memory accounting: shared weights counted once, totals per device, the load log line."""

from __future__ import annotations

from infermux.runtime import MemoryUse, describe, total_by_device
from infermux.runtime.memory import format_bytes, instance_memory
from infermux.types import MemoryUsage

MiB = 1 << 20


def instance(weights_key: str = "w") -> list[MemoryUse]:
    return [
        MemoryUse("GPU", 0, "weights", 100 * MiB, weights_key),
        MemoryUse("GPU", 0, "buffers", 10 * MiB),
        MemoryUse("GPU", 0, "graphs", 20 * MiB),
        MemoryUse("CPU_PINNED", 0, "staging", 2 * MiB),
    ]


def test_shared_weights_count_once_and_the_rest_per_instance() -> None:
    uses = instance() * 4
    assert total_by_device(uses) == (
        MemoryUsage("CPU_PINNED", 0, 8 * MiB),
        MemoryUsage("GPU", 0, (100 + 4 * 30) * MiB),
    )


def test_weights_on_two_gpus_are_two_copies() -> None:
    uses = [*instance("w@0"), MemoryUse("GPU", 1, "weights", 100 * MiB, "w@1")]
    totals = {(m.type, m.id): m.byte_size for m in total_by_device(uses)}
    assert totals[("GPU", 0)] == 130 * MiB
    assert totals[("GPU", 1)] == 100 * MiB


def test_describe_sums_components_per_device() -> None:
    line = describe(instance() * 2)
    assert line == (
        "pinned host: staging 4.0 MiB; GPU 0: weights 100.0 MiB, buffers 20.0 MiB, graphs 40.0 MiB"
    )
    assert describe([]) == "nothing reported"


def test_instance_memory_asks_only_instances_that_report() -> None:
    class Reporting:
        def memory_usage(self) -> list[MemoryUse]:
            return [MemoryUse("CPU", 0, "weights", 5)]

    assert (
        instance_memory([Reporting(), object(), Reporting()])
        == [MemoryUse("CPU", 0, "weights", 5)] * 2
    )


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1536, 5 * MiB, 3 << 30, 5000 << 30)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "5.0 MiB",
        "3.0 GiB",
        "5000.0 GiB",
    ]
