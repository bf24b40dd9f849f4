"""CUDA for the nvlink transport: the core's CUDA API (`tent_core.cuda`) and descriptor packing.

CUDA is reached through cuda-python's bindings (``cuda.bindings``) where installed and through a
ctypes loader of ``libcudart`` / ``libcuda`` otherwise (``TENT_CUDA_BACKEND`` forces one,
``TENT_CUDART`` names a libcudart); see `tent_core.cuda`. Nothing is loaded at import.
:func:`cudart_path` finds the libcudart the compiled executor dlopen()s: the configured one, the
ctypes backend's, or the one cuda-python's pathfinder locates (pip's nvidia-cuda-runtime wheels).
"""

from __future__ import annotations

import os
from typing import Any

from tent_core.cuda import IPC_HANDLE_SIZE, CudaApi, CudaError, device_status
from tent_core.cuda import api as _api

__all__ = [
    "IPC_HANDLE_SIZE",
    "CudaError",
    "cudart_path",
    "device_status",
    "driver",
    "pack_ipc_desc",
    "runtime",
    "unpack_ipc_desc",
]


def runtime() -> CudaApi:
    """The process's CUDA API (raises CudaError where CUDA cannot be loaded)."""
    return _api()


def driver() -> CudaApi:
    """The same API: `address_range` (cuMemGetAddressRange) lives on it too."""
    return _api()


def cudart_path(configured: str | None = None) -> str:
    """The libcudart for the executor ("" lets it try the usual sonames)."""
    if configured:
        return configured
    if os.environ.get("TENT_CUDART"):
        return os.environ["TENT_CUDART"]
    try:
        path = runtime().path
    except CudaError:
        path = ""
    if path:
        return path
    try:  # cuda-python's locator: finds the runtime of pip's nvidia-cuda-runtime wheels
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return str(load_nvidia_dynamic_lib("cudart").abs_path or "")
    except Exception:
        return ""


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
