"""Unix-domain socket files for the front ends: stale-file handling, permissions, removal."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

SOCKET_MODE = 0o660  # owner and group: put clients in the socket's group to grant access


class SocketPathError(Exception):
    """The socket path cannot be used; the message says why."""


def clear_stale(path: Path) -> None:
    """Make ``path`` free to bind: remove a socket file nobody listens on, refuse anything else."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # left behind by a server that died: stale
        return
    finally:
        probe.close()
    raise SocketPathError(f"{path} is in use by a running server")


def listen_unix(path: Path) -> socket.socket:
    """A listening, non-blocking unix socket at ``path`` with mode 0660."""
    clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise SocketPathError(f"cannot listen on {path}: {exc.strerror}") from None
    os.chmod(path, SOCKET_MODE)
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def remove(path: Path) -> None:
    """Remove the socket file at shutdown (only if it is still a socket)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()


def set_mode(path: Path) -> None:
    """Give a socket file created by someone else (grpc) the front ends' mode."""
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, SOCKET_MODE)
