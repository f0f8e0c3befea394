"""What ``build_dataplane`` sets up for the process beyond the plane itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from infermux.dataplane.assembly import build_dataplane, build_repository
from infermux.runtime import COMPLETIONS
from infermux.settings import ServerSettings


@pytest.mark.parametrize(("spin_us", "seconds"), [(0, 0.0), (750, 0.00075)])
async def test_the_gpu_completion_spin_reaches_the_process_completions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spin_us: int, seconds: float
) -> None:
    monkeypatch.setattr(COMPLETIONS, "spin_seconds", 1.0)  # restored after the test
    settings = ServerSettings(model_repositories=(tmp_path,), gpu_completion_spin_us=spin_us)
    repository = build_repository(settings)
    plane = build_dataplane(settings, repository)
    try:
        assert COMPLETIONS.spin_seconds == pytest.approx(seconds)
    finally:
        plane.close()
        await repository.close()
