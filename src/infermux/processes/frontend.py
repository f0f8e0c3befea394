"""A front-end process: HTTP and gRPC over a :class:`RemoteDataPlane`.

It starts listening at once (it is live, not ready, until the supervisor attaches an executor
channel) and follows the supervisor's messages: a new channel when an executor is ready, a
detach when it died (requests in flight then fail UNAVAILABLE; the process keeps serving).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

from infermux.dataplane.assembly import server_metadata
from infermux.errors import StartupError
from infermux.frontends.serving import FrontEnds
from infermux.runtime import garbage
from infermux.settings import ServerSettings
from infermux.transport.remote_plane import RemoteDataPlane

from .common import become_child, configure_logging, run
from .control import Control, Failed, Started, follow

logger = logging.getLogger("infermux.frontend")


def main(
    settings: ServerSettings,
    index: int,
    sock: socket.socket,
    http_sockets: list[socket.socket],
    grpc_port: int,
) -> None:
    """Process entry point (spawned by the supervisor). Front end 0 owns the gRPC unix socket,
    which unlike a TCP port cannot be shared."""
    become_child()
    configure_logging(settings, f"frontend-{index}")
    run(_serve(settings, index, sock, http_sockets, grpc_port))


async def _serve(
    settings: ServerSettings,
    index: int,
    sock: socket.socket,
    http_sockets: list[socket.socket],
    grpc_port: int,
) -> None:
    control = await Control.open(sock)
    for listener in http_sockets:
        listener.setblocking(False)
    remote = RemoteDataPlane(
        server_metadata(settings),
        settings.executors,
        ready_timeout_s=settings.executor_ready_timeout_ms / 1000,
        poll_seconds=settings.channel_poll_us / 1e6,
    )
    try:
        fronts = FrontEnds(
            settings,
            remote,
            http_sockets,
            grpc_port=grpc_port,
            reuse_port=True,
            grpc_uds=index == 0,
        )
        await fronts.bind_grpc()
        await fronts.start_http()
        fronts.announce()  # sets the gRPC unix socket's mode, as in one process
    except StartupError as exc:
        control.send(Failed(str(exc)))
        await control.drain()
        return
    garbage.settle()  # before Started: its one full collection holds up no request
    control.send(Started(fronts.grpc_port))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def until_stopped() -> None:
        await follow(
            control,
            lambda m: remote.attach(m.spec, m.executor),
            lambda m: remote.detach(m.reason, m.channel),
        )
        stop.set()  # told to, or the supervisor is gone

    following = asyncio.create_task(until_stopped())
    await fronts.serve_until(stop)
    # Requests already admitted are answered (the executor stays attached until they are).
    remote.begin_shutdown()
    await fronts.stop()
    following.cancel()
    remote.detach("the server is shutting down")
    control.close()
