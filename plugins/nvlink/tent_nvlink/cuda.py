"""The few CUDA runtime / driver calls the nvlink transport needs, through ctypes.

Nothing is loaded at import: :func:`runtime` dlopen()s ``libcudart`` on first use (the
``TENT_CUDART`` environment variable names a specific library), and :func:`driver`
``libcuda`` for ``cuMemGetAddressRange``. Errors raise :class:`CudaError` with the
runtime's own message.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

IPC_HANDLE_SIZE = 64
CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
MEMCPY_DEFAULT = 4

_CUDART_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")
_CUDA_NAMES = ("libcuda.so.1", "libcuda.so")


class CudaError(RuntimeError):
    pass


class IpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


class _PointerAttributes(ctypes.Structure):  # cudaPointerAttributes (CUDA >= 10)
    _fields_ = [
        ("type", ctypes.c_int),
        ("device", ctypes.c_int),
        ("devicePointer", ctypes.c_void_p),
        ("hostPointer", ctypes.c_void_p),
    ]


class Runtime:
    """A loaded libcudart with prototypes for the calls used here."""

    def __init__(self, path: str | None = None) -> None:
        names = (path,) if path else _CUDART_NAMES
        last: OSError | None = None
        for n in names:
            try:
                self.lib = ctypes.CDLL(n)
                self.path = n
                break
            except OSError as exc:
                last = exc
        else:
            raise CudaError(f"cannot load libcudart ({last})")
        L = self.lib
        i, vp, sz = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
        L.cudaGetErrorString.restype = ctypes.c_char_p
        L.cudaGetErrorString.argtypes = [i]
        for name, args in {
            "cudaGetDeviceCount": [ctypes.POINTER(i)],
            "cudaSetDevice": [i],
            "cudaGetDevice": [ctypes.POINTER(i)],
            "cudaIpcGetMemHandle": [ctypes.POINTER(IpcMemHandle), vp],
            "cudaIpcOpenMemHandle": [ctypes.POINTER(vp), IpcMemHandle, ctypes.c_uint],
            "cudaIpcCloseMemHandle": [vp],
            "cudaPointerGetAttributes": [ctypes.POINTER(_PointerAttributes), vp],
            "cudaMalloc": [ctypes.POINTER(vp), sz],
            "cudaFree": [vp],
            "cudaMallocHost": [ctypes.POINTER(vp), sz],
            "cudaFreeHost": [vp],
            "cudaMemcpy": [vp, vp, sz, i],
            "cudaMemset": [vp, i, sz],
            "cudaDeviceSynchronize": [],
            "cudaRuntimeGetVersion": [ctypes.POINTER(i)],
        }.items():
            fn = getattr(L, name)
            fn.restype = i
            fn.argtypes = args

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self.lib.cudaGetErrorString(rc)
            raise CudaError(f"{what}: {msg.decode() if msg else rc} (error {rc})")

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        self.check(self.lib.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
        return n.value

    def set_device(self, dev: int) -> None:
        self.check(self.lib.cudaSetDevice(int(dev)), f"cudaSetDevice({dev})")

    def pointer_device(self, ptr: int) -> int:
        attr = _PointerAttributes()
        self.check(
            self.lib.cudaPointerGetAttributes(ctypes.byref(attr), ctypes.c_void_p(ptr)), "cudaPointerGetAttributes"
        )
        return attr.device

    def ipc_get(self, base_ptr: int) -> bytes:
        h = IpcMemHandle()
        self.check(self.lib.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(base_ptr)), "cudaIpcGetMemHandle")
        return bytes(h.reserved)

    def ipc_open(self, handle: bytes, device: int) -> int:
        if len(handle) != IPC_HANDLE_SIZE:
            raise CudaError(f"IPC handle must be {IPC_HANDLE_SIZE} bytes, got {len(handle)}")
        self.set_device(device)
        h = IpcMemHandle()
        ctypes.memmove(ctypes.addressof(h), handle, IPC_HANDLE_SIZE)
        ptr = ctypes.c_void_p()
        self.check(
            self.lib.cudaIpcOpenMemHandle(ctypes.byref(ptr), h, CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
            "cudaIpcOpenMemHandle",
        )
        return int(ptr.value or 0)

    def ipc_close(self, ptr: int) -> None:
        self.check(self.lib.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr)), "cudaIpcCloseMemHandle")

    def malloc(self, n: int) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(p), n), f"cudaMalloc({n})")
        return int(p.value or 0)

    def free(self, p: int) -> None:
        self.check(self.lib.cudaFree(ctypes.c_void_p(p)), "cudaFree")

    def malloc_host(self, n: int) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cudaMallocHost(ctypes.byref(p), n), f"cudaMallocHost({n})")
        return int(p.value or 0)

    def free_host(self, p: int) -> None:
        self.check(self.lib.cudaFreeHost(ctypes.c_void_p(p)), "cudaFreeHost")

    def memcpy(self, dst: int, src: int, n: int) -> None:
        self.check(self.lib.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src), n, MEMCPY_DEFAULT), "cudaMemcpy")

    def memset(self, p: int, value: int, n: int) -> None:
        self.check(self.lib.cudaMemset(ctypes.c_void_p(p), value, n), "cudaMemset")

    def synchronize(self) -> None:
        self.check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


class Driver:
    """libcuda, for cuMemGetAddressRange (the allocation holding a pointer)."""

    def __init__(self) -> None:
        last: OSError | None = None
        for n in _CUDA_NAMES:
            try:
                self.lib = ctypes.CDLL(n)
                break
            except OSError as exc:
                last = exc
        else:
            raise CudaError(f"cannot load libcuda ({last})")
        fn = getattr(self.lib, "cuMemGetAddressRange_v2", None) or self.lib.cuMemGetAddressRange
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        self._range = fn

    def address_range(self, ptr: int) -> tuple[int, int]:
        """(allocation base, allocation size) of device pointer `ptr`."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        rc = self._range(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        if rc != 0:
            raise CudaError(f"cuMemGetAddressRange({ptr:#x}) failed (CUresult {rc})")
        return int(base.value), int(size.value)


