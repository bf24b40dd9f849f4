"""describe() on objects that only speak DLPack (``__dlpack__`` + ``__dlpack_device__``)."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from tent_core import InvalidRequestError
from tent_core.memory import describe
from tent_core.types import MemoryKind


class DLPackOnly:
    """Exposes only the DLPack protocol of the wrapped producer, so describe() takes the DLPack branch."""

    def __init__(self, inner: Any, device: tuple[int, int] | None = None, **dlpack_kw: Any) -> None:
        self._inner = inner
        self._device = device
        self._kw = dlpack_kw

    def __dlpack__(self, **kw: Any) -> Any:
        return self._inner.__dlpack__(**{**self._kw, **kw})

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device if self._device is not None else self._inner.__dlpack_device__()


def _ptr(arr: np.ndarray) -> int:
    return int(arr.__array_interface__["data"][0])


def test_numpy_host_region_aliases_memory() -> None:
    arr = np.arange(24, dtype=np.float32).reshape(4, 6)
    region = describe(DLPackOnly(arr))
    assert region.kind is MemoryKind.HOST
    assert region.addr == _ptr(arr)
    assert region.length == arr.nbytes
    assert region.device == -1
    assert region.array is not None and region.array.dtype == np.uint8 and region.array.size == arr.nbytes
    region.array[:4] = np.frombuffer(np.float32(-7.5).tobytes(), np.uint8)
    assert arr[0, 0] == -7.5


def test_versioned_capsule() -> None:
    arr = np.arange(10, dtype=np.int64)
    region = describe(DLPackOnly(arr, max_version=(1, 0)))
    assert (region.addr, region.length, region.kind) == (_ptr(arr), arr.nbytes, MemoryKind.HOST)


def test_offset_view_address() -> None:
    base = np.arange(32, dtype=np.int16)
    view = base[5:]
    region = describe(DLPackOnly(view))
    assert region.addr == _ptr(base) + 5 * 2
    assert region.length == view.nbytes


def test_keepalive_holds_memory() -> None:
    arr = np.full(1000, 3, dtype=np.uint8)
    wrapper = DLPackOnly(arr)
    region = describe(wrapper)
    assert region.keepalive[0] is wrapper and len(region.keepalive) == 2
    del arr, wrapper
    gc.collect()
    assert region.array is not None and int(region.array.sum()) == 3000


def test_non_contiguous_rejected() -> None:
    arr = np.arange(24, dtype=np.float64).reshape(4, 6)
    with pytest.raises(InvalidRequestError, match="contiguous"):
        describe(DLPackOnly(arr[:, ::2]))


def test_size_one_dims_any_stride() -> None:
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    col = arr[:, 1:2][:1]  # shape (1, 1), strides not compact
    region = describe(DLPackOnly(col))
    assert (region.addr, region.length) == (_ptr(arr) + 8, 8)


def test_zero_size() -> None:
    region = describe(DLPackOnly(np.empty((0, 5), dtype=np.float32)))
    assert region.length == 0
    assert region.kind is MemoryKind.HOST
    assert region.array is not None and region.array.size == 0


def test_unsupported_device_type() -> None:
    with pytest.raises(InvalidRequestError, match="device type 10"):
        describe(DLPackOnly(np.zeros(4), device=(10, 0)))


def test_device_types_map_to_kinds() -> None:
    arr = np.zeros(8, dtype=np.uint8)
    pinned = describe(DLPackOnly(arr, device=(3, 0)))  # kDLCUDAHost: pinned host memory
    assert pinned.kind is MemoryKind.HOST and pinned.array is not None
    cuda = describe(DLPackOnly(arr, device=(2, 1)))  # kDLCUDA (fake: only the classification is checked)
    assert (cuda.kind, cuda.device, cuda.array, cuda.length) == (MemoryKind.CUDA, 1, None, 8)
    managed = describe(DLPackOnly(arr, device=(13, 0)))  # kDLCUDAManaged
    assert managed.kind is MemoryKind.CUDA and managed.device == 0


def test_torch_cpu_tensor_via_dlpack() -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(16, dtype=torch.float32)
    region = describe(DLPackOnly(t))
    assert (region.addr, region.length, region.kind) == (t.data_ptr(), 64, MemoryKind.HOST)
    assert region.array is not None
    region.array[:] = 0
    assert float(t.sum()) == 0.0
