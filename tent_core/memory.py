"""Learning a buffer's address, length and memory kind from the object itself."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidRequestError
from .types import MemoryKind


@dataclass
class MemoryRegion:
    addr: int
    length: int
    kind: MemoryKind
    device: int
    keepalive: Any  # the object whose lifetime backs the memory
    array: np.ndarray | None  # uint8 host view, when host memory


def _from_numpy(arr: np.ndarray) -> MemoryRegion:
    if not arr.flags.c_contiguous:
        raise InvalidRequestError("numpy array must be C-contiguous to be registered")
    flat = arr.reshape(-1).view(np.uint8) if arr.size else np.empty(0, np.uint8)
    addr = arr.__array_interface__["data"][0]
    return MemoryRegion(addr, arr.nbytes, MemoryKind.HOST, -1, arr, flat)


def _from_cuda_interface(obj: Any) -> MemoryRegion:
    ci = obj.__cuda_array_interface__
    addr = int(ci["data"][0])
    shape = ci["shape"]
    itemsize = np.dtype(ci["typestr"]).itemsize
    n = int(np.prod(shape)) if shape else 1
    if ci.get("strides") not in (None, ()):
        expected = []
        acc = itemsize
        for dim in reversed(shape):
            expected.append(acc)
            acc *= dim
        if tuple(reversed(expected)) != tuple(ci["strides"]):
            raise InvalidRequestError("CUDA array must be contiguous to be registered")
    device = -1
    dev = getattr(obj, "device", None)
    if dev is not None:
        device = int(getattr(dev, "index", None) or getattr(dev, "id", 0) or 0)
    return MemoryRegion(addr, n * itemsize, MemoryKind.CUDA, device, obj, None)


def describe(obj: Any) -> MemoryRegion:
    """numpy arrays, torch tensors (CPU or CUDA), CUDA-array-interface objects,
    writable buffer-protocol objects, or an ``(addr, length)`` tuple."""
    if isinstance(obj, np.ndarray):
        return _from_numpy(obj)
    mod = type(obj).__module__
    if mod.startswith("torch") and hasattr(obj, "data_ptr"):
        if not obj.is_contiguous():
            raise InvalidRequestError("torch tensor must be contiguous to be registered")
        length = obj.numel() * obj.element_size()
        if obj.device.type == "cuda":
            return MemoryRegion(obj.data_ptr(), length, MemoryKind.CUDA, obj.device.index or 0, obj, None)
        if obj.device.type != "cpu":
            raise InvalidRequestError(f"unsupported torch device {obj.device}")
        arr = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * length).from_address(obj.data_ptr())) if length else np.empty(0, np.uint8)
        return MemoryRegion(obj.data_ptr(), length, MemoryKind.HOST, -1, obj, arr)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cuda_interface(obj)
    if isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(v, int) for v in obj):
        addr, length = obj
        if addr <= 0 or length < 0:
            raise InvalidRequestError(f"raw region needs a positive address and length >= 0, got {obj!r}")
        arr = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * length).from_address(addr)) if length else None
        return MemoryRegion(addr, length, MemoryKind.HOST, -1, None, arr)
    try:
        arr = np.frombuffer(obj, dtype=np.uint8)
    except TypeError as exc:
        raise InvalidRequestError(
            f"cannot register {type(obj).__name__}: expected numpy array, torch tensor, (addr, length) or a buffer"
        ) from exc
    if arr.size and not arr.flags.writeable:
        # read-only objects (bytes) can still be exported for remote READs
        pass
    return MemoryRegion(arr.__array_interface__["data"][0] if arr.size else 0, arr.nbytes, MemoryKind.HOST, -1, obj, arr)


class MemfdBuffer:
    """Engine-allocated host memory: memfd-backed (shareable with same-host peers), pre-faulted."""

    def __init__(self, size: int, name: str = "tent") -> None:
        if size <= 0:
            raise InvalidRequestError(f"allocation size must be > 0, got {size}")
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size
        self.array = np.frombuffer(self.map, dtype=np.uint8)
        self.array[::4096] = 0  # pre-fault: first touch is ~10x slower than a copy
        self.array[-1] = 0
        self.addr = self.array.__array_interface__["data"][0]

    def close(self) -> None:
        if self.fd >= 0:
            self.array = None  # type: ignore[assignment]
            try:
                self.map.close()
            except BufferError:
                pass  # still exported somewhere; the mapping dies with the process
            os.close(self.fd)
            self.fd = -1
