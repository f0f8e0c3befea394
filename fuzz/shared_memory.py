"""Coverage-guided fuzzing (atheris / libFuzzer) of system shared memory against a client that
resizes its object: a real POSIX shm object is registered with fuzzed bounds, then fuzzed reads
and writes through fuzzed tensor descriptors are interleaved with ``ftruncate`` of the object
to fuzzed sizes (to 0, below the region, past it, back). A finding is any exception but
:class:`InfermuxError` or a crash: a region read or written through a mapping dies of SIGBUS
once the object has shrunk under it (issue 23), which libFuzzer reports as a deadly signal.

    pip install atheris
    python fuzz/shared_memory.py -max_total_time=60

``tests/unit/test_fuzz_harness.py`` runs it for a few seconds in CI.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import uuid

import atheris
import numpy as np

with atheris.instrument_imports(include=["infermux"]):
    from infermux.dataplane.shared_memory import SharedMemoryRegistry
    from infermux.errors import InfermuxError
    from infermux.types import SHM_BYTE_SIZE, SHM_OFFSET, SHM_REGION, Parameters, Tensor

import _posixshmem  # type: ignore[import-not-found]  # CPython's shm_open, as the server uses

KEY = f"/infermux_fuzz_{uuid.uuid4().hex[:8]}"
DATATYPES = ("BOOL", "INT8", "INT32", "FP16", "FP64", "BYTES")
FD = _posixshmem.shm_open(KEY, os.O_CREAT | os.O_RDWR, mode=0o600)
atexit.register(_posixshmem.shm_unlink, KEY)


def _tensor(data: atheris.FuzzedDataProvider) -> tuple[str, tuple[int, ...], Parameters]:
    datatype = DATATYPES[data.ConsumeIntInRange(0, len(DATATYPES) - 1)]
    shape = tuple(data.ConsumeIntInRange(0, 40) for _ in range(data.ConsumeIntInRange(0, 3)))
    parameters: Parameters = {
        SHM_REGION: "r" if data.ConsumeBool() else "ghost",
        SHM_BYTE_SIZE: data.ConsumeIntInRange(0, 600),
        SHM_OFFSET: data.ConsumeIntInRange(0, 600),
    }
    return datatype, shape, parameters


def one_input(raw: bytes) -> None:
    data = atheris.FuzzedDataProvider(raw)
    os.ftruncate(FD, data.ConsumeIntInRange(0, 1024))
    registry = SharedMemoryRegistry(enabled=True)
    with contextlib.suppress(InfermuxError):
        registry.register("r", KEY, data.ConsumeIntInRange(0, 512), data.ConsumeIntInRange(0, 512))
    try:
        for _ in range(data.ConsumeIntInRange(1, 6)):
            action = data.ConsumeIntInRange(0, 2)
            if action == 0:  # the client resizes its object under the registration
                os.ftruncate(FD, data.ConsumeIntInRange(0, 1024))
                continue
            datatype, shape, parameters = _tensor(data)
            with contextlib.suppress(InfermuxError):
                if action == 1:
                    array = registry.read(Tensor("x", datatype, shape, np.empty(0), parameters))
                    array.tobytes() if array.dtype != np.object_ else array.tolist()  # touch it
                else:
                    count = int(np.prod(shape)) if shape else 1
                    values = (
                        np.array([b"ab"] * count, dtype=np.object_).reshape(shape)
                        if datatype == "BYTES"
                        else np.ones(shape, dtype=np.int8).astype(_numpy(datatype))
                    )
                    registry.write(Tensor("y", datatype, shape, values), parameters)
    finally:
        registry.close()


def _numpy(datatype: str) -> str:
    return {"BOOL": "bool", "INT8": "int8", "INT32": "int32", "FP16": "float16"}.get(
        datatype, "float64"
    )


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
