"""A POSIX shared-memory segment: created (and unlinked) by one process, mapped by others."""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]  # CPython's shm_open, as shared_memory uses
import ctypes
import mmap
import os
from multiprocessing import shared_memory


class Segment:
    """``size`` bytes of shared memory. ``Segment(size)`` creates one; :meth:`attach` maps one
    by :attr:`name`. Only the creator unlinks it."""

    def __init__(self, size: int, *, name: str | None = None) -> None:
        # The creator registers the segment with multiprocessing's resource tracker, which
        # unlinks it if this process dies without closing it.
        self._shm: shared_memory.SharedMemory | None = shared_memory.SharedMemory(
            name=name, create=True, size=size
        )
        self.name: str = self._shm.name
        self.size = size
        self._map: mmap.mmap | None = None
        self._buf: memoryview | None = self._shm.buf

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map a segment another process created."""
        segment = cls.__new__(cls)
        # Mapped directly, not through SharedMemory: before Python 3.13 an attaching
        # SharedMemory registers the segment with this process's resource tracker, which would
        # unlink the creator's segment when this process exits.
        fd = _posixshmem.shm_open("/" + name.lstrip("/"), os.O_RDWR, mode=0o600)
        try:
            segment.size = os.fstat(fd).st_size
            segment._map = mmap.mmap(fd, segment.size)
        finally:
            os.close(fd)
        segment._shm = None
        segment.name = name
        segment._buf = memoryview(segment._map)
        return segment

    @classmethod
    def anonymous(cls, size: int) -> Segment:
        """``size`` bytes of this process's own memory (no name, nothing to unlink): for an
        :class:`~infermux.ipc.arena.Arena` that never crosses a process boundary."""
        segment = cls.__new__(cls)
        segment._map = mmap.mmap(-1, size)
        segment._shm = None
        segment.name = ""
        segment.size = size
        segment._buf = memoryview(segment._map)
        return segment

    @property
    def address(self) -> int:
        """Where the mapping starts in this process."""
        return ctypes.addressof(ctypes.c_char.from_buffer(self.buf))

    @property
    def owner(self) -> bool:
        return self._shm is not None

    @property
    def buf(self) -> memoryview:
        if self._buf is None:
            raise ValueError(f"shared memory segment '{self.name}' is closed")
        return self._buf

    def close(self) -> None:
        """Unmap (views handed out must be released first); the creator also unlinks."""
        if self._buf is not None:
            self._buf.release()
            self._buf = None
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None
