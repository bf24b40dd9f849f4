"""The ``ascend`` transport: Huawei Ascend NPU memory through the CANN runtime.

What it moves: host <-> NPU and NPU <-> NPU (any NPUs of this host visible to the process) within
this process, with ``aclrtMemcpy`` on the compiled executor's worker threads. Other processes,
on this host or another, reach an engine's NPU memory through that engine's target-side staging
(`tent_core.target_staging`): its own ascend transport copies between its pinned staging slots and
the NPU, and TCP/RDMA moves the bytes between the hosts. (ACL's IPC export of device memory asks
the exporter to whitelist each importer's pid before it imports, a handshake this plugin does not
do yet; staging keeps every access checked by the owning engine meanwhile.)

CANN is loaded at run time (ctypes dlopen of ``libascendcl.so`` from the loader path CANN's
``set_env.sh`` sets up, or the file ``TENT_ASCENDCL`` names: availability is decided before the
engine's config is read, so the library is not a config key); without it the transport imports and
reports ``unavailable: <reason>``.

Config keys: ``threads`` (copy workers, default 2), ``chunk`` (bytes a worker copies at a time,
default 8 MiB), ``bandwidth_gbps`` (advertised rate for the path planner, default 0 = unknown).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tent_core import devices
from tent_core.errors import InvalidRequestError, PeerUnreachableError
from tent_core.executor import EXECUTOR_ABI_VERSION, Executor, PluginLibrary
from tent_core.plugin_spec import hookimpl
from tent_core.transport import AccessControl, Transport, TransportContext
from tent_core.types import (
    Availability,
    BufferInfo,
    CapabilityProfile,
    MemoryKind,
    PeerInfo,
    PeerLink,
    Permission,
    RailInfo,
)

from . import __version__
from .acl import AclError, AclRuntime, acl, status

log = logging.getLogger(__name__)

KIND_PAIRS = frozenset({(MemoryKind.HOST, MemoryKind.NPU), (MemoryKind.NPU, MemoryKind.HOST), (MemoryKind.NPU, MemoryKind.NPU)})

u64, i32, vp = ctypes.c_uint64, ctypes.c_int32, ctypes.c_void_p


class _Lib(PluginLibrary):
    PREFIX = "tent_asc_"
    PROTOTYPES: ClassVar[dict[str, tuple[Any, list[Any]]]] = {
        "peer_add": (u64, [vp]),
        "peer_remove": (i32, [vp, u64]),
        "map_add": (i32, [vp, u64, u64, u64, u64, i32, i32]),
        "map_remove": (i32, [vp, u64, u64]),
        "local_add": (i32, [vp, u64, u64, i32]),
        "local_remove": (i32, [vp, u64]),
        "stats": (None, [vp, ctypes.POINTER(u64)]),
    }
    peer_add: Any
    peer_remove: Any
    map_add: Any
    map_remove: Any
    local_add: Any
    local_remove: Any
    stats: Any


@functools.cache
def get_lib() -> _Lib:
    return _Lib(Path(__file__).parent)


@dataclass
class _Link:
    engine_id: str
    handle: int
    regions: dict[int, int] = field(default_factory=dict)  # rbase -> length
    lock: threading.Lock = field(default_factory=threading.Lock)


class AscendTransport(Transport):
    name = "ascend"
    version = __version__
    config_keys: ClassVar[dict[str, Any]] = {
        "threads": 2,  # copy worker threads
        "chunk": 8 << 20,  # bytes one worker copies at a time
        "bandwidth_gbps": 0.0,  # advertised rate for the path planner (0: unknown)
    }

    def __init__(self) -> None:
        self._lib: _Lib | None = None
        self._executor: Executor | None = None
        self._host_id = ""
        self._cfg: dict[str, Any] = dict(self.config_keys)
        self._links: dict[str, _Link] = {}
        self._by_handle: dict[int, _Link] = {}
        self._lock = threading.RLock()

    def probe(self) -> Availability:
        if not sys.platform.startswith("linux"):
            return Availability.unavailable("the ascend transport needs Linux")
        try:
            get_lib()
        except Exception as exc:
            return Availability.unavailable(f"ascend executor library unusable: {exc}")
        n, why = status()
        if n == 0:
            return Availability.unavailable(f"no Ascend NPU: {why}")
        return Availability(True, f"{n} Ascend NPU(s)")

    def capabilities(self) -> CapabilityProfile:
        return CapabilityProfile(KIND_PAIRS, same_host=True, cross_host=False, rank=5,
                                 bandwidth_gbps=float(self._cfg["bandwidth_gbps"]))

    def start(self, ctx: TransportContext) -> None:
        self._cfg = self.resolve_config(ctx.config)
        self._host_id = ctx.host_id
        self._lib = get_lib()
        a = acl()
        devices.register(AclRuntime())
        self._executor = self._lib.library.create(
            {"threads": int(self._cfg["threads"]), "chunk": int(self._cfg["chunk"]), "acl_lib": a.path}
        )
        log.info("ascend transport started: %d NPU(s), acl=%s", a.device_count(), a.path)

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            raise RuntimeError("ascend transport not started")
        return self._executor

    def stats(self) -> dict[str, int]:
        assert self._lib is not None
        out = (ctypes.c_uint64 * 4)()
        self._lib.stats(self.executor.handle, out)
        return dict(zip(("h2d", "d2h", "d2d", "h2h"), (int(x) for x in out), strict=True))

    def local_descriptor(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host_id": self._host_id, "version": __version__}

    def export_buffer(self, buf: BufferInfo) -> dict[str, Any] | None:
        if buf.kind == MemoryKind.HOST:
            return {"host": True, "pid": os.getpid()}
        if buf.kind != MemoryKind.NPU:
            return None
        if self._executor is None or self._lib is None:
            raise RuntimeError("ascend transport not started")
        device = buf.device if buf.device >= 0 else 0
        rc = int(self._lib.local_add(self._executor.handle, buf.addr, buf.length, device))
        if rc != 0:
            raise InvalidRequestError(f"ascend: NPU buffer [{buf.addr:#x}, +{buf.length}) overlaps a registered one "
                                      f"({os.strerror(-rc)})")
        return {"device": device, "pid": os.getpid()}  # this process's own engine only (see the module doc)

    def release_buffer(self, buf: BufferInfo) -> None:
        if buf.kind == MemoryKind.NPU and self._executor is not None and self._lib is not None:
            self._lib.local_remove(self._executor.handle, buf.addr)

    def access_control(self, link: PeerLink) -> AccessControl:
        return AccessControl()  # the executor checks ranges and permission itself (own process only)

    def can_reach(self, peer: PeerInfo) -> str | None:
        d = peer.transports.get(self.name)
        if d is None:
            return f"peer does not offer {self.name}"
        if peer.host_id != self._host_id or int(d.get("pid", peer.pid)) != os.getpid():
            return "NPU memory of another process is reached through its engine's staging"
        return None

    def connect(self, peer: PeerInfo, remote_buffers: list[dict[str, Any]]) -> PeerLink:
        if self._executor is None or self._lib is None:
            raise RuntimeError("ascend transport not started")
        why = self.can_reach(peer)
        if why:
            raise PeerUnreachableError(f"ascend: cannot reach {peer.engine_id}: {why}")
        with self._lock:
            link = self._links.get(peer.engine_id)
            if link is None:
                h = int(self._lib.peer_add(self._executor.handle))
                if not h:
                    raise PeerUnreachableError(f"ascend: executor could not add {peer.engine_id}")
                link = self._links[peer.engine_id] = _Link(peer.engine_id, h)
                self._by_handle[h] = link
        wanted = {}
        for b in remote_buffers:
            d = (b.get("desc") or {}).get(self.name)
            kind = str(b.get("kind", ""))
            if d is None or kind not in (MemoryKind.NPU.value, MemoryKind.HOST.value):
                continue
            dev = int(d.get("device", 0)) if kind == MemoryKind.NPU.value else -1
            wanted[int(b["addr"])] = (int(b["length"]), dev, bool(int(b.get("perm", 3)) & Permission.WRITE))
        ex = self._executor.handle
        with link.lock:
            for rbase in [a for a, ln in link.regions.items() if a not in wanted or wanted[a][0] != ln]:
                self._lib.map_remove(ex, link.handle, rbase)
                del link.regions[rbase]
            for rbase, (length, dev, writable) in wanted.items():
                if rbase in link.regions:
                    continue
                rc = int(self._lib.map_add(ex, link.handle, rbase, length, rbase, dev, int(writable)))
                if rc != 0:
                    raise PeerUnreachableError(f"ascend: mapping buffer {rbase:#x}: {os.strerror(-rc)}")
                link.regions[rbase] = length
        return PeerLink(handle=link.handle, rails=[RailInfo(0, "ascend-acl")])

    def disconnect(self, link: PeerLink) -> None:
        with self._lock:
            lk = self._by_handle.pop(link.handle, None)
            if lk is not None:
                self._links.pop(lk.engine_id, None)
                if self._executor is not None and self._lib is not None:
                    self._lib.peer_remove(self._executor.handle, lk.handle)

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.close()
                self._executor = None
            self._links.clear()
            self._by_handle.clear()


def _factory() -> AscendTransport:
    return AscendTransport()


@hookimpl
def tent_register_transports(registry: Any) -> None:
    registry.add(
        "ascend",
        _factory,
        abi_version=EXECUTOR_ABI_VERSION,
        version=__version__,
        description="Ascend NPU memory: host<->NPU and NPU<->NPU copies with aclrtMemcpy (CANN loaded at runtime)",
    )


__all__ = ["KIND_PAIRS", "AclError", "AscendTransport", "get_lib"]
