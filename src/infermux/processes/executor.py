"""An executor process: a data plane (models, batchers, GPU runtime) behind every front end.
It loads the repository (with ``--executors N``, only the instances its shard holds:
``repository/placement.py``), tells the supervisor it is ready, then serves whatever channels
the supervisor attaches, until told to stop (or until the supervisor is gone)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Coroutine
from typing import Any

from infermux.dataplane.assembly import build_dataplane, build_repository
from infermux.errors import InfermuxError, StartupError
from infermux.frontends.metrics import MetricsEndpoint
from infermux.observability import metrics as prometheus
from infermux.observability.progress import LoadProgress
from infermux.observability.tracing import TRACING
from infermux.repository import Shard
from infermux.runtime import garbage
from infermux.settings import ServerSettings
from infermux.transport.channel_server import ChannelServer

from .common import become_child, configure_logging, run
from .control import (
    Changed,
    Control,
    Detach,
    Failed,
    Ready,
    Restore,
    Restored,
    Scrape,
    Scraped,
    follow,
)
from .desired import Desired, Held

logger = logging.getLogger("infermux.executor")


def main(
    settings: ServerSettings,
    index: int,
    sock: socket.socket,
    metrics_sock: socket.socket | None,
    desired: Desired,
) -> None:
    """Process entry point (spawned by the supervisor). ``metrics_sock``: the supervisor's
    metrics listener (it outlives executors), served here, where the model statistics are, when
    there is one executor; with several the supervisor serves it and asks each for its part.
    ``desired``: what clients changed before this process started (:mod:`.desired`), in
    effect before it reports ready."""
    become_child()
    configure_logging(settings, "executor" if settings.executors == 1 else f"executor-{index}")
    run(_serve(settings, Shard(index, settings.executors), sock, metrics_sock, desired))


async def _serve(
    settings: ServerSettings,
    shard: Shard,
    sock: socket.socket,
    metrics_sock: socket.socket | None,
    desired: Desired,
) -> None:
    control = await Control.open(sock)
    progress = LoadProgress() if LoadProgress.wanted() and shard.index == 0 else None
    # Decoupled models are served: their streams cross the channel (transport/streams.py).
    repository = build_repository(settings, progress, shard)
    plane = build_dataplane(settings, repository)
    held = Held(plane, repository, lambda *call: control.send(Changed(*call)))
    channels = ChannelServer(plane, held.observe, poll_seconds=settings.channel_poll_us / 1e6)
    metrics = (
        MetricsEndpoint(settings, repository, plane.router, metrics_sock) if metrics_sock else None
    )
    # Several executors: the supervisor merges every executor's families; the GPUs and the
    # process figures come from executor 0 alone (each would read the same GPUs).
    families = (
        prometheus.registry(
            repository,
            plane.router,
            gpu=settings.allow_gpu_metrics and shard.index == 0,
            process=shard.index == 0,
        )
        if settings.allow_metrics and shard.count > 1
        else None
    )

    def scrape(message: Scrape) -> None:
        data = prometheus.family_data(families) if families is not None else []
        control.send(Scraped(message.seq, data))

    try:
        TRACING.start(settings.trace)
        with progress or contextlib.nullcontext():
            await repository.start(skip=desired.models)
        await held.restore(desired)
        if metrics is not None:
            await metrics.start()
    except (StartupError, InfermuxError, OSError) as exc:
        control.send(Failed(str(exc)))
        await control.drain()
        await repository.close()
        TRACING.shutdown()
        return
    # Before Ready, not after: its one full collection must not hold up the first requests.
    garbage.settle()  # what start-up built (torch, the models) is not walked again
    models = repository.index(ready_only=True)
    control.send(Ready([f"{e.name}:{e.version}" for e in models]))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    tasks: set[asyncio.Task[None]] = set()

    def background(work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def restored(message: Restore) -> None:
        await held.restore(message.desired)
        control.send(Restored())

    def detach(message: Detach) -> None:
        background(channels.detach(message.channel))

    def on_restore(message: Restore) -> None:
        background(restored(message))

    async def until_stopped() -> None:
        await follow(
            control,
            lambda m: channels.attach(m.spec),
            detach,
            scrape,
            on_restore,
            on_log=plane.apply_log_changes,
        )
        stop.set()  # told to, or the supervisor is gone

    following = asyncio.create_task(until_stopped())
    await stop.wait()
    following.cancel()
    logger.info("executor stopping: finishing admitted requests")
    plane.begin_shutdown()
    await channels.close()
    await asyncio.gather(*tasks)
    await repository.close()
    if metrics is not None:
        await metrics.stop()
    TRACING.shutdown()
    plane.close()
    control.close()
