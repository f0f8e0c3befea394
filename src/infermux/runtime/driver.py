"""The few CUDA driver calls the event-loop GPU path makes per batch, through ``ctypes``.

A launched batch copies each request's rows to the device where they lie (pinned host memory, or
a client's CUDA shared memory) and asks to be told when the stream is done. Through torch each
such copy is a tensor made over the memory plus a ``copy_``, ~10-20 µs of Python and dispatch per
request on the event loop; ``cuMemcpyHtoDAsync``/``cuMemcpyDtoDAsync`` through ``ctypes`` cost ~1-2
µs (``docs/decisions.md``). ``libcuda.so.1`` is the driver torch itself loaded; the calls run on
the stream's context, which the caller makes current (``torch.cuda.device``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Iterable
from typing import Any

_HOST_REGISTER_PORTABLE = 0x01


class DriverError(RuntimeError):
    """A driver call failed; the message names it and the CUDA error code."""


class Driver:
    """``libcuda`` and libc functions, bound on first use (:data:`DRIVER`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cuda: Any = None
        self.libc: Any = None
        self.sem_post: int = 0
        """The address of libc's ``sem_post``, a host function the driver may call."""

    def bind(self) -> Any:
        """The bound library (binding it, and libc, on first use)."""
        cuda = self._cuda
        if cuda is not None:
            return cuda
        with self._lock:
            if self._cuda is None:
                library = ctypes.CDLL("libcuda.so.1")
                pointer, size = ctypes.c_void_p, ctypes.c_size_t
                for name, argtypes in (
                    ("cuLaunchHostFunc", (pointer, pointer, pointer)),
                    ("cuMemcpyHtoDAsync_v2", (ctypes.c_uint64, pointer, size, pointer)),
                    ("cuMemcpyDtoDAsync_v2", (ctypes.c_uint64, ctypes.c_uint64, size, pointer)),
                    ("cuMemHostRegister_v2", (pointer, size, ctypes.c_uint)),
                    ("cuMemHostUnregister", (pointer,)),
                ):
                    function = getattr(library, name)
                    function.restype = ctypes.c_int
                    function.argtypes = argtypes
                libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
                libc.sem_wait.restype = ctypes.c_int
                libc.sem_wait.argtypes = (ctypes.c_void_p,)
                self.sem_post = ctypes.cast(libc.sem_post, ctypes.c_void_p).value or 0
                self.libc = libc
                self._cuda = library
        return self._cuda

    def launch_host_func(self, stream: int, function: int, data: int) -> None:
        """Have the driver call ``function(data)`` once the stream reaches this point."""
        _check("cuLaunchHostFunc", self.bind().cuLaunchHostFunc(stream, function, data))

    def host_register(self, start: int, size: int) -> int:
        """Page-lock ``size`` bytes at ``start`` for every context (``PORTABLE``); returns the
        CUDA error code (0: done). The driver API, not the runtime's ``cudaHostRegister``: a
        refusal there would linger as the runtime's last error and be blamed on a later kernel."""
        return int(self.bind().cuMemHostRegister_v2(start, size, _HOST_REGISTER_PORTABLE))

    def host_unregister(self, start: int) -> int:
        return int(self.bind().cuMemHostUnregister(start))

    def gather_to_device(
        self, target: int, parts: Iterable[tuple[int, int]], stream: int, *, from_host: bool
    ) -> int:
        """Copy ``parts`` (address, bytes) one after the other to device address ``target``,
        asynchronously on ``stream``: from pinned host memory (``from_host``) or from device
        memory. Returns the bytes queued."""
        cuda = self.bind()
        copy = cuda.cuMemcpyHtoDAsync_v2 if from_host else cuda.cuMemcpyDtoDAsync_v2
        name = "cuMemcpyHtoDAsync" if from_host else "cuMemcpyDtoDAsync"
        offset = 0
        for address, size in parts:
            _check(name, copy(target + offset, address, size, stream))
            offset += size
        return offset

    def scatter_from_device(
        self, source: int, parts: Iterable[tuple[int, int]], stream: int
    ) -> int:
        """Copy consecutive bytes from device address ``source`` to ``parts`` (address, bytes),
        one after the other, device to device, asynchronously on ``stream``: the reverse of
        :meth:`gather_to_device`. Returns the bytes queued."""
        copy = self.bind().cuMemcpyDtoDAsync_v2
        offset = 0
        for address, size in parts:
            _check("cuMemcpyDtoDAsync", copy(address, source + offset, size, stream))
            offset += size
        return offset


def _check(name: str, result: int) -> None:
    if result != 0:
        raise DriverError(f"{name} failed with CUDA error {result}")


DRIVER = Driver()
