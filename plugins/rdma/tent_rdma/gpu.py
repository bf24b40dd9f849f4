"""GPU memory straight to the NIC (GPUDirect RDMA), when the GPU, driver and kernel allow it.

Two real mechanisms, tried in this order:

- dma-buf: the CUDA driver exports a device range as a dma-buf fd
  (``cuMemGetHandleForAddressRange(..., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)``) and the NIC
  registers it with ``ibv_reg_dmabuf_mr`` (rdma-core >= 34, kernel >= 5.12, a driver that reports
  ``CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED``).
- nvidia-peermem: with the ``nvidia_peermem`` kernel module loaded, plain ``ibv_reg_mr`` accepts
  device pointers.

When neither is there, :func:`gpu_direct_status` says why, the transport does not offer CUDA
memory, and the engine moves GPU buffers through its staged path (GPU -> host bounce -> RDMA).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass

CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124
CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1
PEERMEM_SYSFS = "/sys/module/nvidia_peermem"


@dataclass(frozen=True)
class GpuDirect:
    mode: str | None  # "dmabuf", "peermem" or None (off)
    reason: str  # why it is off, or what it uses


_cuda: ctypes.CDLL | None = None


def _libcuda() -> ctypes.CDLL:
    global _cuda
    if _cuda is None:
        _cuda = ctypes.CDLL("libcuda.so.1")
    return _cuda


def gpu_direct_status(ibv_has_dmabuf: bool, peermem_path: str = PEERMEM_SYSFS) -> GpuDirect:
    try:
        cuda = _libcuda()
    except OSError:
        return GpuDirect(None, "off: libcuda.so.1 not found (no NVIDIA driver); GPU buffers take the staged path")
    rc = cuda.cuInit(0)
    if rc != 0:
        return GpuDirect(None, f"off: cuInit failed (CUDA error {rc}); GPU buffers take the staged path")
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return GpuDirect(None, "off: no CUDA device; GPU buffers take the staged path")
    dev = ctypes.c_int(0)
    supported = ctypes.c_int(0)
    if (
        ibv_has_dmabuf
        and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
        and cuda.cuDeviceGetAttribute(ctypes.byref(supported), CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) == 0
        and supported.value == 1
    ):
        return GpuDirect("dmabuf", "on: dma-buf (cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr)")
    if os.path.exists(peermem_path):
        return GpuDirect("peermem", "on: nvidia_peermem (ibv_reg_mr on device pointers)")
    why = "libibverbs lacks ibv_reg_dmabuf_mr" if not ibv_has_dmabuf else "the driver reports no dma-buf support"
    return GpuDirect(None, f"off: {why} and nvidia_peermem is not loaded; GPU buffers take the staged path")


def dmabuf_range(addr: int, length: int, page: int = mmap.PAGESIZE) -> tuple[int, int, int]:
    """(aligned base, aligned length, offset of addr in it): dma-buf export wants page-aligned ranges."""
    base = addr & ~(page - 1)
    end = (addr + length + page - 1) & ~(page - 1)
    return base, end - base, addr - base


def export_dmabuf(addr: int, length: int) -> tuple[int, int]:
    """A dma-buf fd covering a device range and the offset of `addr` in it (caller closes the fd)."""
    cuda = _libcuda()
    base, alen, offset = dmabuf_range(addr, length)
    fd = ctypes.c_int(-1)
    rc = cuda.cuMemGetHandleForAddressRange(
        ctypes.byref(fd), ctypes.c_uint64(base), ctypes.c_size_t(alen), CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
        ctypes.c_ulonglong(0),
    )
    if rc != 0:
        raise OSError(f"cuMemGetHandleForAddressRange failed (CUDA error {rc})")
    return fd.value, offset
