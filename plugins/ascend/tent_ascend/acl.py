"""The CANN runtime calls the Ascend transport makes, through ctypes, loaded on first use.

``libascendcl.so`` is found through the loader path (``LD_LIBRARY_PATH`` as set by CANN's
``set_env.sh``), or named by the ``TENT_ASCENDCL`` environment variable / the transport's ``acl_lib``
config key. Nothing is loaded at import; `status()` says why there is no device.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import numpy as np

from tent_core import devices
from tent_core.errors import InvalidRequestError
from tent_core.types import MemoryKind

ACL_SUCCESS = 0
ACL_ERROR_REPEAT_INITIALIZE = 100002
MEMCPY_HOST_TO_HOST, MEMCPY_HOST_TO_DEVICE, MEMCPY_DEVICE_TO_HOST, MEMCPY_DEVICE_TO_DEVICE = 0, 1, 2, 3
MEM_MALLOC_HUGE_FIRST = 0
HOST_REGISTER_MAPPED = 0


class AclError(RuntimeError):
    pass


class Acl:
    """A loaded libascendcl with prototypes for the calls used here."""

    def __init__(self, path: str | None = None) -> None:
        name = path or os.environ.get("TENT_ASCENDCL") or "libascendcl.so"
        try:
            self.lib = ctypes.CDLL(name)
        except OSError as exc:
            raise AclError(f"{name} not found ({exc}); source CANN's set_env.sh or set TENT_ASCENDCL") from exc
        self.path = name
        L, i, u32, vp, sz = self.lib, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t
        for fname, args in {
            "aclInit": [ctypes.c_char_p], "aclrtGetDeviceCount": [ctypes.POINTER(u32)], "aclrtSetDevice": [ctypes.c_int32],
            "aclrtMalloc": [ctypes.POINTER(vp), sz, i], "aclrtFree": [vp], "aclrtMallocHost": [ctypes.POINTER(vp), sz],
            "aclrtFreeHost": [vp], "aclrtMemcpy": [vp, sz, vp, sz, i],
        }.items():
            fn = getattr(L, fname, None)
            if fn is None:
                raise AclError(f"{name} lacks {fname}")
            fn.restype = i
            fn.argtypes = args
        err = getattr(L, "aclGetRecentErrMsg", None)
        if err is not None:
            err.restype = ctypes.c_char_p
            err.argtypes = []
        self._err = err
        reg = getattr(L, "aclrtHostRegister", None)  # CANN >= 8: page-lock (and map) host memory
        if reg is not None:
            reg.restype = i
            reg.argtypes = [vp, ctypes.c_uint64, i, ctypes.POINTER(vp)]
        self._host_register = reg
        rc = L.aclInit(None)
        if rc not in (ACL_SUCCESS, ACL_ERROR_REPEAT_INITIALIZE):
            raise AclError(f"aclInit failed: {self._msg(rc)}")

    def _msg(self, rc: int) -> str:
        detail = self._err() if self._err is not None else None
        return f"error {rc}" + (f": {detail.decode(errors='replace')}" if detail else "")

    def check(self, rc: int, what: str) -> None:
        if rc != ACL_SUCCESS:
            raise AclError(f"{what}: {self._msg(rc)}")

    def device_count(self) -> int:
        n = ctypes.c_uint32(0)
        self.check(self.lib.aclrtGetDeviceCount(ctypes.byref(n)), "aclrtGetDeviceCount")
        return int(n.value)

    def set_device(self, dev: int) -> None:
        self.check(self.lib.aclrtSetDevice(int(dev)), f"aclrtSetDevice({dev})")

    def malloc(self, n: int, device: int = 0) -> int:
        self.set_device(device)
        p = ctypes.c_void_p()
        self.check(self.lib.aclrtMalloc(ctypes.byref(p), n, MEM_MALLOC_HUGE_FIRST), f"aclrtMalloc({n})")
        return int(p.value or 0)

    def free(self, p: int) -> None:
        self.check(self.lib.aclrtFree(ctypes.c_void_p(p)), "aclrtFree")

    def memcpy(self, dst: int, src: int, n: int, kind: int) -> None:
        self.check(self.lib.aclrtMemcpy(ctypes.c_void_p(dst), n, ctypes.c_void_p(src), n, kind), "aclrtMemcpy")

    def host_register(self, p: int, n: int) -> bool:
        if self._host_register is None:
            return False
        dev = ctypes.c_void_p()
        return self._host_register(ctypes.c_void_p(p), n, HOST_REGISTER_MAPPED, ctypes.byref(dev)) == ACL_SUCCESS


_acl: Acl | None = None
_lock = threading.Lock()


def acl(path: str | None = None) -> Acl:
    global _acl
    with _lock:
        if _acl is None:
            _acl = Acl(path)
        return _acl


def status(path: str | None = None) -> tuple[int, str]:
    """(number of NPUs, "") or (0, why there is none). Never raises."""
    try:
        n = acl(path).device_count()
    except (AclError, OSError, AttributeError) as exc:
        return 0, str(exc)
    return (n, "") if n > 0 else (0, "aclrtGetDeviceCount reports 0 devices")


class NpuBuffer:
    """NPU memory (aclrtMalloc) that registers with ``engine.register(buf)`` (``__tent_memory__``)."""

    def __init__(self, nbytes: int, device: int = 0) -> None:
        self.nbytes, self.device = int(nbytes), int(device)
        self.ptr = acl().malloc(self.nbytes, self.device)

    @property
    def __tent_memory__(self) -> dict[str, Any]:
        return {"addr": self.ptr, "length": self.nbytes, "kind": MemoryKind.NPU.value, "device": self.device}

    def upload(self, data: np.ndarray, offset: int = 0) -> None:
        src = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if offset < 0 or offset + src.size > self.nbytes:
            raise InvalidRequestError("upload exceeds the NPU buffer")
        acl().set_device(self.device)
        acl().memcpy(self.ptr + offset, src.ctypes.data, src.size, MEMCPY_HOST_TO_DEVICE)

    def download(self, offset: int = 0, length: int | None = None) -> np.ndarray:
        n = self.nbytes - offset if length is None else length
        out = np.empty(n, np.uint8)
        acl().set_device(self.device)
        acl().memcpy(out.ctypes.data, self.ptr + offset, n, MEMCPY_DEVICE_TO_HOST)
        return out

    def free(self) -> None:
        if self.ptr:
            p, self.ptr = self.ptr, 0
            acl().free(p)


class AclRuntime(devices.DeviceRuntime):
    """MemoryKind.NPU's device runtime: directional copies, pinning; no stream ordering yet."""

    name = "ascend"
    kinds = frozenset({MemoryKind.NPU})

    def owns(self, obj: Any) -> bool:
        return False

    def mark_stream(self, stream: Any) -> devices.EventMark:
        raise InvalidRequestError("stream ordering is not implemented for Ascend NPUs (CUDA and the simulated device only)")

    def mark_event(self, event: Any) -> devices.EventMark:
        raise InvalidRequestError("stream ordering is not implemented for Ascend NPUs (CUDA and the simulated device only)")

    def arm_signal(self, event: Any, deadline: float) -> devices.Gate:
        raise InvalidRequestError("stream ordering is not implemented for Ascend NPUs (CUDA and the simulated device only)")

    def copy_to_host(self, dst: int, src: int, length: int) -> None:
        acl().memcpy(dst, src, length, MEMCPY_DEVICE_TO_HOST)

    def copy_to_device(self, dst: int, src: int, length: int) -> None:
        acl().memcpy(dst, src, length, MEMCPY_HOST_TO_DEVICE)

    def pin(self, addr: int, length: int) -> bool:
        return acl().host_register(addr, length)

    def checksum(self, addr: int, length: int, first_word: int = 0) -> int:
        """wsum64 read back in chunks (no NPU kernel for it yet: documented)."""
        chunk = 8 << 20
        buf = np.empty(min(chunk, max(length, 1)), np.uint8)
        total = 0
        for off in range(0, length, chunk):
            n = min(chunk, length - off)
            self.copy_to_host(buf.ctypes.data, addr + off, n)
            total += devices.wsum64_host(buf[:n], first_word + off // 8)
        return total & ((1 << 64) - 1)


__all__ = ["Acl", "AclError", "AclRuntime", "NpuBuffer", "acl", "status"]
