"""What clients changed at run time, which a restarted executor must be given back.

A new executor process starts from the command line: the startup models of
``--model-control-mode=explicit``, no client shared-memory registrations. Everything clients
changed since — models loaded (with their ``config`` override) or unloaded through the
repository API, system and CUDA shared-memory regions registered, trace settings — would be
lost with the old process, silently: the index would show a loaded model gone, an unloaded
one back. So the supervisor keeps that desired state and every executor it starts gets it back
before any front end is attached to it (readiness is false until then).

Where the state comes from: the executor reports each such call that *succeeded* on it
(:class:`~.control.Changed`, sent by the executor process). That is the single source of
truth chosen over the front ends because the executor is where the change takes effect: only
it knows the call succeeded (a failed load, an unknown region are not wishes to replay); there
is one of it per shard rather than one per front end (every front end would have to report
the calls it forwarded, and one dying between forwarding and reporting would lose them); and
with ``--executors N`` each executor reports the same call, which :meth:`Desired.record`
applies idempotently.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from infermux.dataplane.operations import Operations
from infermux.dataplane.plane import DataPlane
from infermux.errors import InfermuxError
from infermux.observability.trace_settings import specified
from infermux.repository import ModelRepository

logger = logging.getLogger("infermux.executor")

RESTART_FAILED = "reload after executor restart failed"

CHANGES = frozenset(
    {
        "load_model",
        "unload_model",
        "shm_register",
        "shm_unregister",
        "cuda_shm_register",
        "cuda_shm_unregister",
        "trace_settings",
    }
)
"""The data-plane calls that change what an executor must be given back after a restart.
(Traffic policy changes are not among them: a rollback undoes the previous change, which has no
meaning replayed on a fresh router.)"""

# Calls arrive as the channel carried them (positional or keyword); bound to the signature so
# that ``load_model("m", config_override=c)`` and ``load_model("m", c)`` read the same.
# (A load's ``files`` arrive here as the executor read them from the arena, never as blocks.)
_SIGNATURES = {name: inspect.signature(getattr(Operations, name)) for name in CHANGES}


def _bound(method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    bound = _SIGNATURES[method].bind(None, *args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


class ModelWish(msgspec.Struct, frozen=True):
    """A model loaded (with its ``config`` override and override ``files``, as the client sent
    them) or unloaded."""

    loaded: bool
    config: str | None = None
    files: dict[str, bytes] | None = None


class SystemRegion(msgspec.Struct, frozen=True):
    key: str
    offset: int
    byte_size: int


class CudaRegion(msgspec.Struct, frozen=True):
    raw_handle: bytes
    device_id: int
    byte_size: int


class Desired(msgspec.Struct):
    """What clients changed: models by name, shared-memory regions by name, trace settings by
    scope ("": global, else a model's; as clients sent them)."""

    models: dict[str, ModelWish] = msgspec.field(default_factory=dict)
    shm: dict[str, SystemRegion] = msgspec.field(default_factory=dict)
    cuda_shm: dict[str, CudaRegion] = msgspec.field(default_factory=dict)
    trace: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)

    def copy(self) -> Desired:
        return Desired(dict(self.models), dict(self.shm), dict(self.cuda_shm), dict(self.trace))

    def record(self, method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Apply one call of :data:`CHANGES` that succeeded (the same call twice: no change)."""
        a = _bound(method, args, kwargs)
        if method == "load_model":
            files = a["files"]
            self.models[a["name"]] = ModelWish(
                True,
                a["config_override"],
                {k: bytes(v) for k, v in files.items()} if files else None,
            )
        elif method == "unload_model":
            self.models[a["name"]] = ModelWish(False)
        elif method == "shm_register":
            self.shm[a["name"]] = SystemRegion(a["key"], a["offset"], a["byte_size"])
        elif method == "cuda_shm_register":
            region = CudaRegion(bytes(a["raw_handle"]), a["device_id"], a["byte_size"])
            self.cuda_shm[a["name"]] = region
        elif method == "trace_settings":
            scope = specified(self.trace.get(a["model"], {}), a["changes"] or {})
            if scope:
                self.trace[a["model"]] = scope  # a new dict: copies share the old ones
            else:
                self.trace.pop(a["model"], None)
        elif method in ("shm_unregister", "cuda_shm_unregister"):
            regions: dict[str, Any] = self.shm if method == "shm_unregister" else self.cuda_shm
            if a["name"]:
                regions.pop(a["name"], None)
            else:  # "" unregisters every region of the kind
                regions.clear()


class Held:
    """An executor's side: what clients changed, as in effect on it. ``report`` tells the
    supervisor of each change (as :class:`~.control.Changed` takes it)."""

    def __init__(
        self,
        plane: DataPlane,
        repository: ModelRepository,
        report: Callable[[str, list[Any], dict[str, Any]], None],
    ) -> None:
        self._plane = plane
        self._repository = repository
        self._report = report
        self.desired = Desired()

    def observe(self, method: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        """A front end's call succeeded here (the channel server's observer)."""
        if method == "trace_settings" and not _bound(method, args, kwargs).get("changes"):
            return  # a read
        if method in CHANGES:
            self.desired.record(method, args, kwargs)
            self._report(method, args, kwargs)
        elif method == "log_settings" and (args or kwargs) and (args or [None])[0] is not None:
            # Not desired state of this executor: the supervisor passes it to every process.
            self._report(method, args, kwargs)

    async def restore(self, want: Desired) -> None:
        """Bring this executor to ``want`` (:func:`restore`); what had to be dropped is
        reported as the unregistration it amounts to."""
        dropped = await restore(self._plane, self._repository, self.desired, want)
        self.desired = want.copy()
        for method, name in dropped:
            self.observe(method, [name], {})


async def restore(
    plane: DataPlane, repository: ModelRepository, have: Desired, want: Desired
) -> list[tuple[str, str]]:
    """Bring a fresh executor's ``plane`` from ``have`` to ``want``: unregister, unload, then
    load and register what differs. A model whose load fails stays wished for (the next
    restart tries again) and the index says why; a region that cannot be mapped again (its
    object was deleted) is dropped. Returns the unregistrations the supervisor must record for
    the dropped regions, as ``(method, name)``."""
    dropped: list[tuple[str, str]] = []
    for name in [n for n in have.shm if have.shm[n] != want.shm.get(n)]:
        await plane.shm_unregister(name)
    for name in [n for n in have.cuda_shm if have.cuda_shm[n] != want.cuda_shm.get(n)]:
        await plane.cuda_shm_unregister(name)
    changed = {n: w for n, w in want.models.items() if have.models.get(n) != w}
    for name in [n for n, wish in changed.items() if not wish.loaded]:
        try:
            await plane.unload_model(name)
        except InfermuxError as exc:  # e.g. gone from the repository: unloaded anyway
            logger.info("model '%s' stays unloaded after the restart (%s)", name, exc)
    loads = [n for n, wish in changed.items() if wish.loaded]
    await asyncio.gather(*(_load(plane, repository, n, changed[n]) for n in loads))
    for name, region in want.shm.items():
        if have.shm.get(name) == region:
            continue
        try:
            await plane.shm_register(name, region.key, region.offset, region.byte_size)
        except InfermuxError as exc:
            _drop("system", name, exc)
            dropped.append(("shm_unregister", name))
    for scope in sorted(have.trace.keys() | want.trace.keys()):  # "" (global) first
        before, after = have.trace.get(scope, {}), want.trace.get(scope, {})
        if before == after:
            continue
        changes = {**dict.fromkeys(before), **after}
        try:
            await plane.trace_settings(scope, changes)
        except InfermuxError as exc:  # a model this executor does not host
            logger.info("trace settings of '%s' not restored (%s)", scope, exc)
    for name, cuda in want.cuda_shm.items():
        if have.cuda_shm.get(name) == cuda:
            continue
        try:
            await plane.cuda_shm_register(name, cuda.raw_handle, cuda.device_id, cuda.byte_size)
        except InfermuxError as exc:
            _drop("CUDA", name, exc)
            dropped.append(("cuda_shm_unregister", name))
    return dropped


async def _load(plane: DataPlane, repository: ModelRepository, name: str, wish: ModelWish) -> None:
    try:
        await plane.load_model(name, config_override=wish.config, files=wish.files)
    except InfermuxError as exc:
        reason = f"{RESTART_FAILED}: {exc}"
        logger.error("model '%s': %s", name, reason)
        repository.mark_unavailable(name, reason)
    else:
        logger.info("model '%s' loaded again after the executor restart", name)


def _drop(kind: str, name: str, exc: InfermuxError) -> None:
    logger.warning(
        "%s shared-memory region '%s' could not be registered again after the executor "
        "restart, so it is unregistered: %s",
        kind,
        name,
        exc,
    )


__all__ = ["CHANGES", "CudaRegion", "Desired", "Held", "ModelWish", "SystemRegion", "restore"]
