"""Model-loading progress on a terminal (rich); logs carry the same durations everywhere else."""

from __future__ import annotations

import sys
from types import TracebackType

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn


class LoadProgress:
    """A :class:`~infermux.repository.LoadObserver` drawing one line per model version loading."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
            transient=False,
        )
        self._tasks: dict[tuple[str, int], TaskID] = {}

    @staticmethod
    def wanted() -> bool:
        """Only on an interactive terminal: logs and CI output stay plain."""
        return sys.stderr.isatty()

    def __enter__(self) -> LoadProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def started(self, name: str, version: int) -> None:
        self._tasks[(name, version)] = self._progress.add_task(
            f"loading {name} v{version}", total=1
        )

    def finished(self, name: str, version: int, seconds: float, error: str | None) -> None:
        task = self._tasks.pop((name, version), None)
        if task is None:
            return
        outcome = (
            f"[red]failed[/red]: {error}" if error else f"[green]ready[/green] in {seconds:.2f} s"
        )
        self._progress.update(task, completed=1, description=f"{name} v{version} {outcome}")
        self._progress.stop_task(task)
