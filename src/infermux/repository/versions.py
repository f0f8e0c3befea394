"""How one model's versions are (re)loaded: its config read and checked, each version built
beside the ones serving, then swapped in with one assignment (``manager.py`` holds the
entries, their locks and what clients asked for). A version that fails to reload keeps its
old instance serving; retired versions drain what they admitted before they close.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from infermux.backends.registry import BackendRegistry
from infermux.backends.server_calls import ServerCalls
from infermux.errors import InfermuxError, ModelLoadError
from infermux.model_config import ModelConfig
from infermux.repository.config_file import Complete, load_model_config
from infermux.repository.layout import fingerprint, list_versions
from infermux.repository.loader import LoadedModel, build_version, check_config_paths, retire
from infermux.repository.placement import Shard, placements
from infermux.repository.state import Entry, LoadObserver, State
from infermux.routing.policy import CONFIG_PARAMETER as TRAFFIC_PARAMETER
from infermux.routing.policy import parse_policy

logger = logging.getLogger("infermux.repository.manager")  # the lines keep their logger's name


class VersionLoader:
    """Builds the versions of the models of one repository (one executor's ``shard``)."""

    def __init__(
        self,
        registry: BackendRegistry,
        *,
        shard: Shard,
        observer: LoadObserver,
        histograms: bool,
        execution_timeout_ms: int,
        complete: Complete | None,
        server: ServerCalls,
    ) -> None:
        self._registry = registry
        self._shard = shard
        self._observer = observer
        self._histograms = histograms  # metrics on: each version keeps latency histograms
        self._execution_timeout_ms = execution_timeout_ms  # models' default (0: none)
        self._complete = complete
        self._server = server

    def failed(self, entry: Entry, name: str, exc: InfermuxError) -> None:
        logger.error("failed to load model '%s': %s", name, exc)
        entry.load_failures += 1
        if not entry.serving:
            entry.model_error = str(exc)

    async def load_from(
        self, entry: Entry, name: str, path: Path, config_override: str | None
    ) -> tuple[bool, bool]:
        """Load ``name``'s versions from ``path``; whether an old instance was kept serving
        (its reload failed) and whether a version from ``path`` serves."""
        entry.fingerprint = await asyncio.to_thread(fingerprint, path)
        try:
            config = await asyncio.to_thread(
                load_model_config,
                path,
                config_override,
                self._complete,
                name=name,
            )
            self._registry.get(config)  # an unknown platform or backend fails the whole load
            policy = config.parameters.get(TRAFFIC_PARAMETER)
            if policy is not None:
                parse_policy(policy)  # a bad policy fails the load, naming the field
            versions = config.version_policy.select(await asyncio.to_thread(list_versions, path))
            if not versions:
                raise ModelLoadError(
                    f"model '{name}': no version directory matches the version policy in {path}"
                )
            await asyncio.to_thread(check_config_paths, config, path, versions)
        except InfermuxError as exc:
            self.failed(entry, name, exc)
            raise
        entry.hosted = bool(placements(config, self._shard))
        if not entry.hosted:  # every instance belongs to another executor
            logger.info("model '%s': hosted by other executors", name)
            dropped, entry.serving, entry.states, entry.model_error = entry.serving, {}, {}, ""
            await retire(list(dropped.values()))
            return False, False

        for version in versions:
            if version not in entry.serving:
                entry.states[version] = (State.LOADING, "")
        results = await asyncio.gather(*(self._load_version(config, path, v) for v in versions))
        fresh: dict[int, LoadedModel] = {}
        errors: list[str] = []
        for version, result in zip(versions, results, strict=True):
            if isinstance(result, LoadedModel):
                fresh[version] = result
                entry.states[version] = (State.READY, "")
            else:
                errors.append(result)
                entry.load_failures += 1
                logger.error("failed to load model '%s' version %d: %s", name, version, result)
                if version in entry.serving:  # keep serving the old instance of this version
                    fresh[version] = entry.serving[version]
                    entry.states[version] = (State.READY, f"reload failed: {result}")
                else:
                    entry.states[version] = (State.UNAVAILABLE, result)
        if not fresh:
            entry.model_error = "; ".join(errors)
            raise ModelLoadError(entry.model_error)
        entry.model_error = ""
        retired = [m for v, m in entry.serving.items() if fresh.get(v) is not m]
        carried = len(entry.serving) - len(retired)
        loaded = len(fresh) > carried
        entry.serving = fresh  # the atomic switch: new requests see only the fresh versions
        for version in [v for v in entry.states if v not in fresh and v not in versions]:
            del entry.states[version]
        await retire(retired)
        return carried > 0, loaded

    async def _load_version(
        self, config: ModelConfig, path: Path, version: int
    ) -> LoadedModel | str:
        started = time.monotonic()
        self._observer.started(config.name, version)
        result = await self._build_version(config, path, version)
        seconds = time.monotonic() - started
        error = result if isinstance(result, str) else None
        self._observer.finished(config.name, version, seconds, error)
        if isinstance(result, LoadedModel):
            result.stats.load_seconds = seconds
            logger.info("loaded model '%s' version %d in %.2f s", config.name, version, seconds)
        return result

    async def _build_version(
        self, config: ModelConfig, path: Path, version: int
    ) -> LoadedModel | str:
        try:
            return await build_version(
                self._registry,
                config,
                path,
                version,
                histograms=self._histograms,
                shard=self._shard,
                execution_timeout_ms=self._execution_timeout_ms,
                server=self._server,
            )
        except InfermuxError as exc:
            return str(exc)
        except Exception as exc:
            logger.exception("model '%s' version %d: unexpected load failure", config.name, version)
            return f"{type(exc).__name__}: {exc}"
