"""CUDA for the core and the GPU plugins: cuda-python's bindings where installed, ctypes otherwise.

One small API (`CudaApi`) over two backends, chosen on first use:

* ``cuda.bindings`` (cuda-python >= 12: `cuda.bindings.runtime` and `cuda.bindings.driver`), the
  binding NVIDIA maintains;
* a ctypes loader of ``libcudart`` / ``libcuda`` (``TENT_CUDART`` names a specific libcudart) where
  cuda-python is not installed.

``TENT_CUDA_BACKEND=ctypes|bindings`` forces one. Nothing is loaded at import; without a driver or a
device every entry point raises `CudaError` with the runtime's own message, and `device_status()`
says why (for "unavailable: <reason>").

`CudaRuntime` is MemoryKind.CUDA's `tent_core.devices.DeviceRuntime`: stream/event marks for stream
ordering (torch, CuPy and cuda-python stream/event objects or raw handles), signal gates (the
user's event recorded on a stream held by ``cuStreamWaitValue32`` on a host-mapped flag, or a host
function where stream memory operations are unsupported), page-locking of staging buffers, and
wsum64 checksums computed on the GPU (CuPy or PyTorch when importable; otherwise the data is read
back in pinned chunks, the documented fallback).
"""

from __future__ import annotations

import abc
import ctypes
import itertools
import logging
import os
import threading
import time
from typing import Any

import numpy as np

from . import devices
from .errors import InvalidRequestError
from .types import MemoryKind

log = logging.getLogger(__name__)

IPC_HANDLE_SIZE = 64
MEMCPY_DEFAULT = 4
STREAM_NON_BLOCKING = 1
EVENT_DISABLE_TIMING = 2
HOST_REGISTER_DEFAULT = 0
HOST_ALLOC_MAPPED = 2
IPC_LAZY_ENABLE_PEER_ACCESS = 1
STREAM_WAIT_VALUE_GEQ = 0
ERR_NOT_READY = 600

_CUDART_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")
_CUDA_NAMES = ("libcuda.so.1", "libcuda.so")


class CudaError(RuntimeError):
    pass


class CudaApi(abc.ABC):
    """The CUDA calls TENT makes. Handles and pointers are ints."""

    backend: str = ""
    path: str = ""  # the libcudart this API runs on (the nvlink executor loads the same one)

    @abc.abstractmethod
    def device_count(self) -> int: ...
    @abc.abstractmethod
    def set_device(self, dev: int) -> None: ...
    @abc.abstractmethod
    def pointer_device(self, ptr: int) -> int: ...
    @abc.abstractmethod
    def malloc(self, n: int) -> int: ...
    @abc.abstractmethod
    def free(self, p: int) -> None: ...
    @abc.abstractmethod
    def malloc_host(self, n: int, mapped: bool = False) -> int: ...
    @abc.abstractmethod
    def free_host(self, p: int) -> None: ...
    @abc.abstractmethod
    def host_device_pointer(self, p: int) -> int: ...
    @abc.abstractmethod
    def host_register(self, p: int, n: int) -> None: ...
    @abc.abstractmethod
    def host_unregister(self, p: int) -> None: ...
    @abc.abstractmethod
    def memcpy(self, dst: int, src: int, n: int) -> None: ...
    @abc.abstractmethod
    def memcpy_async(self, dst: int, src: int, n: int, stream: int) -> None: ...
    @abc.abstractmethod
    def memset(self, p: int, value: int, n: int) -> None: ...
    @abc.abstractmethod
    def synchronize(self) -> None: ...
    @abc.abstractmethod
    def ipc_get(self, base_ptr: int) -> bytes: ...
    @abc.abstractmethod
    def ipc_open(self, handle: bytes, device: int) -> int: ...
    @abc.abstractmethod
    def ipc_close(self, ptr: int) -> None: ...
    @abc.abstractmethod
    def stream_create(self) -> int: ...
    @abc.abstractmethod
    def stream_destroy(self, s: int) -> None: ...
    @abc.abstractmethod
    def stream_synchronize(self, s: int) -> None: ...
    @abc.abstractmethod
    def stream_wait_event(self, s: int, ev: int) -> None: ...
    @abc.abstractmethod
    def event_create(self) -> int: ...
    @abc.abstractmethod
    def event_destroy(self, ev: int) -> None: ...
    @abc.abstractmethod
    def event_record(self, ev: int, s: int) -> None: ...
    @abc.abstractmethod
    def event_query(self, ev: int) -> bool: ...
    @abc.abstractmethod
    def address_range(self, ptr: int) -> tuple[int, int]:
        """(allocation base, allocation size) of a device pointer (cuMemGetAddressRange)."""
    @abc.abstractmethod
    def stream_wait_value32(self, s: int, dev_addr: int, value: int) -> None:
        """Later work on `s` waits until the 32-bit word at `dev_addr` is >= value."""
    @abc.abstractmethod
    def launch_host_func(self, s: int, fn: Any) -> None:
        """Run Python `fn()` in stream order (fallback gates)."""


