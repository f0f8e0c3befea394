"""One kernel launch for a batch's device-to-device copies.

A launched batch copies each request's rows from a client's CUDA shared memory into the graph's
input, and each request's outputs back into its client's memory. Issued as copies, each costs the
driver ~4 µs of the event loop's CPU even inside one ``cuMemcpyBatchAsync`` (BERT, a batch of 46:
187 µs for one input, against 47 µs for the same count of host-to-device copies;
``docs/decisions.md``). A copy of a few hundred bytes is no work for the GPU, so all of them go in
one kernel, ``infermux_gather``, whose single by-value parameter lists up to :data:`MAX_COPIES`
(destination, source, bytes); the parameter block is copied when the kernel is queued, so nothing
has to stay alive or be uploaded for it.

The kernel is compiled once per process with NVRTC (``cuda.bindings.nvrtc``: cuda-python, which
the ``gpu`` extra installs for CUDA shared memory) to PTX and loaded once per device. Where that is
not possible (no NVRTC, a driver older than the PTX) the copies go to the driver as before
(:meth:`~infermux.runtime.driver.Driver.copy`) and :attr:`GatherKernel.unavailable` says why.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from typing import Any

from infermux.runtime.driver import DRIVER, Copy, Driver, DriverError

logger = logging.getLogger(__name__)

MAX_COPIES = 128
"""Copies one launch carries: its parameter (3 x 128 x 8 bytes + a count) stays under the 4 KiB
every CUDA GPU accepts. A batch with more is split into several launches."""

_THREADS = 256
_MAX_BLOCKS_PER_COPY = 64
_BYTES_PER_THREAD_STEP = 16  # one uint4 per thread and step when both ends are 16-byte aligned
_NAME = b"infermux_gather"
_ARCHITECTURE = b"--gpu-architecture=compute_75"  # the oldest CUDA 13 supports; JIT-ed up

SOURCE = b"""
struct Table {
    unsigned long long dst[128];
    unsigned long long src[128];
    unsigned long long size[128];
    int count;
};

extern "C" __global__ void infermux_gather(const Table table) {
    const int i = blockIdx.y;
    if (i >= table.count) return;
    unsigned char* dst = reinterpret_cast<unsigned char*>(table.dst[i]);
    const unsigned char* src = reinterpret_cast<const unsigned char*>(table.src[i]);
    const unsigned long long size = table.size[i];
    const unsigned long long first = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long done = 0;
    if (((table.dst[i] | table.src[i]) & 15ULL) == 0) {
        const unsigned long long words = size / 16;
        uint4* d = reinterpret_cast<uint4*>(dst);
        const uint4* s = reinterpret_cast<const uint4*>(src);
        for (unsigned long long j = first; j < words; j += stride) d[j] = s[j];
        done = words * 16;
    }
    for (unsigned long long j = done + first; j < size; j += stride) dst[j] = src[j];
}
"""


class _Table(ctypes.Structure):
    """The kernel's parameter, laid out as ``struct Table`` above."""

    _fields_ = (
        ("dst", ctypes.c_uint64 * MAX_COPIES),
        ("src", ctypes.c_uint64 * MAX_COPIES),
        ("size", ctypes.c_uint64 * MAX_COPIES),
        ("count", ctypes.c_int),
    )


def compile_ptx() -> bytes:
    """The kernel as PTX, through NVRTC; raises ``RuntimeError`` saying why it cannot be."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise RuntimeError(f"NVRTC is not installed (cuda-python): {exc}") from None
    success = nvrtc.nvrtcResult.NVRTC_SUCCESS

    def check(what: str, result: Any) -> Any:
        error, *values = result
        if error != success:
            raise RuntimeError(f"{what} failed: {error!r}")
        return values[0] if values else None

    try:
        created = nvrtc.nvrtcCreateProgram(SOURCE, b"gather.cu", 0, [], [])
    except Exception as exc:  # the bindings load libnvrtc on first use
        raise RuntimeError(f"NVRTC cannot be loaded: {exc}") from None
    program = check("nvrtcCreateProgram", created)
    try:
        options = [_ARCHITECTURE]
        (error,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if error != success:
            size = check("nvrtcGetProgramLogSize", nvrtc.nvrtcGetProgramLogSize(program))
            log = b" " * int(size)
            check("nvrtcGetProgramLog", nvrtc.nvrtcGetProgramLog(program, log))
            raise RuntimeError(f"nvrtcCompileProgram failed: {log.decode(errors='replace')}")
        size = check("nvrtcGetPTXSize", nvrtc.nvrtcGetPTXSize(program))
        ptx = b" " * int(size)
        check("nvrtcGetPTX", nvrtc.nvrtcGetPTX(program, ptx))
        return ptx
    finally:
        nvrtc.nvrtcDestroyProgram(program)


class GatherKernel:
    """The kernel, loaded per device on first use (:data:`GATHER`)."""

    def __init__(self, driver: Driver = DRIVER) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._ptx: bytes | None = None
        self._functions: dict[int, int] = {}
        self.unavailable = ""
        """Why the kernel is not used ("" while it is, or has not been tried)."""

    def function(self, device_id: int) -> int:
        """The kernel's handle on ``device_id`` (0 when it cannot be had), loading it on first
        use into the current context, which must be the device's (the caller's
        ``torch.cuda.device``)."""
        found = self._functions.get(device_id)
        if found is not None:
            return found
        with self._lock:
            if device_id not in self._functions:
                self._functions[device_id] = self._load()
            return self._functions[device_id]

    def _load(self) -> int:
        if self.unavailable:
            return 0
        try:
            if self._ptx is None:
                self._ptx = compile_ptx()
            return self._driver.load_function(self._ptx, _NAME)
        except (RuntimeError, DriverError, OSError) as exc:  # OSError: no libcuda
            self.unavailable = str(exc)
            logger.info("no gather kernel: device copies go to the driver: %s", exc)
            return 0

    def copy(self, copies: Sequence[Copy], stream: int, device_id: int) -> None:
        """Queue ``copies`` (device memory of ``device_id`` on both ends, no two overlapping) on
        ``stream``: in launches of the kernel, or through the driver where it is unavailable."""
        if not copies:
            return
        function = self.function(device_id) if len(copies) > 1 else 0
        if not function:
            self._driver.copy(copies, stream)
            return
        for start in range(0, len(copies), MAX_COPIES):
            self._launch(function, copies[start : start + MAX_COPIES], stream)

    def _launch(self, function: int, copies: Sequence[Copy], stream: int) -> None:
        count = len(copies)
        targets, sources, sizes = zip(*copies, strict=True)
        column = ctypes.c_uint64 * MAX_COPIES
        table = _Table(column(*targets), column(*sources), column(*sizes), count)
        per_block = _THREADS * _BYTES_PER_THREAD_STEP
        blocks = min(_MAX_BLOCKS_PER_COPY, max(1, -(-max(sizes) // per_block)))
        self._driver.launch_kernel(function, (blocks, count, 1), (_THREADS, 1, 1), table, stream)


GATHER = GatherKernel()
"""The process's gather kernel."""
