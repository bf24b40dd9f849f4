"""Test support: byte patterns that never repeat, and a fault-injecting wrapper around any real transport.

`FaultyTransport(inner)` behaves exactly like `inner` (same descriptor, buffers, peers),
but its executor is the compiled fault executor wrapping `inner`'s: while a fault is
armed, matching slices fail with the chosen status as a broken path would report them.
For testing the orchestrator's retry/failover logic; never evidence that a fabric works.
"""

from __future__ import annotations

import ctypes
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from .abi import Status
from .executor import EXECUTOR_ABI_VERSION, Executor, find_extension, load_executor_library
from .plugin_spec import hookimpl
from .transport import Transport, TransportContext
from .types import Availability, BufferInfo, CapabilityProfile, PeerInfo, PeerLink

TENT_E_CONNECT, TENT_E_IO, TENT_E_TIMEOUT, TENT_E_CONGESTED = (
    Status.E_CONNECT, Status.E_IO, Status.E_TIMEOUT, Status.E_CONGESTED,
)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def pattern(n: int, seed: int = 0, offset: int = 0) -> np.ndarray:
    """`n` verification bytes that never repeat: the bytes at `offset .. offset + n` of stream `seed`.

    Every 8-byte word of the stream is splitmix64(word index XOR a key derived from `seed`), a
    bijection of the word index, so no two aligned words of one stream are equal (a slice that
    lands at the wrong offset, at any distance, fails the check), and different seeds give
    unrelated streams (a stale buffer from an earlier round with another seed fails too).
    `pattern(n, s, off)` equals `pattern(off + n, s)[off:]`."""
    if n < 0 or offset < 0:
        raise ValueError(f"pattern: n and offset must be >= 0 (got {n}, {offset})")
    first, skip = divmod(offset, 8)
    words = (skip + n + 7) // 8
    z = np.arange(first, first + words, dtype=np.uint64)
    z ^= np.uint64(_splitmix64(seed & _MASK64))
    with np.errstate(over="ignore"):  # wrap-around arithmetic is the point
        z += _GOLDEN
        z ^= z >> np.uint64(30)
        z *= _MIX1
        z ^= z >> np.uint64(27)
        z *= _MIX2
        z ^= z >> np.uint64(31)
    return z.view(np.uint8)[skip : skip + n]


def fresh_seed() -> int:
    """A seed no earlier round used (63 random bits): each benchmark round fills with its own stream."""
    return secrets.randbits(63)


def first_mismatch(data: np.ndarray, seed: int, offset: int = 0) -> int | None:
    """Index of the first byte of `data` that differs from `pattern(len(data), seed, offset)`, or None."""
    expect = pattern(len(data), seed, offset)
    bad = np.flatnonzero(np.asarray(data, dtype=np.uint8).reshape(-1) != expect)
    return int(bad[0]) if len(bad) else None


class FaultyTransport(Transport):
    def __init__(self, inner: Transport, name: str | None = None) -> None:
        self.inner = inner
        self.name = name or f"faulty_{inner.name}"
        self.version = inner.version
        self.split_bytes = inner.split_bytes
        self.config_keys = inner.config_keys  # the wrapper takes the inner transport's section
        self._executor: Executor | None = None
        self._lib: Any = None

    # delegation
    def probe(self) -> Availability:
        return self.inner.probe()

    def capabilities(self) -> CapabilityProfile:
        return self.inner.capabilities()

    def start(self, ctx: TransportContext) -> None:
        self.inner.start(ctx)
        inner_ex = self.inner.executor
        lib = load_executor_library(find_extension(Path(__file__).parent, "_fault_executor"))
        self._executor = lib.create({"inner_ops": inner_ex.ops, "inner_handle": inner_ex.handle})
        self._lib = lib.cdll
        self._lib.tent_fault_set.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32,
        ]
        self._lib.tent_fault_injected.argtypes = [ctypes.c_void_p]
        self._lib.tent_fault_injected.restype = ctypes.c_uint64

    @property
    def executor(self) -> Executor:
        assert self._executor is not None, "transport not started"
        return self._executor

    def local_descriptor(self) -> dict[str, Any]:
        return self.inner.local_descriptor()

    def export_buffer(self, buf: BufferInfo) -> dict[str, Any] | None:
        return self.inner.export_buffer(buf)

    def release_buffer(self, buf: BufferInfo) -> None:
        self.inner.release_buffer(buf)

    def can_reach(self, peer: PeerInfo) -> str | None:
        return self.inner.can_reach(self._as_inner(peer))

    def connect(self, peer: PeerInfo, remote_buffers: list[dict[str, Any]]) -> PeerLink:
        bufs = []
        for b in remote_buffers:
            desc = dict(b.get("desc", {}))
            if self.name in desc:
                desc.setdefault(self.inner.name, desc[self.name])
            bufs.append(dict(b, desc=desc))
        return self.inner.connect(self._as_inner(peer), bufs)

    def disconnect(self, link: PeerLink) -> None:
        self.inner.disconnect(link)

    def abort_rail(self, link: PeerLink, rail: int, in_flight: bool = True) -> int:
        return self.inner.abort_rail(link, rail, in_flight)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None
        self.inner.close()

    def _as_inner(self, peer: PeerInfo) -> PeerInfo:
        """Peers advertise us under our own name; the inner transport looks for its own."""
        t = dict(peer.transports)
        if self.name in t:
            t.setdefault(self.inner.name, t[self.name])
        return PeerInfo(peer.engine_id, peer.host_id, peer.pid, t)

    # fault control
    def inject(self, status: int = TENT_E_IO, rails: list[int] | None = None, skip_first: int = 0, probability: float = 1.0) -> None:
        """Arm a fault: slices on `rails` (default all), after the next `skip_first`, fail with `status`."""
        mask = (1 << 64) - 1 if rails is None else sum(1 << r for r in rails)
        self._lib.tent_fault_set(self.executor.handle, 1, status, mask, skip_first, int(probability * 1000))

    def heal(self) -> None:
        self._lib.tent_fault_set(self.executor.handle, 0, 0, (1 << 64) - 1, 0, 0)

    @property
    def injected(self) -> int:
        return int(self._lib.tent_fault_injected(self.executor.handle))


class FaultPlugin:
    """A pluggy plugin object registering `faulty_<name>` wrappers around installed transports.

    Usage: ``Engine(plugins=[FaultPlugin("shm")], transports=["tcp", "faulty_shm"])``.
    The wrapper instance is kept in `.instances` so tests can arm faults.
    """

    def __init__(self, *inner_names: str) -> None:
        self.inner_names = inner_names
        self.instances: dict[str, FaultyTransport] = {}
        self.__name__ = f"fault-plugin-{'-'.join(inner_names)}"

    @hookimpl
    def tent_register_transports(self, registry: Any) -> None:
        for inner in self.inner_names:
            entry = registry.entries.get(inner)
            if entry is None:
                continue

            def factory(entry: Any = entry, inner: str = inner) -> FaultyTransport:
                ft = FaultyTransport(entry.factory())
                self.instances[inner] = ft
                return ft

            registry.add(f"faulty_{inner}", factory, abi_version=EXECUTOR_ABI_VERSION, version=entry.version)
