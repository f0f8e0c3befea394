"""Loads, serves, reloads and unloads model versions; the data plane's view of what is served.

A (re)load builds the new versions completely beside the old ones and then swaps them in with one
assignment, so requests never see a half-loaded model; replaced versions drain what they admitted
before their instances are closed (``versions.py`` does both; this module holds the models'
entries, their locks, what clients asked for and the index).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from infermux.backends.registry import BackendRegistry
from infermux.backends.server_calls import ServerCalls
from infermux.errors import (
    InfermuxError,
    InvalidArgumentError,
    ModelLoadError,
    NotFoundError,
    StartupError,
    UnavailableError,
    UnsupportedError,
)
from infermux.repository.layout import Fingerprint, discover_models
from infermux.repository.loader import LoadedModel, retire
from infermux.repository.overrides import discard, materialize
from infermux.repository.placement import ONLY, Shard
from infermux.repository.polling import poll_forever, poll_once
from infermux.repository.state import ControlMode, Entry, LoadObserver, Quiet, State
from infermux.repository.versions import VersionLoader
from infermux.types import RepositoryIndexEntry

logger = logging.getLogger(__name__)

LOAD_CONCURRENCY = 4  # Triton's --model-load-thread-count default


class ModelRepository:
    """The set of models found in the repositories, and the versions being served."""

    def __init__(
        self,
        repositories: Sequence[Path],
        registry: BackendRegistry,
        *,
        control_mode: ControlMode = ControlMode.NONE,
        startup_models: Sequence[str] = (),
        poll_seconds: float = 15.0,
        observer: LoadObserver | None = None,
        histograms: bool = False,
        shard: Shard = ONLY,
        execution_timeout_ms: int = 0,
        load_concurrency: int = LOAD_CONCURRENCY,
        exit_on_error: bool = False,
        auto_complete: bool = True,
        server: ServerCalls | None = None,
    ) -> None:
        self._shard = shard  # with several executors: which instances this one holds
        self.server = server or ServerCalls()
        """How models call the server they run in (BLS): the data plane attaches its ``infer``."""
        self._repositories = list(repositories)
        self._registry = registry
        self._mode = control_mode
        self._startup_models = list(startup_models)
        self._poll_seconds = poll_seconds
        self._entries: dict[str, Entry] = {}
        self._limit = asyncio.Semaphore(load_concurrency)
        self._exit_on_error = exit_on_error  # a failed start-up load fails start()
        self._versions = VersionLoader(
            registry,
            shard=shard,
            observer=observer or Quiet(),
            histograms=histograms,
            execution_timeout_ms=execution_timeout_ms,
            # Backends may complete configs from the model (off: --disable-auto-complete-config).
            complete=registry.complete_config if auto_complete else None,
            server=self.server,
        )
        self._poller: asyncio.Task[None] | None = None

    @property
    def control_mode(self) -> ControlMode:
        return self._mode

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, skip: Collection[str] = ()) -> None:
        """Discover the repositories and load what the control mode says to load at startup,
        but for the models in ``skip`` (explicit mode: a restarted executor is given the models
        clients loaded or unloaded since, and must not load them as the command line says).
        With ``exit_on_error`` a model that fails to load raises :class:`StartupError`."""
        self.server.serve_on(asyncio.get_running_loop())  # models' calls run on this loop
        sources = discover_models(self._repositories)
        self._entries = {name: Entry(source) for name, source in sources.items()}
        missing: list[str] = []
        if self._mode is ControlMode.EXPLICIT:
            wanted = list(sources) if "*" in self._startup_models else self._startup_models
            wanted = [name for name in wanted if name not in skip]
            missing = [name for name in wanted if name not in sources]
            for name in missing:
                logger.error("--load-model %s: no such model in the repositories", name)
                self._entries[name] = Entry(None, model_error="not found in any repository")
                self._entries[name].requested = True
        else:
            wanted = list(sources)
        loads = [self._load_at_startup(name) for name in wanted if name in sources]
        failed = missing + [name for name in await asyncio.gather(*loads) if name]
        if failed and self._exit_on_error:
            raise StartupError(
                f"--exit-on-error: failed to load {', '.join(failed)} (see the log above)"
            )
        if self._mode is ControlMode.POLL:
            self._poller = asyncio.get_running_loop().create_task(
                poll_forever(self, self._repositories, self._poll_seconds)
            )

    async def _load_at_startup(self, name: str) -> str:
        """``name`` when it failed to load (reported in the log and the index), else ""."""
        # A model that fails to load must not stop the others.
        try:
            await self.load(name)
        except InfermuxError:  # already logged and recorded as its reason
            return name
        return ""

    async def close(self) -> None:
        """Stop polling and unload every model, letting admitted requests finish first."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await asyncio.gather(*(self._unload(name) for name in list(self._entries)))

    # -- lookups for the data plane ---------------------------------------------------------------

    def get(self, name: str, version: str = "") -> LoadedModel:
        """The served version ``version`` of ``name`` (the highest one when ``version`` is "")."""
        entry = self._entries.get(name)
        if entry is None:
            raise NotFoundError(f"Request for unknown model: '{name}' is not found")
        if not entry.hosted:  # a front end's stale view: it retries on a hosting executor
            raise NotFoundError(f"model '{name}' is not hosted by executor {self._shard.index}")
        if version:
            if not version.isdigit():
                raise NotFoundError(
                    f"Request for unknown model: '{name}' version '{version}' is not found"
                )
            model = entry.serving.get(int(version))
            if model is None:
                state = entry.states.get(int(version))
                if state is not None and state[0] is State.LOADING:
                    raise UnavailableError(f"model '{name}' version {version} is still loading")
                raise NotFoundError(
                    f"Request for unknown model: '{name}' version {version} is not found"
                )
            return model
        if not entry.serving:
            raise UnavailableError(f"Request for unavailable model: '{name}' has no ready version")
        return entry.serving[max(entry.serving)]

    def is_ready(self, name: str, version: str = "") -> bool:
        """Whether ``get(name, version)`` would succeed."""
        try:
            self.get(name, version)
        except InfermuxError:
            return False
        return True

    def served(self) -> list[LoadedModel]:
        """Every served model version, by name then version."""
        return [
            self._entries[name].serving[version]
            for name in sorted(self._entries)
            for version in sorted(self._entries[name].serving)
        ]

    def serving(self, name: str) -> dict[int, LoadedModel]:
        """The served versions of ``name`` by number (empty when none); do not modify."""
        entry = self._entries.get(name)
        return entry.serving if entry is not None else {}

    def load_failures(self) -> dict[str, int]:
        """Failed loads per model name so far (a model and each failing version count)."""
        return {name: e.load_failures for name, e in sorted(self._entries.items())}

    def ready_versions(self, name: str) -> list[int]:
        """Served versions of ``name``, ascending."""
        entry = self._entries.get(name)
        return sorted(entry.serving) if entry else []

    def all_ready(self) -> bool:
        """Strict readiness: every model that should be loaded serves. A version loading beside
        a served one (a reload, a swap) or failing to (the old one keeps serving; the index and
        metrics say why) leaves it ready, so load balancers keep a server that swaps versions."""
        for entry in self._entries.values():
            if not entry.requested or not entry.hosted:
                continue
            if not entry.serving:
                return False
            if any(
                entry.states.get(v, (State.READY, ""))[0] is not State.READY for v in entry.serving
            ):
                return False
        return True

    def index(self, *, ready_only: bool = False) -> list[RepositoryIndexEntry]:
        """The repository index: one row per known model version (or per model never loaded)."""
        rows: list[RepositoryIndexEntry] = []
        for name in sorted(self._entries):
            entry = self._entries[name]
            if entry.model_error and not entry.states:
                if not ready_only:
                    rows.append(
                        RepositoryIndexEntry(name, "", State.UNAVAILABLE.value, entry.model_error)
                    )
                continue
            if not entry.states and not ready_only:
                rows.append(RepositoryIndexEntry(name, "", "", ""))
            for version in sorted(entry.states):
                state, reason = entry.states[version]
                if ready_only and state is not State.READY:
                    continue
                rows.append(RepositoryIndexEntry(name, str(version), state.value, reason))
        return rows

    # -- control ----------------------------------------------------------------------------------

    def check_explicit(self, action: str) -> None:
        """Raise unless the repository API may change what is loaded (explicit mode)."""
        if self._mode is not ControlMode.EXPLICIT:
            raise UnsupportedError(
                f"explicit model {action} is not allowed: the server runs with "
                f"--model-control-mode={self._mode.value} (use explicit)"
            )

    def mark_unavailable(self, name: str, reason: str) -> None:
        """Say ``reason`` in the index for ``name``, which should be loaded and is not: a load
        no client waited for (an executor restart's replay) failed, and the index is where it is
        told (as ``UNAVAILABLE``, for the model and each version not served)."""
        entry = self._entries.get(name)
        if entry is None:  # e.g. gone from the repositories
            entry = self._entries[name] = Entry(None)
        entry.requested = True
        if not entry.serving:
            entry.model_error = reason
        for version, (state, _) in list(entry.states.items()):
            if state is not State.READY:
                entry.states[version] = (State.UNAVAILABLE, reason)

    async def load(
        self,
        name: str,
        config_override: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load ``name`` (or reload it: the new versions replace the old ones only when ready).

        ``files`` (path in the model directory -> content; Triton's ``file:`` load parameters)
        replace the model's files: it is loaded from a new directory holding just them, with
        ``config_override`` (required then) as its config; ``name`` need not be in a
        repository. A later load without files loads it from its repository again.

        Raises the load error when no version of the model could be loaded: "failed to load
        '<name>': <why>", INVALID_ARG (HTTP 400) as Triton answers a load that fails, unless a
        more specific code applies (no such model: NOT_FOUND).
        """
        entry = self._entries.get(name)
        if files:
            if config_override is None:
                raise InvalidArgumentError(
                    f"failed to load '{name}': override files need the 'config' parameter "
                    "(the configuration of the model directory they make)"
                )
            if entry is None:
                entry = self._entries[name] = Entry(None)
        elif entry is None or entry.source is None:
            sources = discover_models(self._repositories)
            if name not in sources:
                raise NotFoundError(f"failed to load '{name}': no such model in the repositories")
            if entry is None:
                entry = self._entries[name] = Entry(sources[name])
            entry.source = sources[name]
        entry.requested = True
        async with entry.lock, self._limit:
            try:
                await self._load_locked(entry, name, config_override, files or None)
            except InfermuxError as exc:
                raise ModelLoadError(f"failed to load '{name}': {exc}", exc.code) from exc

    async def unload(self, name: str) -> None:
        """Unload every version of ``name`` once its admitted requests have finished."""
        if name not in self._entries:
            raise NotFoundError(f"failed to unload '{name}': no such model")
        await self._unload(name)

    async def poll_once(self) -> None:
        """Poll mode: load new models, reload changed ones, unload removed ones."""
        await poll_once(self)

    @property
    def repositories(self) -> list[Path]:
        return list(self._repositories)

    def fingerprints(self) -> dict[str, Fingerprint]:
        """Every known model and the fingerprint of the files it was last loaded from."""
        return {name: entry.fingerprint for name, entry in self._entries.items()}

    async def forget(self, name: str) -> None:
        """Unload ``name`` and drop it from what is known (removed from the repositories)."""
        await self._unload(name)
        del self._entries[name]

    # -- internals --------------------------------------------------------------------------------

    async def _load_locked(
        self,
        entry: Entry,
        name: str,
        config_override: str | None,
        files: Mapping[str, bytes] | None,
    ) -> None:
        override: Path | None = None
        try:
            if files is not None:
                try:
                    override = await asyncio.to_thread(materialize, name, files)
                except InfermuxError as exc:  # a bad path: refused before anything was written
                    self._versions.failed(entry, name, exc)
                    raise
                path = override
            else:
                assert entry.source is not None
                path = entry.source.path
            carried, loaded = await self._versions.load_from(entry, name, path, config_override)
        except BaseException:
            discard(override)  # nothing reads these files
            raise
        # Older override directories go once no served version reads them (a version whose
        # reload failed keeps serving its old instance, loaded from wherever it was).
        old, entry.overrides = entry.overrides, (list(entry.overrides) if carried else [])
        if override is not None and loaded:
            entry.overrides.append(override)
        for stale in [d for d in [*old, override] if d is not None and d not in entry.overrides]:
            discard(stale)

    async def _unload(self, name: str) -> None:
        entry = self._entries.get(name)
        if entry is None:
            return
        async with entry.lock:
            entry.requested = False
            retired = list(entry.serving.values())
            for version in entry.serving:
                entry.states[version] = (State.UNLOADING, "")
            entry.serving = {}
            await retire(retired)
            for version in list(entry.states):
                entry.states[version] = (State.UNAVAILABLE, "unloaded")
            for directory in entry.overrides:
                discard(directory)
            entry.overrides = []
