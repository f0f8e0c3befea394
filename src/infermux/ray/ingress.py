"""``infermux serve --ray ADDRESS``: infermux's HTTP and gRPC front ends as the ingress of models
served by Ray Serve replicas on an existing cluster.

Start-up binds the listeners, connects to the cluster, deploys the repository's models (one Ray
Serve application each, ``deploy.py``) and then serves; in poll mode a changed model is rolled
through its replicas. On shutdown the front ends drain, then the applications this ingress
deployed are deleted (their replicas finish what they hold first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from infermux import __version__
from infermux.errors import InfermuxError
from infermux.frontends import unix_socket
from infermux.frontends.serving import FrontEnds, http_sockets
from infermux.ray.deploy import DEPLOY_WAIT_S, Deployer
from infermux.ray.plane import RayDataPlane
from infermux.settings import ServerSettings

logger = logging.getLogger("infermux")


class RayServer:
    """The ingress process. ``run`` serves until :meth:`request_shutdown`."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.deployer = Deployer(settings)
        self.dataplane = RayDataPlane(
            self.deployer,
            explicit=settings.model_control_mode == "explicit",
            name=settings.server_name,
        )
        self._stop = asyncio.Event()

    def request_shutdown(self) -> None:
        if not self._stop.is_set():
            logger.info("shutting down: finishing in-flight requests")
        self.dataplane.begin_shutdown()
        self._stop.set()

    async def run(self) -> None:
        if self.settings.frontends > 1 or self.settings.executors > 1:
            logger.info("--ray: the ingress runs its front ends in this one process")
        sockets, socket_files = http_sockets(self.settings)
        try:
            fronts = FrontEnds(self.settings, self.dataplane, sockets)
            await asyncio.to_thread(self.deployer.connect)
            self._reclaim_signals()
            await self._deploy_all()
            await fronts.bind_grpc()
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        poller = None
        try:
            await fronts.start_http()
            endpoints = fronts.announce()
            if self.settings.model_control_mode == "poll":
                poller = asyncio.create_task(self._poll(), name="ray-poll")
            logger.info(
                "infermux %s ready: %s (models: %s; on Ray at %s)",
                __version__,
                ", ".join(endpoints),
                ", ".join(sorted(self.deployer.deployed)) or "none",
                self.settings.ray_address,
            )
            await fronts.serve_until(self._stop)
        finally:
            if poller is not None:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
            self.dataplane.begin_shutdown()
            await fronts.stop()
            try:
                await asyncio.to_thread(self.deployer.undeploy_all)
            except Exception as exc:  # the cluster may be gone already
                logger.warning("deleting the Ray applications failed: %s", exc)
            for path in socket_files:
                unix_socket.remove(path)
            logger.info("infermux stopped")

    def _reclaim_signals(self) -> None:
        # Connecting to Ray installs its core worker's crash handler on SIGTERM, which treats
        # the signal as a crash and aborts the process 3 s later, in the middle of the graceful
        # shutdown. Ours go back on top.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_shutdown)

    async def _deploy_all(self) -> None:
        """Send every wanted model, then wait for them together (a model Ray cannot place, or
        that fails to load, is reported and does not hold up the others)."""
        sent: list[str] = []
        for name in self.deployer.wanted():
            try:
                await asyncio.to_thread(self.deployer.submit, name)
                sent.append(name)
            except InfermuxError as exc:
                logger.error("model '%s' was not deployed: %s", name, exc)
        waits = [asyncio.to_thread(self.deployer.wait, name, DEPLOY_WAIT_S) for name in sent]
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
        for name, outcome in zip(sent, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                logger.error("model '%s' is not running: %s", name, outcome)

    async def _poll(self) -> None:
        """Roll models whose files changed and stayed unchanged for one poll interval (the
        repository poller's rule: a model being copied in is not deployed half-written)."""
        pending: dict[str, int] = {}
        while True:
            await asyncio.sleep(self.settings.repository_poll_secs)
            changed = await asyncio.to_thread(self.deployer.changed)
            for name in changed:
                pending[name] = pending.get(name, 0) + 1
                if pending[name] < 2:
                    continue
                pending.pop(name)
                try:
                    await self.dataplane.redeploy(name)
                    logger.info("model '%s' rolled to its new files", name)
                except InfermuxError as exc:
                    logger.error("model '%s': rolling to its new files failed: %s", name, exc)
            for name in [n for n in pending if n not in changed]:
                pending.pop(name)