# ------------------------------------------------------------------------------- ctypes backend


class _Ptr(ctypes.Structure):  # cudaPointerAttributes (CUDA >= 10)
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int), ("devicePointer", ctypes.c_void_p),
                ("hostPointer", ctypes.c_void_p)]


class _Ipc(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class CtypesApi(CudaApi):
    backend = "ctypes"

    def __init__(self, path: str | None = None) -> None:
        last: OSError | None = None
        for name in (path,) if path else _CUDART_NAMES:
            try:
                self.lib = ctypes.CDLL(name)
                self.path = name
                break
            except OSError as exc:
                last = exc
        else:
            raise CudaError(f"cannot load libcudart ({last})")
        L, i, vp, sz = self.lib, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
        L.cudaGetErrorString.restype = ctypes.c_char_p
        L.cudaGetErrorString.argtypes = [i]
        for name, args in {
            "cudaGetDeviceCount": [ctypes.POINTER(i)], "cudaSetDevice": [i],
            "cudaIpcGetMemHandle": [ctypes.POINTER(_Ipc), vp], "cudaIpcOpenMemHandle": [ctypes.POINTER(vp), _Ipc, ctypes.c_uint],
            "cudaIpcCloseMemHandle": [vp], "cudaPointerGetAttributes": [ctypes.POINTER(_Ptr), vp],
            "cudaMalloc": [ctypes.POINTER(vp), sz], "cudaFree": [vp], "cudaHostAlloc": [ctypes.POINTER(vp), sz, ctypes.c_uint],
            "cudaFreeHost": [vp], "cudaHostGetDevicePointer": [ctypes.POINTER(vp), vp, ctypes.c_uint],
            "cudaHostRegister": [vp, sz, ctypes.c_uint], "cudaHostUnregister": [vp],
            "cudaMemcpy": [vp, vp, sz, i], "cudaMemcpyAsync": [vp, vp, sz, i, vp], "cudaMemset": [vp, i, sz],
            "cudaDeviceSynchronize": [], "cudaStreamCreateWithFlags": [ctypes.POINTER(vp), ctypes.c_uint],
            "cudaStreamDestroy": [vp], "cudaStreamSynchronize": [vp], "cudaStreamWaitEvent": [vp, vp, ctypes.c_uint],
            "cudaEventCreateWithFlags": [ctypes.POINTER(vp), ctypes.c_uint], "cudaEventDestroy": [vp],
            "cudaEventRecord": [vp, vp], "cudaEventQuery": [vp], "cudaLaunchHostFunc": [vp, _HOST_FN, vp],
        }.items():
            fn = getattr(L, name)
            fn.restype = i
            fn.argtypes = args
        self._drv: Any = None
        self._host_fns: dict[int, Any] = {}
        self._hf_lock = threading.Lock()

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self.lib.cudaGetErrorString(rc)
            raise CudaError(f"{what}: {msg.decode() if msg else rc} (error {rc})")

    def _out(self, fn: Any, *args: Any, what: str) -> int:
        p = ctypes.c_void_p()
        self._check(fn(ctypes.byref(p), *args), what)
        return int(p.value or 0)

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        self._check(self.lib.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
        return n.value

    def set_device(self, dev: int) -> None:
        self._check(self.lib.cudaSetDevice(int(dev)), f"cudaSetDevice({dev})")

    def pointer_device(self, ptr: int) -> int:
        a = _Ptr()
        self._check(self.lib.cudaPointerGetAttributes(ctypes.byref(a), ctypes.c_void_p(ptr)), "cudaPointerGetAttributes")
        return a.device

    def malloc(self, n: int) -> int:
        return self._out(self.lib.cudaMalloc, n, what=f"cudaMalloc({n})")

    def free(self, p: int) -> None:
        self._check(self.lib.cudaFree(ctypes.c_void_p(p)), "cudaFree")

    def malloc_host(self, n: int, mapped: bool = False) -> int:
        return self._out(self.lib.cudaHostAlloc, n, HOST_ALLOC_MAPPED if mapped else 0, what=f"cudaHostAlloc({n})")

    def free_host(self, p: int) -> None:
        self._check(self.lib.cudaFreeHost(ctypes.c_void_p(p)), "cudaFreeHost")

    def host_device_pointer(self, p: int) -> int:
        return self._out(self.lib.cudaHostGetDevicePointer, ctypes.c_void_p(p), 0, what="cudaHostGetDevicePointer")

    def host_register(self, p: int, n: int) -> None:
        self._check(self.lib.cudaHostRegister(ctypes.c_void_p(p), n, HOST_REGISTER_DEFAULT), "cudaHostRegister")

    def host_unregister(self, p: int) -> None:
        self._check(self.lib.cudaHostUnregister(ctypes.c_void_p(p)), "cudaHostUnregister")

    def memcpy(self, dst: int, src: int, n: int) -> None:
        self._check(self.lib.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src), n, MEMCPY_DEFAULT), "cudaMemcpy")

    def memcpy_async(self, dst: int, src: int, n: int, stream: int) -> None:
        self._check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), n, MEMCPY_DEFAULT,
                                             ctypes.c_void_p(stream)), "cudaMemcpyAsync")

    def memset(self, p: int, value: int, n: int) -> None:
        self._check(self.lib.cudaMemset(ctypes.c_void_p(p), value, n), "cudaMemset")

    def synchronize(self) -> None:
        self._check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def ipc_get(self, base_ptr: int) -> bytes:
        h = _Ipc()
        self._check(self.lib.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(base_ptr)), "cudaIpcGetMemHandle")
        return bytes(h.reserved)

    def ipc_open(self, handle: bytes, device: int) -> int:
        if len(handle) != IPC_HANDLE_SIZE:
            raise CudaError(f"IPC handle must be {IPC_HANDLE_SIZE} bytes, got {len(handle)}")
        self.set_device(device)
        h = _Ipc()
        ctypes.memmove(ctypes.addressof(h), handle, IPC_HANDLE_SIZE)
        return self._out(self.lib.cudaIpcOpenMemHandle, h, IPC_LAZY_ENABLE_PEER_ACCESS, what="cudaIpcOpenMemHandle")

    def ipc_close(self, ptr: int) -> None:
        self._check(self.lib.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr)), "cudaIpcCloseMemHandle")

    def stream_create(self) -> int:
        return self._out(self.lib.cudaStreamCreateWithFlags, STREAM_NON_BLOCKING, what="cudaStreamCreateWithFlags")

    def stream_destroy(self, s: int) -> None:
        self._check(self.lib.cudaStreamDestroy(ctypes.c_void_p(s)), "cudaStreamDestroy")

    def stream_synchronize(self, s: int) -> None:
        self._check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(s)), "cudaStreamSynchronize")

    def stream_wait_event(self, s: int, ev: int) -> None:
        self._check(self.lib.cudaStreamWaitEvent(ctypes.c_void_p(s), ctypes.c_void_p(ev), 0), "cudaStreamWaitEvent")

    def event_create(self) -> int:
        return self._out(self.lib.cudaEventCreateWithFlags, EVENT_DISABLE_TIMING, what="cudaEventCreateWithFlags")

    def event_destroy(self, ev: int) -> None:
        self._check(self.lib.cudaEventDestroy(ctypes.c_void_p(ev)), "cudaEventDestroy")

    def event_record(self, ev: int, s: int) -> None:
        self._check(self.lib.cudaEventRecord(ctypes.c_void_p(ev), ctypes.c_void_p(s)), "cudaEventRecord")

    def event_query(self, ev: int) -> bool:
        rc = self.lib.cudaEventQuery(ctypes.c_void_p(ev))
        if rc == ERR_NOT_READY:
            return False
        self._check(rc, "cudaEventQuery")
        return True

    def _driver(self) -> Any:
        if self._drv is None:
            last: OSError | None = None
            for name in _CUDA_NAMES:
                try:
                    drv = ctypes.CDLL(name)
                    break
                except OSError as exc:
                    last = exc
            else:
                raise CudaError(f"cannot load libcuda ({last})")
            rng = getattr(drv, "cuMemGetAddressRange_v2", None) or drv.cuMemGetAddressRange
            rng.restype = ctypes.c_int
            rng.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
            wait = getattr(drv, "cuStreamWaitValue32_v2", None) or drv.cuStreamWaitValue32
            wait.restype = ctypes.c_int
            wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            self._drv = (drv, rng, wait)
        return self._drv

    def address_range(self, ptr: int) -> tuple[int, int]:
        _, rng, _ = self._driver()
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        rc = rng(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        if rc != 0:
            raise CudaError(f"cuMemGetAddressRange({ptr:#x}) failed (CUresult {rc})")
        return int(base.value), int(size.value)

    def stream_wait_value32(self, s: int, dev_addr: int, value: int) -> None:
        _, _, wait = self._driver()
        rc = wait(ctypes.c_void_p(s), ctypes.c_uint64(dev_addr), ctypes.c_uint32(value), STREAM_WAIT_VALUE_GEQ)
        if rc != 0:
            raise CudaError(f"cuStreamWaitValue32 failed (CUresult {rc})")

    def launch_host_func(self, s: int, fn: Any) -> None:
        with self._hf_lock:
            key = id(fn)

            def call(_: Any, key: int = key) -> None:
                try:
                    fn()
                finally:
                    with self._hf_lock:
                        self._host_fns.pop(key, None)

            cb = _HOST_FN(call)
            self._host_fns[key] = cb  # alive until CUDA has called it
        self._check(self.lib.cudaLaunchHostFunc(ctypes.c_void_p(s), cb, None), "cudaLaunchHostFunc")


# ------------------------------------------------------------------------------- cuda.bindings backend


def result_values(res: tuple[Any, ...]) -> Any:
    """The values of a cuda-python call's (error, value...) result: None, the one value, or a tuple
    of them (cuMemGetAddressRange returns (error, base, size))."""
    return res[1] if len(res) == 2 else tuple(res[1:]) if len(res) > 2 else None



class BindingsApi(CudaApi):
    """cuda-python's `cuda.bindings` (runtime statically linked into the binding; driver via libcuda)."""

    backend = "bindings"

    def __init__(self) -> None:
        from cuda.bindings import driver, runtime

        self.rt, self.drv = runtime, driver
        self.path = ""  # the executor loads a libcudart of its own (nvlink config `cudart`)
        self._host_fns: dict[int, Any] = {}
        self._hf_lock = threading.Lock()
        self._hf_keys = itertools.count()

    def _ok(self, res: Any, what: str) -> Any:
        err = res[0]
        if int(err) != 0:
            try:
                msg = self.rt.cudaGetErrorString(err)[1].decode()
            except Exception:
                msg = str(err)
            raise CudaError(f"{what}: {msg} ({err!r})")
        return result_values(res)

    def _dok(self, res: Any, what: str) -> Any:
        err = res[0]
        if int(err) != 0:
            raise CudaError(f"{what} failed ({err!r})")
        return result_values(res)

    def device_count(self) -> int:
        return int(self._ok(self.rt.cudaGetDeviceCount(), "cudaGetDeviceCount"))

    def set_device(self, dev: int) -> None:
        self._ok(self.rt.cudaSetDevice(int(dev)), f"cudaSetDevice({dev})")

    def pointer_device(self, ptr: int) -> int:
        return int(self._ok(self.rt.cudaPointerGetAttributes(ptr), "cudaPointerGetAttributes").device)

    def malloc(self, n: int) -> int:
        return int(self._ok(self.rt.cudaMalloc(n), f"cudaMalloc({n})"))

    def free(self, p: int) -> None:
        self._ok(self.rt.cudaFree(p), "cudaFree")

    def malloc_host(self, n: int, mapped: bool = False) -> int:
        return int(self._ok(self.rt.cudaHostAlloc(n, HOST_ALLOC_MAPPED if mapped else 0), f"cudaHostAlloc({n})"))

    def free_host(self, p: int) -> None:
        self._ok(self.rt.cudaFreeHost(p), "cudaFreeHost")

    def host_device_pointer(self, p: int) -> int:
        return int(self._ok(self.rt.cudaHostGetDevicePointer(p, 0), "cudaHostGetDevicePointer"))

    def host_register(self, p: int, n: int) -> None:
        self._ok(self.rt.cudaHostRegister(p, n, HOST_REGISTER_DEFAULT), "cudaHostRegister")

    def host_unregister(self, p: int) -> None:
        self._ok(self.rt.cudaHostUnregister(p), "cudaHostUnregister")

    def memcpy(self, dst: int, src: int, n: int) -> None:
        self._ok(self.rt.cudaMemcpy(dst, src, n, self.rt.cudaMemcpyKind.cudaMemcpyDefault), "cudaMemcpy")

    def memcpy_async(self, dst: int, src: int, n: int, stream: int) -> None:
        self._ok(self.rt.cudaMemcpyAsync(dst, src, n, self.rt.cudaMemcpyKind.cudaMemcpyDefault, stream), "cudaMemcpyAsync")

    def memset(self, p: int, value: int, n: int) -> None:
        self._ok(self.rt.cudaMemset(p, value, n), "cudaMemset")

    def synchronize(self) -> None:
        self._ok(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def ipc_get(self, base_ptr: int) -> bytes:
        h = self._ok(self.rt.cudaIpcGetMemHandle(base_ptr), "cudaIpcGetMemHandle")
        return ctypes.string_at(h.getPtr(), IPC_HANDLE_SIZE)

    def ipc_open(self, handle: bytes, device: int) -> int:
        if len(handle) != IPC_HANDLE_SIZE:
            raise CudaError(f"IPC handle must be {IPC_HANDLE_SIZE} bytes, got {len(handle)}")
        self.set_device(device)
        h = self.rt.cudaIpcMemHandle_t()
        ctypes.memmove(h.getPtr(), handle, IPC_HANDLE_SIZE)
        return int(self._ok(self.rt.cudaIpcOpenMemHandle(h, IPC_LAZY_ENABLE_PEER_ACCESS), "cudaIpcOpenMemHandle"))

    def ipc_close(self, ptr: int) -> None:
        self._ok(self.rt.cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle")

    def stream_create(self) -> int:
        return int(self._ok(self.rt.cudaStreamCreateWithFlags(STREAM_NON_BLOCKING), "cudaStreamCreateWithFlags"))

    def stream_destroy(self, s: int) -> None:
        self._ok(self.rt.cudaStreamDestroy(s), "cudaStreamDestroy")

    def stream_synchronize(self, s: int) -> None:
        self._ok(self.rt.cudaStreamSynchronize(s), "cudaStreamSynchronize")

    def stream_wait_event(self, s: int, ev: int) -> None:
        self._ok(self.rt.cudaStreamWaitEvent(s, ev, 0), "cudaStreamWaitEvent")

    def event_create(self) -> int:
        return int(self._ok(self.rt.cudaEventCreateWithFlags(EVENT_DISABLE_TIMING), "cudaEventCreateWithFlags"))

    def event_destroy(self, ev: int) -> None:
        self._ok(self.rt.cudaEventDestroy(ev), "cudaEventDestroy")

    def event_record(self, ev: int, s: int) -> None:
        self._ok(self.rt.cudaEventRecord(ev, s), "cudaEventRecord")

    def event_query(self, ev: int) -> bool:
        err = self.rt.cudaEventQuery(ev)[0]
        if int(err) == ERR_NOT_READY:
            return False
        self._ok((err,), "cudaEventQuery")
        return True

    def address_range(self, ptr: int) -> tuple[int, int]:
        base, size = self._dok(self.drv.cuMemGetAddressRange(ptr), "cuMemGetAddressRange")
        return int(base), int(size)

    def stream_wait_value32(self, s: int, dev_addr: int, value: int) -> None:
        flags = self.drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
        self._dok(self.drv.cuStreamWaitValue32(s, dev_addr, value, flags), "cuStreamWaitValue32")

    def launch_host_func(self, s: int, fn: Any) -> None:
        # the bindings take the callback as a C function pointer (an int), not a Python callable
        key = next(self._hf_keys)

        def call(_: Any) -> None:
            try:
                fn()
            finally:
                with self._hf_lock:
                    self._host_fns.pop(key, None)

        cb = _HOST_FN(call)
        with self._hf_lock:
            self._host_fns[key] = cb  # alive until CUDA has called it
        try:
            self._ok(self.rt.cudaLaunchHostFunc(s, ctypes.cast(cb, ctypes.c_void_p).value, None), "cudaLaunchHostFunc")
        except BaseException:
            with self._hf_lock:
                self._host_fns.pop(key, None)
            raise


# ------------------------------------------------------------------------------- selection

_api: CudaApi | None = None
_api_error: str = ""
_lock = threading.Lock()


def _make_api() -> CudaApi:
    want = os.environ.get("TENT_CUDA_BACKEND", "").strip().lower()
    if want not in ("", "bindings", "ctypes"):
        raise CudaError(f"TENT_CUDA_BACKEND must be 'bindings' or 'ctypes', not {want!r}")
    if want in ("", "bindings"):
        try:
            return BindingsApi()
        except ImportError as exc:
            if want == "bindings":
                raise CudaError(f"cuda-python's bindings are not importable: {exc}") from exc
    return CtypesApi(os.environ.get("TENT_CUDART") or None)


def api() -> CudaApi:
    """The process's CUDA API (loaded on first use). Raises CudaError when no backend loads."""
    global _api, _api_error
    with _lock:
        if _api is None:
            try:
                _api = _make_api()
            except (CudaError, OSError) as exc:
                _api_error = str(exc)
                raise CudaError(_api_error) from exc
        return _api


def backend() -> str:
    """'bindings' or 'ctypes' (loading the API), or '' when none loads."""
    try:
        return api().backend
    except CudaError:
        return ""


def device_status() -> tuple[int, str]:
    """(number of CUDA devices, "") or (0, why there is none). Never raises."""
    try:
        n = api().device_count()
    except (CudaError, OSError, AttributeError) as exc:
        return 0, str(exc)
    return (n, "") if n > 0 else (0, "cudaGetDeviceCount reports 0 devices")


def reset_for_tests() -> None:
    """Forget the loaded API (tests switch backends with TENT_CUDA_BACKEND)."""
    global _api
    with _lock:
        _api = None


# ------------------------------------------------------------------------------- handles of user objects


def stream_handle(obj: Any) -> int:
    """The cudaStream_t of a torch.cuda.Stream (.cuda_stream), a CuPy stream (.ptr), a cuda-python
    CUstream / cudaStream_t (int()), a Numba stream (.handle) or a raw int handle."""
    return _handle(obj, ("cuda_stream", "ptr", "handle"), "stream")


def event_handle(obj: Any) -> int:
    """The cudaEvent_t of a torch.cuda.Event (.cuda_event), a CuPy event (.ptr), a cuda-python
    CUevent / cudaEvent_t (int()) or a raw int handle."""
    return _handle(obj, ("cuda_event", "ptr", "handle"), "event")


def _handle(obj: Any, attrs: tuple[str, ...], what: str) -> int:
    if isinstance(obj, bool):
        raise InvalidRequestError(f"not a CUDA {what}: {obj!r}")
    if isinstance(obj, int):
        return obj
    for a in attrs:
        v = getattr(obj, a, None)
        if v is None:
            continue
        v = getattr(v, "value", v)  # Numba: ctypes c_void_p
        try:
            return int(v)
        except (TypeError, ValueError):
            continue
    if type(obj).__module__.startswith("cuda."):
        try:
            return int(obj)
        except (TypeError, ValueError):
            pass
    raise InvalidRequestError(f"not a CUDA {what}: {type(obj).__name__} (expected a torch/CuPy/cuda-python {what} or a handle)")


def _is_cuda_object(obj: Any) -> bool:
    mod = type(obj).__module__
    name = type(obj).__name__
    if mod.startswith("torch.cuda") or mod.startswith("cuda.") or mod.startswith("numba.cuda"):
        return True
    return mod.startswith("cupy") and name in ("Stream", "ExternalStream", "Event")


# ------------------------------------------------------------------------------- the device runtime


class _CudaMark(devices.EventMark):
    def __init__(self, runtime: CudaRuntime, event: int, owned: bool) -> None:
        self.runtime = runtime
        self.event, self.owned = event, owned

    def query(self) -> bool:
        return self.runtime.api.event_query(self.event)

    @property
    def native(self) -> tuple[int, int]:
        return self.event, 0

    def release(self) -> None:
        if self.owned and self.event:
            ev, self.event = self.event, 0
            try:
                self.runtime.api.event_destroy(ev)  # CUDA defers the destruction until it completed
            except CudaError as exc:
                log.debug("cudaEventDestroy: %s", exc)


class _FlagGate(devices.Gate):
    """The user's event recorded on a fresh stream after cuStreamWaitValue32(flag >= generation)."""

    def __init__(self, runtime: CudaRuntime, slot: int, generation: int) -> None:
        self.runtime, self.slot, self.generation = runtime, slot, generation
        self._opened = False

    def open(self) -> None:
        if not self._opened:
            self._opened = True
            self.runtime._flag_write(self.slot, self.generation)


class _HostFuncGate(devices.Gate):
    """Fallback: a host function in stream order blocks until opened (or the deadline)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def open(self) -> None:
        self.event.set()


class CudaRuntime(devices.DeviceRuntime):
    """MemoryKind.CUDA's device runtime (see the module docstring)."""

    name = "cuda"
    kinds = frozenset({MemoryKind.CUDA})
    FLAG_SLOTS = 4096

    def __init__(self, cuda_api: CudaApi | None = None) -> None:
        self._api = cuda_api
        self._lock = threading.Lock()
        self._flags = 0  # host address of FLAG_SLOTS host-mapped uint32 words (0: not made yet)
        self._flags_dev = 0
        self._flag_gen = [0] * self.FLAG_SLOTS
        self._flag_next = 0
        self._memops: bool | None = None
        self._pinned: set[int] = set()

    @property
    def api(self) -> CudaApi:
        if self._api is None:
            try:
                self._api = api()
            except CudaError as exc:
                raise InvalidRequestError(f"stream ordering needs CUDA: {exc}") from exc
        return self._api

    def owns(self, obj: Any) -> bool:
        return _is_cuda_object(obj)

    def mark_stream(self, stream: Any) -> devices.EventMark:
        s = stream_handle(stream)
        a = self.api
        ev = a.event_create()
        try:
            a.event_record(ev, s)
        except CudaError:
            a.event_destroy(ev)
            raise
        return _CudaMark(self, ev, True)

    def mark_event(self, event: Any) -> devices.EventMark:
        return _CudaMark(self, event_handle(event), False)

    def join(self, marks: list[devices.EventMark]) -> devices.EventMark:
        a = self.api
        s = a.stream_create()
        try:
            for m in marks:
                assert isinstance(m, _CudaMark)
                a.stream_wait_event(s, m.event)
            ev = a.event_create()
            a.event_record(ev, s)
        finally:
            a.stream_destroy(s)  # released once its work ran
        for m in marks:
            m.release()
        return _CudaMark(self, ev, True)

    # -- signal gates
    def _flag_slot(self) -> tuple[int, int]:
        with self._lock:
            if not self._flags:
                self._flags = self.api.malloc_host(4 * self.FLAG_SLOTS, mapped=True)
                ctypes.memset(self._flags, 0, 4 * self.FLAG_SLOTS)
                self._flags_dev = self.api.host_device_pointer(self._flags)
            slot = self._flag_next
            self._flag_next = (slot + 1) % self.FLAG_SLOTS
            self._flag_gen[slot] += 1
            return slot, self._flag_gen[slot]

    def _flag_write(self, slot: int, generation: int) -> None:
        ctypes.c_uint32.from_address(self._flags + 4 * slot).value = generation & 0xFFFFFFFF

    def arm_signal(self, event: Any, deadline: float) -> devices.Gate:
        a = self.api
        ev = event_handle(event)
        s = a.stream_create()
        try:
            if self._memops is not False:
                try:
                    slot, gen = self._flag_slot()
                    a.stream_wait_value32(s, self._flags_dev + 4 * slot, gen & 0xFFFFFFFF)
                    a.event_record(ev, s)
                    self._memops = True
                    return _FlagGate(self, slot, gen)
                except CudaError as exc:
                    if self._memops:
                        raise
                    log.info("CUDA stream memory operations unavailable (%s): signal gates use host functions", exc)
                    self._memops = False
            gate = _HostFuncGate()
            limit = max(0.0, deadline - time.monotonic()) + 5.0
            a.launch_host_func(s, lambda: gate.event.wait(limit))
            a.event_record(ev, s)
            return gate
        finally:
            a.stream_destroy(s)  # released by CUDA once the gate passed

    # -- staging buffers
    def pin(self, addr: int, length: int) -> bool:
        try:
            self.api.host_register(addr, length)
        except (CudaError, InvalidRequestError) as exc:
            log.debug("cudaHostRegister(%#x, %d): %s", addr, length, exc)
            return False
        with self._lock:
            self._pinned.add(addr)
        return True

    def unpin(self, addr: int) -> None:
        with self._lock:
            if addr not in self._pinned:
                return
            self._pinned.discard(addr)
        try:
            self.api.host_unregister(addr)
        except CudaError as exc:
            log.debug("cudaHostUnregister: %s", exc)

    def copy(self, dst: int, src: int, length: int) -> None:
        self.api.memcpy(dst, src, length)

    # -- checksums on the device
    def checksum(self, addr: int, length: int, first_word: int = 0) -> int:
        """wsum64 partial sum of device memory, computed on the GPU with CuPy or PyTorch when one is
        importable; otherwise read back through a pinned buffer in chunks (the documented fallback)."""
        if length == 0:
            return 0
        for fn in (_wsum_cupy, _wsum_torch):
            try:
                return fn(addr, length, first_word)
            except ImportError:
                continue
        return self._wsum_readback(addr, length, first_word)

    def _wsum_readback(self, addr: int, length: int, first_word: int) -> int:
        chunk = 8 << 20
        buf = self.api.malloc_host(chunk)
        try:
            view = np.ctypeslib.as_array((ctypes.c_uint8 * chunk).from_address(buf))
            total = 0
            for off in range(0, length, chunk):
                n = min(chunk, length - off)
                self.api.memcpy(buf, addr + off, n)
                total += devices.wsum64_host(view[:n], first_word + off // 8)
            return total & ((1 << 64) - 1)
        finally:
            self.api.free_host(buf)


class _Cai:
    """A minimal __cuda_array_interface__ over raw device memory (for torch.as_tensor)."""

    def __init__(self, ptr: int, n: int, typestr: str) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (ptr, False), "version": 2,
                                         "strides": None}


_S64 = lambda v: v - (1 << 64) if v >= 1 << 63 else v  # noqa: E731  (two's complement view for int64 math)
_CHUNK_WORDS = 1 << 24


def _split(addr: int, length: int) -> tuple[int, int]:
    if addr % 8:
        raise ImportError("unaligned device memory: use the read-back path")  # handled like a missing library
    return length // 8, length % 8


def _wsum_cupy(addr: int, length: int, first: int) -> int:
    import cupy as cp

    words, tail = _split(addr, length)
    total = 0
    m1, m2 = cp.uint64(devices.WSUM_M1), cp.uint64(devices.WSUM_M2)
    for start in range(0, words, _CHUNK_WORDS):
        n = min(_CHUNK_WORDS, words - start)
        mem = cp.cuda.UnownedMemory(addr + 8 * start, 8 * n, None)
        w = cp.ndarray((n,), cp.uint64, cp.cuda.MemoryPointer(mem, 0))
        idx = cp.arange(first + start, first + start + n, dtype=cp.uint64)
        total += int(cp.bitwise_xor(w * m1, idx * m2).sum(dtype=cp.uint64))
    if tail:
        total += _tail_sum(addr + 8 * words, tail, first + words)
    return total & ((1 << 64) - 1)


def _wsum_torch(addr: int, length: int, first: int) -> int:
    import torch

    words, tail = _split(addr, length)
    total = 0
    for start in range(0, words, _CHUNK_WORDS):
        n = min(_CHUNK_WORDS, words - start)
        w = torch.as_tensor(_Cai(addr + 8 * start, n, "<i8"), device="cuda")
        idx = torch.arange(first + start, first + start + n, dtype=torch.int64, device=w.device)
        part = torch.bitwise_xor(w * _S64(devices.WSUM_M1), idx * _S64(devices.WSUM_M2)).sum()
        total += int(part.item())
    if tail:
        total += _tail_sum(addr + 8 * words, tail, first + words)
    return total & ((1 << 64) - 1)


def _tail_sum(addr: int, n: int, word: int) -> int:
    out = np.zeros(8, np.uint8)
    api().memcpy(out.ctypes.data, addr, n)
    return devices.wsum64_host(out, word)


__all__ = [
    "BindingsApi",
    "CtypesApi",
    "CudaApi",
    "CudaError",
    "CudaRuntime",
    "api",
    "backend",
    "device_status",
    "event_handle",
    "stream_handle",
]
