"""Learning a buffer's address, length and memory kind from the object itself."""

from __future__ import annotations

import ctypes
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
    readonly: bool = False  # the producer marked it read-only: peers may not write it


def _from_numpy(arr: np.ndarray) -> MemoryRegion:
    if not arr.flags.c_contiguous:
        raise InvalidRequestError("numpy array must be C-contiguous to be registered")
    flat = arr.reshape(-1).view(np.uint8) if arr.size else np.empty(0, np.uint8)
    addr = arr.__array_interface__["data"][0]
    return MemoryRegion(addr, arr.nbytes, MemoryKind.HOST, -1, arr, flat)


def _from_cuda_interface(obj: Any) -> MemoryRegion:
    """`__cuda_array_interface__` (versions 0-3: CuPy, Numba, PyTorch, cuda.core...)."""
    ci = obj.__cuda_array_interface__
    if not isinstance(ci, dict) or "data" not in ci or "shape" not in ci or "typestr" not in ci:
        raise InvalidRequestError(f"{type(obj).__name__}.__cuda_array_interface__ lacks data/shape/typestr")
    if ci.get("mask") is not None:
        raise InvalidRequestError("masked CUDA arrays cannot be registered")
    addr = int(ci["data"][0] or 0)
    shape = tuple(int(d) for d in ci["shape"])
    itemsize = np.dtype(ci["typestr"]).itemsize
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    strides = ci.get("strides")
    if strides not in (None, ()) and n > 0:
        expected = itemsize
        for dim, stride in zip(reversed(shape), reversed(tuple(strides)), strict=True):
            if dim != 1 and int(stride) != expected:
                raise InvalidRequestError("CUDA array must be contiguous (row-major) to be registered")
            expected *= dim
    return MemoryRegion(addr, n * itemsize, MemoryKind.CUDA, _cuda_device_of(obj, addr), obj, None, bool(ci["data"][1]))


def _cuda_device_of(obj: Any, addr: int) -> int:
    """The CUDA device of an array: its own `device` attribute (torch: .index, CuPy: .id), else -1
    (the transports ask the runtime for the pointer's device when they export it)."""
    dev = getattr(obj, "device", None)
    for attr in ("index", "id"):
        v = getattr(dev, attr, None)
        if isinstance(v, int):
            return v
    return dev if isinstance(dev, int) and not isinstance(dev, bool) else -1


def _from_tent_memory(obj: Any) -> MemoryRegion:
    """`__tent_memory__`: a mapping {"addr", "length", "kind", "device"} for device memory that no
    standard interface describes (the simulated device of the tests, a plugin's own runtime)."""
    d = obj.__tent_memory__
    try:
        kind = MemoryKind(d["kind"])
        addr, length, device = int(d["addr"]), int(d["length"]), int(d.get("device", -1))
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{type(obj).__name__}.__tent_memory__ is malformed: {exc}") from exc
    if kind in (MemoryKind.HOST, MemoryKind.FILE) or addr <= 0 or length < 0:
        raise InvalidRequestError(f"{type(obj).__name__}.__tent_memory__ must describe device memory, got {d!r}")
    return MemoryRegion(addr, length, kind, device, obj, None)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


# private function objects, so the shared ctypes.pythonapi attributes are left untouched
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)

_DL_HOST_DEVICES = {1, 3}  # kDLCPU, kDLCUDAHost (pinned host memory)
_DL_CUDA_DEVICES = {2, 13}  # kDLCUDA, kDLCUDAManaged
_DL_DEVICE_NAMES = {
    4: "kDLOpenCL",
    7: "kDLVulkan",
    8: "kDLMetal",
    9: "kDLVPI",
    10: "kDLROCM",
    11: "kDLROCMHost",
    12: "kDLExtDev",
    14: "kDLOneAPI",
    15: "kDLWebGPU",
    16: "kDLHexagon",
    17: "kDLMAIA",
}


def _from_dlpack(obj: Any) -> MemoryRegion:
    device_type, device_id = (int(v) for v in obj.__dlpack_device__())
    if device_type not in _DL_HOST_DEVICES and device_type not in _DL_CUDA_DEVICES:
        name = _DL_DEVICE_NAMES.get(device_type, "unknown")
        raise InvalidRequestError(f"unsupported DLPack device type {device_type} ({name}) for {type(obj).__name__}")
    capsule = obj.__dlpack__()
    # read the DLManagedTensor in place without consuming the capsule: its destructor frees it
    if _capsule_is_valid(capsule, b"dltensor"):
        tensor = _DLTensor.from_address(_capsule_get_pointer(capsule, b"dltensor"))
    elif _capsule_is_valid(capsule, b"dltensor_versioned"):
        tensor = _DLManagedTensorVersioned.from_address(_capsule_get_pointer(capsule, b"dltensor_versioned")).dl_tensor
    else:
        raise InvalidRequestError(f"{type(obj).__name__}.__dlpack__() did not return a usable DLPack capsule")
    shape = [tensor.shape[i] for i in range(tensor.ndim)]
    if tensor.strides and 0 not in shape:
        expected = 1
        for i in reversed(range(tensor.ndim)):
            if shape[i] != 1 and tensor.strides[i] != expected:
                raise InvalidRequestError("DLPack tensor must be contiguous (row-major) to be registered")
            expected *= shape[i]
    length = int(np.prod(shape, dtype=np.int64)) * ((tensor.dtype.bits * tensor.dtype.lanes + 7) // 8)
    addr = (tensor.data or 0) + tensor.byte_offset
    keepalive = (obj, capsule)
    if device_type in _DL_CUDA_DEVICES:
        return MemoryRegion(addr, length, MemoryKind.CUDA, device_id, keepalive, None)
    arr = np.ctypeslib.as_array((ctypes.c_uint8 * length).from_address(addr)) if length else np.empty(0, np.uint8)
    return MemoryRegion(addr, length, MemoryKind.HOST, -1, keepalive, arr)


def describe(obj: Any) -> MemoryRegion:
    """numpy arrays, torch tensors (CPU or CUDA), CUDA-array-interface objects (CuPy, Numba...),
    DLPack objects (CPU, pinned host or CUDA), ``__tent_memory__`` objects (other device memory),
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
        if obj.device.type == "npu":  # torch_npu (Ascend)
            return MemoryRegion(obj.data_ptr(), length, MemoryKind.NPU, obj.device.index or 0, obj, None)
        if obj.device.type != "cpu":
            raise InvalidRequestError(f"unsupported torch device {obj.device}")
        arr = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * length).from_address(obj.data_ptr())) if length else np.empty(0, np.uint8)
        return MemoryRegion(obj.data_ptr(), length, MemoryKind.HOST, -1, obj, arr)
    if hasattr(obj, "__tent_memory__"):
        return _from_tent_memory(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cuda_interface(obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj)
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
            f"cannot register {type(obj).__name__}: expected numpy array, torch tensor, DLPack object, (addr, length) or a buffer"
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
        # sealable: a transport that shares it seals the size (a peer holding the fd must not shrink
        # it under us: SIGBUS) and, for read-only registrations, future writes (SECURITY.md)
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.fchmod(self.fd, 0o600)  # memfds start 0777: nobody else may reopen it via /proc/<pid>/fd
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
