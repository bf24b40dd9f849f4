"""Device runtimes: what the core needs from an accelerator's runtime, by memory kind.

The core moves device memory through transports (nvlink, gds, ascend, simdev); it never copies it
itself. What it does need from the runtime behind a device memory kind is small and lives here:

* stream ordering (`tent_core.ordering`): turning the stream or event a request names into an
  `EventMark` (a point on a device timeline the transfer must wait for), and arming a `Gate` that
  fires the request's completion event on the device once the host says the transfer is done;
* page-locking staging buffers (`pin`), so host<->device copies of staged paths run as DMA;
* checksums of device memory computed on the device (`checksum`: the wsum64 partial sums that
  refhub verifies with, see `wsum64_host`), so verifying device data never copies it to the host.

Runtimes register by memory kind: CUDA (`tent_core.cuda`, loaded on first use), the simulated
device of the tests (`tent_core.simdev`), a plugin's own (e.g. Ascend). Nothing here loads a
library at import.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import InvalidRequestError
from .types import MemoryKind

# wsum64: sum over 8-byte little-endian words w_i (the last one zero-padded) of
# (w_i * M1) ^ ((first + i) * M2), modulo 2**64. A change of any one word changes the sum (M1 is
# odd); the index term catches swapped words. Partial sums of disjoint word ranges add up, so
# chunks can be hashed in any order, where they are (device, staging buffer, landing buffer).
WSUM_M1 = 0x9E3779B97F4A7C15
WSUM_M2 = 0xC2B2AE3D27D4EB4F
WSUM_M3 = 0x165667B19E3779F9  # mixes the length into the final value
_MASK = (1 << 64) - 1
_WSUM_CHUNK_WORDS = 1 << 20


def wsum64_host(data: np.ndarray | memoryview | bytes, first_word: int = 0) -> int:
    """The wsum64 partial sum of host bytes whose first byte is word `first_word` of the tensor."""
    b = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    n = b.size
    whole = n // 8
    total = 0
    m1, m2 = np.uint64(WSUM_M1), np.uint64(WSUM_M2)
    with np.errstate(over="ignore"):
        for start in range(0, whole, _WSUM_CHUNK_WORDS):
            stop = min(whole, start + _WSUM_CHUNK_WORDS)
            words = b[start * 8 : stop * 8].view("<u8")
            idx = np.arange(first_word + start, first_word + stop, dtype=np.uint64)
            total += int(np.bitwise_xor(words * m1, idx * m2).sum(dtype=np.uint64))
        if n % 8:
            tail = np.zeros(8, np.uint8)
            tail[: n % 8] = b[whole * 8 :]
            w = int(tail.view("<u8")[0])
            total += ((w * WSUM_M1) & _MASK) ^ (((first_word + whole) * WSUM_M2) & _MASK)
    return total & _MASK


def wsum64_finish(partials: int, nbytes: int) -> int:
    """The checksum of a whole tensor from the sum of its partial sums."""
    return (partials & _MASK) ^ ((nbytes * WSUM_M3) & _MASK)


class EventMark(abc.ABC):
    """A point on a device timeline: an event as it was recorded when the mark was taken."""

    runtime: DeviceRuntime

    @abc.abstractmethod
    def query(self) -> bool:
        """True once the device passed the mark."""

    def wait(self, timeout: float) -> bool:
        """Block the host until the device passed the mark, at most `timeout` seconds."""
        import time

        end = time.monotonic() + max(0.0, timeout)
        delay = 20e-6
        while not self.query():
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, 2e-3)
        return True

    @property
    def native(self) -> tuple[int, int]:
        """(event handle, sequence) for executors that wait on the device themselves (order table)."""
        raise NotImplementedError

    def release(self) -> None:
        """The mark is no longer needed (an internal event may be recycled)."""


class Gate(abc.ABC):
    """Holds a user's event until the host opens the gate: armed at submit, opened when the batch
    is final, so consumers can make their stream wait for the event right after submit."""

    @abc.abstractmethod
    def open(self) -> None: ...


class DeviceRuntime(abc.ABC):
    """One accelerator runtime. Handles are the runtime's own (a cudaStream_t as an int...)."""

    name: str = ""
    kinds: frozenset[MemoryKind] = frozenset()

    @abc.abstractmethod
    def owns(self, obj: Any) -> bool:
        """Whether `obj` (a stream or event object, not a bare int) belongs to this runtime."""

    @abc.abstractmethod
    def mark_stream(self, stream: Any) -> EventMark:
        """Everything queued on `stream` so far (an internal event recorded on it now)."""

    @abc.abstractmethod
    def mark_event(self, event: Any) -> EventMark:
        """The event's most recent record as of now."""

    def join(self, marks: list[EventMark]) -> EventMark:
        """One mark passed when all of `marks` are (default: the host waits for each)."""
        return _JoinedMark(self, marks)

    @abc.abstractmethod
    def arm_signal(self, event: Any, deadline: float) -> Gate:
        """Record `event` behind a gate; it fires once the gate opens (or at `deadline`, so a lost
        gate never holds a device queue forever). `deadline` is time.monotonic() seconds."""

    def pin(self, addr: int, length: int) -> bool:
        """Page-lock host memory used as staging (True when done; False: not supported)."""
        return False

    def unpin(self, addr: int) -> None:
        pass

    def checksum(self, addr: int, length: int, first_word: int = 0) -> int:
        """wsum64 partial sum of device memory [addr, addr+length), computed where the data is."""
        raise NotImplementedError(f"{self.name}: no device checksum")

    def copy(self, dst: int, src: int, length: int) -> None:
        """Synchronous copy between host and device memory of this runtime (fallback paths)."""
        raise NotImplementedError(f"{self.name}: no copy")

    def copy_to_host(self, dst: int, src: int, length: int) -> None:
        """Device -> host; runtimes that need the direction (ACL) override it."""
        self.copy(dst, src, length)

    def copy_to_device(self, dst: int, src: int, length: int) -> None:
        """Host -> device; runtimes that need the direction (ACL) override it."""
        self.copy(dst, src, length)


