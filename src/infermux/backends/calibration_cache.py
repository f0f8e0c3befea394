"""The calibration cache: reduced-precision artifacts (a quantised model, scales, a calibration
table) built once and reused by later loads, restarts and other replicas.

An entry is a directory ``<version>/.infermux-cache/<kind>-<key>/`` holding the artifact and a
``meta.json`` that records the full key and the artifact's SHA-256. The key hashes everything the
artifact depends on: the model file's bytes, the calibration data's bytes, the settings and the
versions of the libraries that built it; anything changed is a new key, so a stale artifact is
never found, let alone trusted. An entry whose ``meta.json`` is unreadable or whose artifact does
not match its hash is deleted with a warning and rebuilt.

Entries are built in a temporary directory beside their final place and renamed into it, which is
atomic: a concurrent loader (another instance, executor or replica sharing the volume) sees a
whole entry or none. Two loaders that miss at once both build; the first rename wins and the
second loader uses the winner's entry. Within one process, loaders of one key take turns, so the
second instance of a model reuses what the first one built.

When the version directory is read-only (a mounted model volume), entries go to
``$XDG_CACHE_HOME/infermux/calibration`` (``~/.cache/...``) instead.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infermux.backends.base import ModelContext
from infermux.errors import ModelLoadError

logger = logging.getLogger(__name__)

CACHE_DIRNAME = ".infermux-cache"
"""The cache's directory inside a version directory (the repository watcher ignores it)."""
META = "meta.json"
FORMAT = 1
"""Bumped when the entry layout changes, so that old entries become misses."""

BUILDS: collections.Counter[str] = collections.Counter()
"""Entries built (calibrations run) in this process, by kind: what tests read to prove that a
load reused the cache instead of calibrating again."""

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A usable entry: the artifact's path, what the builder recorded, and how it was found."""

    artifact: Path
    meta: Mapping[str, Any]
    outcome: str
    """``hit`` (reused), ``miss`` (built now) or ``corrupt`` (found broken, rebuilt now)."""


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes (read in chunks: models are large)."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_key(
    kind: str, files: Iterable[Path], settings: Mapping[str, str], libraries: Mapping[str, str]
) -> str:
    """The key of an artifact of ``kind`` built from ``files`` with ``settings`` by ``libraries``
    (name -> version)."""
    document = {
        "format": FORMAT,
        "kind": kind,
        "files": [file_digest(path) for path in files],
        "settings": dict(sorted(settings.items())),
        "libraries": dict(sorted(libraries.items())),
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


class CalibrationCache:
    """The entry of one (kind, key) for one model version."""

    def __init__(self, context: ModelContext, kind: str, key: str, artifact_name: str) -> None:
        self.context = context
        self.kind = kind
        self.key = key
        self.artifact_name = artifact_name
        self.root = _root(context)
        self.path = self.root / f"{kind}-{key[:32]}"

    def get_or_build(self, build: Callable[[Path], Mapping[str, Any]]) -> CacheEntry:
        """The cached entry, else one made by ``build(artifact_path)``, which writes the artifact
        and returns what to record with it (JSON-serialisable)."""
        with _lock(str(self.path)):
            outcome = "miss"
            if self.path.exists():
                found = self._read()
                if found is not None:
                    return CacheEntry(self.path / self.artifact_name, found, "hit")
                outcome = "corrupt"
                shutil.rmtree(self.path, ignore_errors=True)
            return self._build(build, outcome)

    def _read(self) -> dict[str, Any] | None:
        """The entry's record when the entry is whole and is this key's; None (after a warning)
        when it is not."""
        try:
            meta = json.loads((self.path / META).read_text())
            if not isinstance(meta, dict) or meta.get("key") != self.key:
                raise ValueError("its meta.json names another key")
            artifact = self.path / self.artifact_name
            if file_digest(artifact) != meta.get("artifact_sha256"):
                raise ValueError(f"{self.artifact_name} does not match its recorded SHA-256")
        except (OSError, ValueError) as exc:
            logger.warning(
                "model '%s' version %s: discarding the corrupt calibration cache entry %s (%s); "
                "calibrating again",
                self.context.config.name,
                self.context.version,
                self.path,
                exc,
            )
            return None
        return meta

    def _build(self, build: Callable[[Path], Mapping[str, Any]], outcome: str) -> CacheEntry:
        config = self.context.config
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{self.kind}-", dir=self.root))
        except OSError as exc:
            raise ModelLoadError(
                f"model '{config.name}': cannot write the calibration cache in {self.root}: {exc}"
            ) from exc
        try:
            started = time.monotonic()
            record = dict(build(staging / self.artifact_name))
            BUILDS[self.kind] += 1
            record.update(
                key=self.key,
                kind=self.kind,
                artifact_sha256=file_digest(staging / self.artifact_name),
                build_seconds=round(time.monotonic() - started, 3),
                created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            )
            (staging / META).write_text(json.dumps(record, indent=2, sort_keys=True))
            try:
                os.rename(staging, self.path)
            except OSError:
                # Another loader's entry landed first (a non-empty target cannot be renamed
                # over): use it when it is whole, else keep ours in its place.
                found = self._read() if self.path.exists() else None
                if found is not None:
                    return CacheEntry(self.path / self.artifact_name, found, outcome)
                shutil.rmtree(self.path, ignore_errors=True)
                os.rename(staging, self.path)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        logger.info(
            "model '%s' version %s: %s built in %.1f s, cached in %s",
            config.name,
            self.context.version,
            self.kind,
            record["build_seconds"],
            self.path,
        )
        return CacheEntry(self.path / self.artifact_name, record, outcome)


def _root(context: ModelContext) -> Path:
    """The version directory's cache, or the user's cache when the version is read-only."""
    local = context.version_path / CACHE_DIRNAME
    if os.access(local if local.exists() else context.version_path, os.W_OK):
        return local
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    where = hashlib.sha256(str(context.version_path.resolve()).encode()).hexdigest()[:16]
    fallback = base / "infermux" / "calibration" / f"{context.config.name}-{where}"
    logger.warning(
        "model '%s' version %s: %s is not writable; the calibration cache is in %s",
        context.config.name,
        context.version,
        context.version_path,
        fallback,
    )
    return fallback


def _lock(name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(name, threading.Lock())
