"""``pb_utils.Tensor``: a named array, as Triton's Python backend gives and takes them.

The array is held, never copied: an input is the request's own array (read-only when it came in
a binary body), an output is the model's array, handed to infermux's output path as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from infermux.backends.pb_utils.errors import TritonModelException

_DLPACK_CPU = 1  # DLDeviceType kDLCPU


class Tensor:
    """``Tensor(name, numpy_array)``; ``np.str_`` arrays are refused as Triton refuses them
    (BYTES tensors are object arrays of ``bytes``)."""

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | None = None) -> None:
        if not isinstance(name, str):
            raise TritonModelException(f"tensor name must be a str, got {type(name).__name__}")
        device: object = None
        if not isinstance(numpy_array, np.ndarray) and hasattr(numpy_array, "__dlpack__"):
            device = numpy_array  # a device tensor kept as it is (from_dlpack of a GPU tensor)
            array: npt.NDArray[Any] | None = None
        else:
            array = np.asarray(numpy_array)
            if array.dtype.type is np.str_ or array.dtype.kind == "V":
                raise TritonModelException(
                    "Tensor dtype used for numpy_array is not supported by Python backend. "
                    "Please use np.object_ instead."
                )
        self._name = name
        self._array = array
        self._device = device

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> npt.NDArray[Any]:
        """The array itself (no copy); raises for a tensor in GPU memory, as Triton does."""
        if self._array is None:
            raise TritonModelException(
                f"tensor '{self._name}' is in GPU memory: as_numpy() needs a CPU tensor; "
                "use to_dlpack()"
            )
        return self._array

    def is_cpu(self) -> bool:
        return self._array is not None

    def shape(self) -> list[int]:
        source = self._array if self._array is not None else self._device
        return [int(d) for d in getattr(source, "shape", ())]

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the tensor's memory (zero-copy), for ``torch.from_dlpack`` and
        the like."""
        source: Any = self._array if self._array is not None else self._device
        if self._array is not None and self._array.dtype == np.object_:
            raise TritonModelException(f"tensor '{self._name}': BYTES tensors have no DLPack form")
        return source.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._array is not None:
            return (_DLPACK_CPU, 0)
        device: tuple[int, int] = self._device.__dlpack_device__()  # type: ignore[attr-defined]
        return device

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """A tensor over another framework's memory (zero-copy): an object with ``__dlpack__``
        (a torch tensor, a numpy array), or a DLPack capsule (read with torch)."""
        if hasattr(dlpack_tensor, "__dlpack_device__"):
            kind, _ = dlpack_tensor.__dlpack_device__()
            if int(kind) == _DLPACK_CPU:
                return Tensor(name, np.from_dlpack(dlpack_tensor))
            return Tensor(name, dlpack_tensor)
        try:
            import torch.utils.dlpack
        except ImportError:
            raise TritonModelException(
                "from_dlpack of a bare DLPack capsule needs torch; pass the tensor itself"
            ) from None
        tensor = torch.utils.dlpack.from_dlpack(dlpack_tensor)
        return Tensor(name, tensor.numpy() if tensor.device.type == "cpu" else tensor)

    def __repr__(self) -> str:
        return f"Tensor(name={self._name!r}, shape={self.shape()})"
