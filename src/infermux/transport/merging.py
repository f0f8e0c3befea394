"""What a front end over several executors answers from all of theirs: statistics summed and
the repository index's most-ready rows (``remote_plane.py``)."""

from __future__ import annotations

from collections.abc import Iterable

from infermux.types import BatchStats, Duration, MemoryUsage, ModelStats, RepositoryIndexEntry

# Which of two rows for one model version the merged index shows: the most-ready one.
_STATE_RANK = {"READY": 4, "LOADING": 3, "UNLOADING": 2, "UNAVAILABLE": 1, "": 0}


def merge_statistics(parts: Iterable[list[ModelStats]]) -> list[ModelStats]:
    """One :class:`ModelStats` per model version over every executor's: counts and durations
    summed, per batch size and per response index too; the latest ``last_inference``; memory
    summed per device."""
    merged: dict[tuple[str, str], list[ModelStats]] = {}
    for part in parts:
        for stats in part:
            merged.setdefault((stats.name, stats.version), []).append(stats)
    return [_merge_one(group) for _, group in sorted(merged.items())]


def _merge_one(group: list[ModelStats]) -> ModelStats:
    if len(group) == 1:
        return group[0]
    inference: dict[str, Duration] = {}
    batches: dict[int, tuple[Duration, Duration, Duration]] = {}
    memory: dict[tuple[str, int], int] = {}
    responses: dict[str, dict[str, Duration]] = {}
    for stats in group:
        for index, entry in stats.response_stats.items():
            summed = responses.setdefault(index, {})
            for key, duration in entry.items():
                summed.setdefault(key, Duration()).add(duration.ns, duration.count)
        for key, duration in stats.inference_stats.items():
            inference.setdefault(key, Duration()).add(duration.ns, duration.count)
        for batch in stats.batch_stats:
            sums = batches.setdefault(batch.batch_size, (Duration(), Duration(), Duration()))
            for total, part in zip(
                sums, (batch.compute_input, batch.compute_infer, batch.compute_output), strict=True
            ):
                total.add(part.ns, part.count)
        for use in stats.memory_usage:
            memory[(use.type, use.id)] = memory.get((use.type, use.id), 0) + use.byte_size
    first = group[0]
    return ModelStats(
        first.name,
        first.version,
        max(s.last_inference for s in group),
        sum(s.inference_count for s in group),
        sum(s.execution_count for s in group),
        inference,
        tuple(BatchStats(size, *sums) for size, sums in sorted(batches.items())),
        tuple(MemoryUsage(kind, device, size) for (kind, device), size in sorted(memory.items())),
        # Triton's response_stats per response index: summed as the other counts are.
        dict(sorted(responses.items(), key=lambda item: int(item[0]))),
    )


def merge_index(parts: Iterable[list[RepositoryIndexEntry]]) -> list[RepositoryIndexEntry]:
    """The repository index over every executor: per model version the most-ready row (an
    executor that does not host a model lists it without a version, or not at all)."""
    best: dict[tuple[str, str], RepositoryIndexEntry] = {}
    for part in parts:
        for row in part:
            key = (row.name, row.version)
            held = best.get(key)
            if held is None or _STATE_RANK.get(row.state, 0) > _STATE_RANK.get(held.state, 0):
                best[key] = row
    versioned = {name for name, version in best if version}
    # A model some executor lists with versions needs no version-less row from the others.
    rows = sorted(best.items())
    return [row for (name, version), row in rows if version or name not in versioned]
