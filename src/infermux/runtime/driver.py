"""The few CUDA driver calls the event-loop GPU path makes per batch, through ``ctypes``.

A launched batch copies each request's rows to the device where they lie (pinned host memory, or
a client's CUDA shared memory) and asks to be told when the stream is done. Through torch each
such copy is a tensor made over the memory plus a ``copy_``, ~10-20 µs of Python and dispatch per
request on the event loop; one driver call per copy through ``ctypes`` costs less, but the driver
itself spends several µs on each (a batch of 46 BERT requests' device-to-device input copies took
~360 µs of the loop thread on the H200). So a batch's copies go to the driver in one
``cuMemcpyBatchAsync`` call (CUDA 12.8 and later) where the driver has it, and one
``cuMemcpyAsync`` per copy where it does not (:meth:`Driver.copy`). That halves the cost of host
copies but saves little on small device-to-device ones, which take one kernel launch instead
(:mod:`~infermux.runtime.gather_kernel`, through :meth:`Driver.load_function` and
:meth:`Driver.launch_kernel`; ``docs/decisions.md``). ``libcuda.so.1`` is the driver torch itself
loaded; the calls run on the stream's context, which the caller makes current
(``torch.cuda.device``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Iterable, Sequence
from typing import Any

_HOST_REGISTER_PORTABLE = 0x01
_SRC_ACCESS_ORDER_STREAM = 1
"""``CU_MEMCPY_SRC_ACCESS_ORDER_STREAM``: each source is read in stream order, as a plain
``cuMemcpyAsync`` reads it (the rows may be written just before, by this stream's work)."""


class _MemcpyAttributes(ctypes.Structure):
    """``CUmemcpyAttributes``: the source access order, two location hints (ignored for memory
    that is not managed), flags."""

    _fields_ = (
        ("src_access_order", ctypes.c_int),
        ("src_location_type", ctypes.c_int),
        ("src_location_id", ctypes.c_int),
        ("dst_location_type", ctypes.c_int),
        ("dst_location_id", ctypes.c_int),
        ("flags", ctypes.c_uint),
    )


Copy = tuple[int, int, int]
"""One copy of a batch: (destination address, source address, bytes)."""


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
        self.batch_copies = ""
        """The driver's batched copy that :meth:`copy` uses ("": none, one call per copy)."""
        self._batch: Any = None
        self._attributes = _MemcpyAttributes(src_access_order=_SRC_ACCESS_ORDER_STREAM)
        self._attribute_index = ctypes.c_size_t(0)
        self._fail_index = ctypes.c_size_t(0)

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
                    ("cuMemcpyAsync", (ctypes.c_uint64, ctypes.c_uint64, size, pointer)),
                    ("cuMemHostRegister_v2", (pointer, size, ctypes.c_uint)),
                    ("cuMemHostUnregister", (pointer,)),
                    ("cuModuleLoadData", (pointer, ctypes.c_char_p)),
                    ("cuModuleGetFunction", (pointer, pointer, ctypes.c_char_p)),
                    ("cuLaunchKernel", (pointer, *(ctypes.c_uint,) * 7, pointer, pointer, pointer)),
                ):
                    function = getattr(library, name)
                    function.restype = ctypes.c_int
                    function.argtypes = argtypes
                self._bind_batch(library)
                libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
                libc.sem_wait.restype = ctypes.c_int
                libc.sem_wait.argtypes = (ctypes.c_void_p,)
                self.sem_post = ctypes.cast(libc.sem_post, ctypes.c_void_p).value or 0
                self.libc = libc
                self._cuda = library
        return self._cuda

    def _bind_batch(self, library: Any) -> None:
        """CUDA 13's ``cuMemcpyBatchAsync_v2``, else 12.8's ``cuMemcpyBatchAsync`` (which also
        reports the index of a failed copy), else nothing."""
        pointer, size = ctypes.c_void_p, ctypes.c_size_t
        arrays = (pointer, pointer, pointer, size, pointer, pointer, size)
        for name, argtypes in (
            ("cuMemcpyBatchAsync_v2", (*arrays, pointer)),
            ("cuMemcpyBatchAsync", (*arrays, pointer, pointer)),
        ):
            function = getattr(library, name, None)
            if function is not None:
                function.restype = ctypes.c_int
                function.argtypes = argtypes
                self._batch, self.batch_copies = function, name
                return

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

    def load_function(self, image: bytes, name: bytes) -> int:
        """Load a module (PTX or cubin) into the current context and return its function
        ``name``. The module stays loaded for the process's life."""
        cuda = self.bind()
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        _check("cuModuleLoadData", cuda.cuModuleLoadData(ctypes.byref(module), image))
        found = cuda.cuModuleGetFunction(ctypes.byref(function), module, name)
        _check("cuModuleGetFunction", found)
        return function.value or 0

    def launch_kernel(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        parameter: ctypes.Structure,
        stream: int,
    ) -> None:
        """Queue ``function`` on ``stream`` with one by-value ``parameter`` (copied by the
        driver before this returns)."""
        parameters = (ctypes.c_void_p * 1)(ctypes.addressof(parameter))
        result = self.bind().cuLaunchKernel(function, *grid, *block, 0, stream, parameters, None)
        _check("cuLaunchKernel", result)

    def copy(self, copies: Sequence[Copy], stream: int) -> None:
        """Queue ``copies`` (destination, source, bytes; each address in device memory or
        pinned host memory) on ``stream``, in stream order as one step: the copies of one call
        may run in any order among themselves, so no two may overlap."""
        if not copies:
            return
        cuda = self.bind()
        batch = self._batch
        if batch is None or len(copies) == 1:
            for target, source, size in copies:
                _check("cuMemcpyAsync", cuda.cuMemcpyAsync(target, source, size, stream))
            return
        count = len(copies)
        # Three arrays in one block: destinations, sources, sizes (a ctypes array: ~3 µs for
        # 46 copies, half of what a numpy table costs).
        targets, sources, sizes = zip(*copies, strict=True)
        table = (ctypes.c_uint64 * (3 * count))(*targets, *sources, *sizes)
        start, row = ctypes.addressof(table), count * 8
        common = (start, start + row, start + 2 * row, count)
        attributes = (ctypes.addressof(self._attributes), ctypes.addressof(self._attribute_index))
        if self.batch_copies == "cuMemcpyBatchAsync":
            failed = ctypes.addressof(self._fail_index)
            result = batch(*common, *attributes, 1, failed, stream)
        else:
            result = batch(*common, *attributes, 1, stream)
        _check(self.batch_copies, result)


def gathered(target: int, parts: Iterable[tuple[int, int]]) -> list[Copy]:
    """The copies that lay ``parts`` (address, bytes) one after the other from ``target`` on."""
    copies = []
    for address, size in parts:
        copies.append((target, address, size))
        target += size
    return copies


def _check(name: str, result: int) -> None:
    if result != 0:
        raise DriverError(f"{name} failed with CUDA error {result}")


DRIVER = Driver()
