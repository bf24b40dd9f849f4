"""The ``nvlink`` transport: same-host GPU copies through CUDA IPC.

A registered CUDA buffer is exported as its allocation's ``cudaIpcGetMemHandle`` bytes,
the device, and the buffer's offset inside the allocation (``cuMemGetAddressRange``). A
peer on the same host opens the handle with ``cudaIpcOpenMemHandle`` at :meth:`connect`
and registers ``remote base -> local pointer`` with the compiled executor, which runs
``cudaMemcpyAsync(cudaMemcpyDefault)`` on its own streams: NVLink / PCIe peer copies for
device <-> device, copy engines for host <-> device.

CUDA is loaded only at runtime (ctypes dlopen of libcudart / libcuda); importing this
module never touches it, and :meth:`NvlinkTransport.probe` reports
``unavailable("no CUDA device: <reason>")`` where there is none.

Host memory: the local side of a slice may be any host memory (pageable or pinned). A
*remote* HOST buffer is reachable only when the peer is this very process (the engine's
self-peer): CUDA IPC does not export host memory.

What a peer can touch: a CUDA IPC handle opens the *whole allocation* behind a buffer, writable,
in the peer's process. The peer's executor maps only the registered range and refuses writes into
a READ-only buffer, but that is the peer's own code: nothing on this side enforces it. So:

* a buffer registered without WRITE permission is never shared over CUDA IPC (its descriptor is
  local-only: this engine's own legs, e.g. target staging, still use it). Peers reach it through
  the engine's target-side staging, where this engine checks every request;
* with config ``share_partial_allocations = false``, a buffer that does not cover its whole
  allocation is local-only too, so no peer ever maps bytes outside what was registered.

Stream ordering: a batch whose request names a stream or event (`tent_core.ordering`) registers its
event here (`order_batch`); the executor issues each of its copies after cudaStreamWaitEvent on the
copy's stream.

Config keys: ``streams`` (per device, default 4), ``cudart`` (path of libcudart to use),
``share_partial_allocations`` (default true).
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
from tent_core.errors import PeerUnreachableError
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
from .cuda import CudaError, cudart_path, device_status, driver, pack_ipc_desc, runtime, unpack_ipc_desc

log = logging.getLogger(__name__)

KIND_PAIRS = frozenset(
    {
        (MemoryKind.CUDA, MemoryKind.CUDA),
        (MemoryKind.HOST, MemoryKind.CUDA),
        (MemoryKind.CUDA, MemoryKind.HOST),
    }
)


u64, i32, vp = ctypes.c_uint64, ctypes.c_int32, ctypes.c_void_p


class _Lib(PluginLibrary):
    """The compiled executor library plus ctypes prototypes of its private functions."""

    PREFIX = "tent_nvl_"
    PROTOTYPES: ClassVar[dict[str, tuple[Any, list[Any]]]] = {
        "peer_add": (u64, [vp]),
        "peer_remove": (i32, [vp, u64]),
        "map_add": (i32, [vp, u64, u64, u64, u64, i32, i32]),
        "map_remove": (i32, [vp, u64, u64]),
        "stats": (None, [vp, ctypes.POINTER(u64)]),
        "order_add": (i32, [vp, u64, u64, u64, u64]),
        "order_remove": (i32, [vp, u64]),
        "ordered": (u64, [vp]),
    }

    peer_add: Any
    peer_remove: Any
    map_add: Any
    map_remove: Any
    stats: Any
    order_add: Any
    order_remove: Any
    ordered: Any


@functools.cache
def get_lib() -> _Lib:
    return _Lib(Path(__file__).parent)


@dataclass
class _Region:
    length: int
    lptr: int
    device: int
    writable: bool
    ipc_key: str = ""  # the opened handle this region lives in ("" = identity mapping)


@dataclass
class _Link:
    engine_id: str
    pid: int
    handle: int
    regions: dict[int, _Region] = field(default_factory=dict)
    opened: dict[str, tuple[int, int]] = field(default_factory=dict)  # handle hex -> (ptr, refs)
    lock: threading.Lock = field(default_factory=threading.Lock)


class NvlinkTransport(Transport):
    name = "nvlink"
    version = __version__
    config_keys = {
        "streams": 4,  # CUDA streams the executor spreads copies over
        "cudart": None,  # path of libcudart (default: the one the plugin finds, see tent_nvlink.cuda)
        # share buffers that are part of a larger allocation (the peer's IPC mapping covers it all)
        "share_partial_allocations": True,
    }

    def __init__(self) -> None:
        self._lib: _Lib | None = None
        self._executor: Executor | None = None
        self._host_id = ""
        self._links: dict[str, _Link] = {}
        self._by_handle: dict[int, _Link] = {}
        self._lock = threading.RLock()
        self._share_partial = True

    # -- discovery
    def probe(self) -> Availability:
        if not sys.platform.startswith("linux"):
            return Availability.unavailable("nvlink transport needs Linux")
        try:
            get_lib()
        except Exception as exc:
            return Availability.unavailable(f"nvlink executor library unusable: {exc}")
        n, why = device_status()
        if n == 0:
            return Availability.unavailable(f"no CUDA device: {why}")
        return Availability(True, f"{n} CUDA device(s)")

    def capabilities(self) -> CapabilityProfile:
        return CapabilityProfile(kind_pairs=KIND_PAIRS, same_host=True, cross_host=False, rank=5)

    # -- lifecycle
    def start(self, ctx: TransportContext) -> None:
        cfg = self.resolve_config(ctx.config)
        self._host_id = ctx.host_id
        self._share_partial = bool(cfg["share_partial_allocations"])
        self._lib = get_lib()
        rt = runtime()
        ex_cfg = {"streams": int(cfg["streams"]), "cudart": cudart_path(cfg["cudart"])}
        self._executor = self._lib.library.create(ex_cfg)
        log.info(
            "nvlink transport started: %d device(s), streams=%d, cudart=%s",
            rt.device_count(),
            ex_cfg["streams"],
            ex_cfg["cudart"],
        )

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            raise RuntimeError("nvlink transport not started")
        return self._executor

    def stats(self) -> dict[str, int]:
        assert self._lib is not None
        out = (ctypes.c_uint64 * 4)()
        self._lib.stats(self.executor.handle, out)
        st = dict(zip(("issued", "ok", "failed", "bytes"), (int(x) for x in out), strict=True))
        st["ordered"] = int(self._lib.ordered(self.executor.handle))
        return st

    def local_descriptor(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host_id": self._host_id, "version": __version__}

    # -- buffers
    def export_buffer(self, buf: BufferInfo) -> dict[str, Any] | None:
        if buf.kind == MemoryKind.HOST:
            return {"host": True, "pid": os.getpid()}  # reachable by this process's self-peer only
        if buf.kind != MemoryKind.CUDA:
            return None
        why = self.local_only_reason(buf)
        if why is not None and buf.device >= 0:  # nothing to ask CUDA
            log.info("nvlink: %s/%d is not shared with other processes: %s", buf.segment, buf.offset, why)
            return {"local": True, "device": int(buf.device), "pid": os.getpid()}
        rt = runtime()
        device = buf.device if buf.device >= 0 else rt.pointer_device(buf.addr)
        if why is None:
            rt.set_device(device)
            base, size = driver().address_range(buf.addr)
            if base == buf.addr and size == buf.length or self._share_partial:
                try:
                    return pack_ipc_desc(rt.ipc_get(base), device, buf.addr - base, size, os.getpid())
                except CudaError as exc:  # e.g. a VM whose driver offers no CUDA IPC: staging serves it
                    why = f"CUDA IPC refused it ({exc})"
            else:
                why = f"it covers [{buf.addr - base}, +{buf.length}) of a {size}-byte allocation (share_partial_allocations = false)"
        log.info("nvlink: %s/%d is not shared with other processes: %s", buf.segment, buf.offset, why)
        return {"local": True, "device": int(device), "pid": os.getpid()}

    @staticmethod
    def local_only_reason(buf: BufferInfo) -> str | None:
        """Why a CUDA buffer is not shared over CUDA IPC (None: it is). A peer that opens an IPC
        handle can write the whole allocation, so read-only buffers are never handed out."""
        if not Permission(buf.perm) & Permission.WRITE:
            return "CUDA IPC cannot enforce READ-only access (peers reach it through target staging)"
        return None

    # -- peers
    def can_reach(self, peer: PeerInfo) -> str | None:
        if self.name not in peer.transports:
            return f"peer does not offer {self.name}"
        if not self._host_id or peer.host_id != self._host_id:
            return f"peer {peer.engine_id} is on another host ({peer.host_id} != {self._host_id})"
        return None

    def access_control(self, link: PeerLink) -> AccessControl:
        return AccessControl(
            revocation=False,
            reason="a CUDA IPC mapping stays valid in the peer until the peer closes it",
        )

    def connect(self, peer: PeerInfo, remote_buffers: list[dict[str, Any]]) -> PeerLink:
        if self._executor is None or self._lib is None:
            raise RuntimeError("nvlink transport not started")
        reason = self.can_reach(peer)
        if reason:
            raise PeerUnreachableError(f"nvlink: cannot reach {peer.engine_id}: {reason}")
        pid = int(peer.transports[self.name].get("pid", peer.pid))
        with self._lock:
            link = self._links.get(peer.engine_id)
            if link is not None and link.pid != pid:
                self._teardown(link)
                link = None
            if link is None:
                h = int(self._lib.peer_add(self._executor.handle))
                if not h:
                    raise PeerUnreachableError(f"nvlink: executor could not add peer {peer.engine_id}")
                link = self._links[peer.engine_id] = _Link(peer.engine_id, pid, h)
                self._by_handle[h] = link
        self._sync(link, remote_buffers)
        return PeerLink(handle=link.handle, rails=[RailInfo(0, "nvlink-cuda-ipc")])

    def _wanted(
        self, link: _Link, remote_buffers: list[dict[str, Any]]
    ) -> dict[int, tuple[int, dict[str, Any], str, bool]]:
        out: dict[int, tuple[int, dict[str, Any], str, bool]] = {}
        for b in remote_buffers:
            kind = str(b.get("kind", ""))
            d = (b.get("desc") or {}).get(self.name)
            if d is None or kind not in (MemoryKind.CUDA.value, MemoryKind.HOST.value):
                continue
            if (kind == MemoryKind.HOST.value or d.get("local")) and link.pid != os.getpid():
                continue  # remote host memory, or device memory its owner does not share over IPC
            writable = bool(Permission(int(b.get("perm", 3))) & Permission.WRITE)
            out[int(b["addr"])] = (int(b["length"]), d, kind, writable)
        return out

    def _sync(self, link: _Link, remote_buffers: list[dict[str, Any]]) -> None:
        assert self._lib is not None and self._executor is not None
        wanted = self._wanted(link, remote_buffers)
        same_process = link.pid == os.getpid()
        with link.lock:
            for addr in [a for a, r in link.regions.items() if a not in wanted or wanted[a][0] != r.length]:
                self._drop_region(link, addr)
            for addr, (length, d, kind, writable) in wanted.items():
                if addr in link.regions:
                    continue
                if kind == MemoryKind.HOST.value:
                    reg = _Region(length, addr, 0, writable)
                elif d.get("local"):  # our own buffer, not shared over IPC: no handle to open
                    reg = _Region(length, addr, int(d.get("device", 0)), writable)
                else:
                    handle, device, offset, _size, _pid = unpack_ipc_desc(d)
                    if same_process:
                        reg = _Region(length, addr, device, writable)  # our own allocation: no IPC
                    else:
                        key = handle.hex()
                        ptr, refs = link.opened.get(key, (0, 0))
                        if not ptr:
                            try:
                                ptr = runtime().ipc_open(handle, device)
                            except CudaError as exc:
                                raise PeerUnreachableError(f"nvlink: {link.engine_id} buffer {addr:#x}: {exc}") from exc
                        link.opened[key] = (ptr, refs + 1)
                        reg = _Region(length, ptr + offset, device, writable, key)
                rc = int(
                    self._lib.map_add(
                        self._executor.handle, link.handle, addr, length, reg.lptr, reg.device, int(reg.writable)
                    )
                )
                if rc != 0:
                    self._release_ipc(link, reg.ipc_key)
                    raise PeerUnreachableError(
                        f"nvlink: mapping {link.engine_id} buffer {addr:#x} failed: {os.strerror(-rc)}"
                    )
                link.regions[addr] = reg

    def _release_ipc(self, link: _Link, key: str) -> None:
        if not key:
            return
        ptr, refs = link.opened.get(key, (0, 0))
        if refs <= 1:
            link.opened.pop(key, None)
            if ptr:
                try:
                    runtime().ipc_close(ptr)
                except CudaError as exc:
                    log.warning("nvlink: closing an IPC mapping of %s failed: %s", link.engine_id, exc)
        else:
            link.opened[key] = (ptr, refs - 1)

    def _drop_region(self, link: _Link, addr: int) -> None:
        assert self._lib is not None and self._executor is not None
        reg = link.regions.pop(addr)
        self._lib.map_remove(self._executor.handle, link.handle, addr)
        self._release_ipc(link, reg.ipc_key)

    def _teardown(self, link: _Link) -> None:
        assert self._lib is not None and self._executor is not None
        self._links.pop(link.engine_id, None)
        self._by_handle.pop(link.handle, None)
        self._lib.peer_remove(self._executor.handle, link.handle)
        with link.lock:
            link.regions.clear()
            for key in list(link.opened):
                link.opened[key] = (link.opened[key][0], 1)
                self._release_ipc(link, key)

    def disconnect(self, link: PeerLink) -> None:
        with self._lock:
            lk = self._by_handle.get(link.handle)
            if lk is not None:
                self._teardown(lk)

    # -- stream ordering: copies of an ordered batch wait for the caller's CUDA event on the GPU
    def order_batch(self, token: int, mark: devices.EventMark, deadline: float) -> bool:
        if self._executor is None or self._lib is None or getattr(mark.runtime, "name", "") != "cuda":
            return False
        event, seq = mark.native
        return int(self._lib.order_add(self._executor.handle, token, event, seq, 0)) == 0

    def order_done(self, token: int) -> None:
        if self._executor is not None and self._lib is not None:
            self._lib.order_remove(self._executor.handle, token)

    def close(self) -> None:
        with self._lock:
            if self._executor is None:
                return
            self._executor.close()  # drains: every issued copy completes before mappings close
            self._executor = None
            for lk in list(self._links.values()):
                self._links.pop(lk.engine_id, None)
                with lk.lock:
                    for key in list(lk.opened):
                        lk.opened[key] = (lk.opened[key][0], 1)
                        self._release_ipc(lk, key)
            self._by_handle.clear()


@hookimpl
def tent_register_transports(registry: Any) -> None:
    registry.add(
        "nvlink",
        NvlinkTransport,
        abi_version=EXECUTOR_ABI_VERSION,
        version=__version__,
        description="same-host GPU copies: CUDA IPC handles + cudaMemcpyAsync (CUDA loaded at runtime)",
    )
