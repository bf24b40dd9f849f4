"""Device tensors in refhub: CUDA tensors (torch, CuPy, DLPack, ``__cuda_array_interface__``), Ascend
NPU tensors and the simulated device of the tests (``__tent_memory__``).

Where the bytes go:

* direct mode: the tensor is registered with the engine in place. A reader's engine moves it with
  whatever reaches it: a GPU-capable transport (nvlink on one host, RDMA with GPUDirect), or the
  holder's pinned host staging (target-side staging, `tent_core.target_staging`) when none does;
* copy mode: nothing is registered; the handle's stager copies requested slices from the device
  into its pinned staging slots, and a copy-mode receiver lands them in a pinned landing buffer and
  copies them onto its device.

Checksums: a device tensor's checksum is wsum64 (`tent_core.devices`), computed on the device
(a CUDA kernel through CuPy/PyTorch, the simulated device's kernel) where the data is, published as
``["wsum64", value]``. A receiver checks it where its copy of the data is: on its device (direct),
or on the landing buffer chunk by chunk as the chunks pass (copy mode): never an extra trip of
the whole tensor through host memory. Host tensors keep the host checksum (xxh3 or adler32).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .protocol import WSUM64


@dataclass
class DeviceView:
    """A contiguous device tensor as refhub handles it."""

    ptr: int
    nbytes: int
    kind: Any  # tent_core.types.MemoryKind
    device: int
    runtime: Any  # tent_core.devices.DeviceRuntime
    keep: Any

    def to_host(self, dst: np.ndarray, off: int = 0) -> None:
        """dst[:] = tensor bytes [off, off + dst.size) (a device -> host copy)."""
        if dst.size:
            self.runtime.copy_to_host(int(dst.ctypes.data), self.ptr + off, int(dst.size))

    def from_host(self, src: np.ndarray, off: int = 0) -> None:
        """tensor bytes [off, off + src.size) = src (a host -> device copy)."""
        src = np.ascontiguousarray(src)
        if src.size:
            self.runtime.copy_to_device(self.ptr + off, int(src.ctypes.data), int(src.size))

    def host_copy(self) -> np.ndarray:
        out = np.empty(self.nbytes, np.uint8)
        self.to_host(out)
        return out

    def checksum(self) -> int:
        """wsum64 of the whole tensor, computed on the device."""
        from tent_core.devices import wsum64_finish

        return wsum64_finish(self.runtime.checksum(self.ptr, self.nbytes, 0), self.nbytes)


def device_view(t: Any) -> DeviceView | None:
    """The device view of `t`, or None when `t` is host memory (numpy, CPU torch...)."""
    if isinstance(t, np.ndarray):
        return None
    mod = type(t).__module__
    if mod.startswith("torch") and getattr(getattr(t, "device", None), "type", "cpu") == "cpu":
        return None
    if not (hasattr(t, "__cuda_array_interface__") or hasattr(t, "__tent_memory__") or hasattr(t, "__dlpack__")
            or mod.startswith("torch")):
        return None
    from tent_core import devices
    from tent_core.memory import describe

    region = describe(t)  # contiguity, kind, device
    if not region.kind.is_device:
        return None
    rt = devices.for_kind(region.kind)
    if rt is None:
        raise ValueError(f"no device runtime for {region.kind.value} tensors in this process")
    return DeviceView(region.addr, region.length, region.kind, region.device, rt, region.keepalive)


def checksum_entry(value: int) -> list[Any]:
    return [WSUM64, int(value)]


def wsum64_bytes(data: np.ndarray) -> int:
    from tent_core.devices import wsum64_finish, wsum64_host

    return wsum64_finish(wsum64_host(data), int(data.size))


class StreamHash:
    """A checksum fed in order, chunk by chunk (a copy-mode receiver hashes its landing buffer as
    the chunks pass): wsum64, or the host checksum (xxh3_64 / adler32) `refhub.client.checksum`."""

    def __init__(self, expected: Any, xxhash_mod: Any) -> None:
        self.algo = expected[0] if isinstance(expected, list) else "host"
        self.n = 0
        self._carry = b""
        self._acc = 0
        self._xx = xxhash_mod.xxh3_64() if self.algo == "host" and xxhash_mod is not None else None
        self._adler = 1

    def update(self, data: np.ndarray) -> None:
        if self.algo == WSUM64:
            from tent_core.devices import wsum64_host

            buf = data if not self._carry else np.concatenate([np.frombuffer(self._carry, np.uint8), data])
            whole = buf.size // 8 * 8
            if whole:
                self._acc += wsum64_host(buf[:whole], (self.n - len(self._carry)) // 8)
            self._carry = buf[whole:].tobytes()
        elif self._xx is not None:
            self._xx.update(memoryview(np.ascontiguousarray(data)))
        else:
            self._adler = zlib.adler32(memoryview(np.ascontiguousarray(data)), self._adler)
        self.n += int(data.size)

    def digest(self) -> int:
        if self.algo == WSUM64:
            from tent_core.devices import wsum64_finish, wsum64_host

            acc = self._acc
            if self._carry:
                acc += wsum64_host(np.frombuffer(self._carry, np.uint8), (self.n - len(self._carry)) // 8)
            return wsum64_finish(acc, self.n)
        if self._xx is not None:
            return int(self._xx.intdigest())
        return self._adler ^ (self.n << 32)


__all__ = ["WSUM64", "DeviceView", "StreamHash", "checksum_entry", "device_view", "wsum64_bytes"]
