"""Test support: a fault-injecting wrapper around any real transport.

`FaultyTransport(inner)` behaves exactly like `inner` (same descriptor, buffers, peers),
but its executor is the compiled fault executor wrapping `inner`'s: while a fault is
armed, matching slices fail with the chosen status as a broken path would report them.
For testing the orchestrator's retry/failover logic; never evidence that a fabric works.
"""

from __future__ import annotations

import ctypes
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


def pattern(n: int, seed: int = 0) -> np.ndarray:
    """A cheap, position-dependent byte pattern (verifies offsets, not just lengths)."""
    idx = np.arange(n, dtype=np.uint32)
    return ((idx * 2654435761 + seed * 97) >> 13).astype(np.uint8)


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
