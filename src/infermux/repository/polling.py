"""Poll mode (``--model-control-mode poll``): the repositories are watched, and models that
were added, changed or removed are loaded, reloaded or unloaded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from infermux.errors import InfermuxError
from infermux.repository.layout import discover_models, fingerprint

if TYPE_CHECKING:  # the manager imports this module
    from infermux.repository.manager import ModelRepository

logger = logging.getLogger("infermux.repository.manager")  # the lines keep their logger's name


async def poll_once(repository: ModelRepository) -> None:
    """Load new models, reload changed ones (their files' fingerprint), unload removed ones."""
    sources = discover_models(repository.repositories)
    known = repository.fingerprints()
    for name in [n for n in known if n not in sources]:
        logger.info("model '%s' was removed from the repository: unloading", name)
        await repository.forget(name)
    for name, source in sources.items():
        current = await asyncio.to_thread(fingerprint, source.path)
        if name not in known or known[name] != current:
            logger.info("model '%s' is new or changed: loading", name)
            try:
                await repository.load(name)
            except InfermuxError as exc:
                logger.error("reloading model '%s' failed: %s", name, exc)


async def poll_forever(
    repository: ModelRepository, directories: Sequence[Path], poll_seconds: float
) -> None:
    """Act on the repositories' changes once they have been quiet for the poll interval (a
    model being copied in is not loaded half-written), through watchfiles (inotify on Linux; it
    polls the filesystem itself where there are no events)."""
    from watchfiles import awatch

    quiet_ms = max(1, int(poll_seconds * 1000))
    async for _ in awatch(
        *directories, step=quiet_ms, debounce=max(4 * quiet_ms, 1600), recursive=True
    ):
        try:
            await poll_once(repository)  # compares fingerprints: only real model changes reload
        except Exception:
            logger.exception("polling the model repository failed")