_rt: Runtime | None = None
_drv: Driver | None = None
_lock = threading.Lock()


def runtime() -> Runtime:
    global _rt
    with _lock:
        if _rt is None:
            _rt = Runtime(os.environ.get("TENT_CUDART") or None)
        return _rt


def driver() -> Driver:
    global _drv
    with _lock:
        if _drv is None:
            _drv = Driver()
        return _drv


def device_status() -> tuple[int, str]:
    """(number of CUDA devices, "" ) or (0, why there is none). Never raises."""
    try:
        n = runtime().device_count()
    except (CudaError, OSError, AttributeError) as exc:
        return 0, str(exc)
    return (n, "") if n > 0 else (0, "cudaGetDeviceCount reports 0 devices")


# ---------------------------------------------------------------- descriptors
def pack_ipc_desc(handle: bytes, device: int, offset: int, alloc_size: int, pid: int) -> dict[str, Any]:
    """The per-buffer descriptor advertised to peers (msgpack-able)."""
    if len(handle) != IPC_HANDLE_SIZE:
        raise ValueError(f"IPC handle must be {IPC_HANDLE_SIZE} bytes, got {len(handle)}")
    if offset < 0 or device < 0:
        raise ValueError("offset and device must be >= 0")
    return {
        "ipc": handle.hex(),
        "device": int(device),
        "offset": int(offset),
        "alloc_size": int(alloc_size),
        "pid": int(pid),
    }


def unpack_ipc_desc(d: Any) -> tuple[bytes, int, int, int, int]:
    """-> (handle, device, offset, alloc_size, pid); ValueError when malformed."""
    if not isinstance(d, dict):
        raise ValueError(f"nvlink descriptor must be a dict, got {type(d).__name__}")
    try:
        handle = bytes.fromhex(str(d["ipc"]))
        device, offset = int(d["device"]), int(d["offset"])
        alloc_size, pid = int(d.get("alloc_size", 0)), int(d.get("pid", 0))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed nvlink descriptor {d!r}: {exc}") from exc
    if len(handle) != IPC_HANDLE_SIZE or device < 0 or offset < 0:
        raise ValueError(f"malformed nvlink descriptor {d!r}")
    return handle, device, offset, alloc_size, pid
