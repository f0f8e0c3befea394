"""Triton's repository layout: ``<repo>/<model>/``, a config file and numeric version folders."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG

from infermux.backends.calibration_cache import CACHE_DIRNAME
from infermux.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model lives on disk."""

    name: str
    path: Path
    repository: Path


def discover_models(repositories: Iterable[Path]) -> dict[str, ModelSource]:
    """Every model directory in ``repositories``; a name found in two repositories is an error."""
    found: dict[str, ModelSource] = {}
    for repo in repositories:
        if not repo.is_dir():
            raise ConfigError(str(repo), "--model-repository", "is not a directory")
        for entry in sorted(repo.iterdir()):
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            if entry.name in found:
                raise ConfigError(
                    str(entry),
                    "--model-repository",
                    f"model '{entry.name}' also exists in {found[entry.name].repository}",
                )
            found[entry.name] = ModelSource(entry.name, entry, repo)
    return found


def list_versions(model_dir: Path) -> list[int]:
    """Version numbers present in ``model_dir``, ascending.

    As in Triton, only directories whose name is a positive integer without a leading zero count.
    """
    versions = []
    for entry in model_dir.iterdir():
        name = entry.name
        if entry.is_dir() and name.isascii() and name.isdigit() and not name.startswith("0"):
            versions.append(int(name))
    return sorted(versions)


Fingerprint = tuple[tuple[str, int, int], ...]
"""(relative path, size, mtime_ns) of every file of a model: what polling compares."""


def fingerprint(model_dir: Path) -> Fingerprint:
    """A cheap change detector for polling: (relative path, size, mtime_ns) of every file."""
    rows = []
    try:
        paths = sorted(model_dir.rglob("*"))
    except OSError:  # changed while we walked: the next poll sees the settled tree
        return ()
    for path in paths:
        # Caches infermux writes itself (Python's bytecode, calibration results) are not changes to
        # the model: counting them would reload a model because it was loaded.
        if "__pycache__" in path.parts or CACHE_DIRNAME in path.parts:
            continue
        try:
            stat = path.stat()
        except OSError:  # removed while we looked
            continue
        if S_ISREG(stat.st_mode):
            rows.append((str(path.relative_to(model_dir)), stat.st_size, stat.st_mtime_ns))
    return tuple(rows)