class _JoinedMark(EventMark):
    def __init__(self, runtime: DeviceRuntime, marks: list[EventMark]) -> None:
        self.runtime = runtime
        self.marks = marks

    def query(self) -> bool:
        return all(m.query() for m in self.marks)

    def release(self) -> None:
        for m in self.marks:
            m.release()


_lock = threading.Lock()
_runtimes: dict[MemoryKind, DeviceRuntime] = {}
_factories: dict[MemoryKind, Callable[[], DeviceRuntime]] = {}


def register(runtime: DeviceRuntime | Callable[[], DeviceRuntime], kinds: frozenset[MemoryKind] | None = None) -> None:
    """Register a runtime (or a factory called on first use) for its memory kinds."""
    with _lock:
        if isinstance(runtime, DeviceRuntime):
            for k in kinds or runtime.kinds:
                _runtimes[k] = runtime
        else:
            for k in kinds or ():
                _factories[k] = runtime


def for_kind(kind: MemoryKind) -> DeviceRuntime | None:
    """The runtime of device memory `kind`, loaded on first use; None when none is registered."""
    with _lock:
        rt = _runtimes.get(kind)
        if rt is not None:
            return rt
        factory = _factories.get(kind)
    if factory is None:
        return None
    rt = factory()
    with _lock:
        return _runtimes.setdefault(kind, rt)


def for_request(objs: list[Any], kinds: list[MemoryKind]) -> DeviceRuntime:
    """The runtime that owns the stream/event objects a request names; for bare handles (ints), the
    runtime of the request's device memory (CUDA when none is device memory)."""
    with _lock:
        candidates = list(dict.fromkeys(_runtimes.values()))
    for obj in objs:
        if isinstance(obj, int):
            continue
        for rt in candidates:
            if rt.owns(obj):
                return rt
    for kind in kinds:
        if kind.is_device:
            rt = for_kind(kind)
            if rt is not None:
                return rt
    rt = for_kind(MemoryKind.CUDA)
    if rt is None:
        raise InvalidRequestError(f"no device runtime for the stream/event objects {objs!r}")
    return rt


def _cuda_factory() -> DeviceRuntime:
    # by name: tent_core.cuda builds on this module (no import cycle), and loads nothing until used
    import importlib

    return importlib.import_module("tent_core.cuda").CudaRuntime()  # type: ignore[no-any-return]


register(_cuda_factory, frozenset({MemoryKind.CUDA}))

__all__ = [
    "DeviceRuntime",
    "EventMark",
    "Gate",
    "for_kind",
    "for_request",
    "register",
    "wsum64_finish",
    "wsum64_host",
]
