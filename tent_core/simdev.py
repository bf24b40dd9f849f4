"""A simulated accelerator, so the core's device paths run end to end on machines without one.

Memory kind `MemoryKind.SIM` behaves like device memory where it matters for the engine:

* its addresses (`SIM_BASE` and above) mean nothing to host code: a host transport handed one
  fails (the planner must route around it), and `numpy` cannot view it;
* only the transport `simdev` moves it: host <-> device and device <-> device in this process
  and, through "IPC" (a peer maps the owner's memfd arena, as CUDA IPC maps an allocation), with
  other processes of the same host. Config `ipc = false` makes a process's device memory
  unreachable from other processes, as a GPU on another host is;
* copies, kernels (`fill`, `checksum`) and event records run on streams, in order, on worker
  threads; a request can wait for a stream or an event and signal an event (`tent_core.ordering`),
  and the simdev executor waits for events on its own streams, like nvlink with CUDA streams.

The compiled half is ``tent_core._simdev`` (`tent_core/_native/simdev.c`). The transport is not an
installed plugin: an engine gets it through ``Engine(plugins=[SimDevicePlugin()])``. Everything
here is for tests and benchmarks of the orchestrator; it is never evidence that a real fabric works.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from . import devices
from .errors import InvalidRequestError, PeerUnreachableError
from .executor import EXECUTOR_ABI_VERSION, Executor, PluginLibrary
from .plugin_spec import hookimpl
from .transport import AccessControl, Transport, TransportContext
from .types import Availability, BufferInfo, CapabilityProfile, MemoryKind, PeerInfo, PeerLink, Permission, RailInfo

log = logging.getLogger(__name__)

SIM_BASE = 1 << 60
ARENA_STRIDE = 1 << 44
DEFAULT_ARENA_BYTES = 16 << 30  # virtual; pages exist only once touched
_ALIGN = 256
_PAGE = mmap.PAGESIZE

u64, i32, vp = ctypes.c_uint64, ctypes.c_int32, ctypes.c_void_p
_P64, _P32 = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int32)


class _Lib(PluginLibrary):
    PREFIX = "tent_"
    PROTOTYPES: ClassVar[dict[str, tuple[Any, list[Any]]]] = {
        "sim_arena_add": (i32, [u64, u64, u64]),
        "sim_arena_remove": (i32, [u64]),
        "sim_event_create": (u64, []),
        "sim_event_destroy": (None, [u64]),
        "sim_event_target": (u64, [u64]),
        "sim_event_query": (i32, [u64]),
        "sim_event_passed": (i32, [u64, u64]),
        "sim_event_wait_seq": (i32, [u64, u64, u64]),
        "sim_event_synchronize": (i32, [u64, u64]),
        "sim_event_record": (u64, [u64, u64]),
        "sim_gate_create": (u64, []),
        "sim_gate_open": (None, [u64]),
        "sim_stream_create": (u64, [u64]),
        "sim_stream_destroy": (None, [u64]),
        "sim_stream_release": (None, [u64]),
        "sim_stream_synchronize": (i32, [u64, u64]),
        "sim_stream_wait_event": (i32, [u64, u64]),
        "sim_memcpy_async": (i32, [u64, u64, u64, u64, _P32]),
        "sim_memcpy": (i32, [u64, u64, u64]),
        "sim_launch_fill": (i32, [u64, u64, u64, u64, _P32]),
        "sim_launch_wsum": (i32, [u64, u64, u64, u64, _P64, _P32]),
        "sim_launch_sleep": (i32, [u64, u64]),
        "sim_launch_gate": (i32, [u64, u64, u64]),
        "sim_wsum_host": (u64, [u64, u64, u64]),
        "sim_now_ns": (u64, []),
        "sim_live_events": (ctypes.c_int64, []),
        "simx_peer_add": (u64, [vp]),
        "simx_peer_remove": (i32, [vp, u64]),
        "simx_map_add": (i32, [vp, u64, u64, u64, u64, i32]),
        "simx_map_remove": (i32, [vp, u64, u64]),
        "simx_order_add": (i32, [vp, u64, u64, u64, u64]),
        "simx_order_remove": (i32, [vp, u64]),
        "simx_stats": (None, [vp, _P64]),
    }


@functools.cache
def lib() -> Any:
    return _Lib(Path(__file__).parent, "_simdev")


def live_events() -> int:
    """Simulated events not freed yet: handles not destroyed, or still named by queued stream work
    or an executor's order table (an event outlives its handle until that work ran)."""
    return int(lib().sim_live_events())


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"simdev: {what} failed: {os.strerror(-rc) if rc < 0 else rc}")


# ---------------------------------------------------------------------------- memory


class SimDevice:
    """This process's simulated device 0: one memfd arena and a first-fit allocator over it."""

    _instance: ClassVar[SimDevice | None] = None
    _instance_lock = threading.Lock()

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity or int(os.environ.get("TENT_SIMDEV_BYTES", DEFAULT_ARENA_BYTES))
        self.index = 0
        self.base = SIM_BASE + self.index * ARENA_STRIDE
        self.fd = os.memfd_create("tent-simdev", 0)  # not CLOEXEC-relevant: peers open it through /proc
        os.ftruncate(self.fd, self.capacity)
        self._map = mmap.mmap(self.fd, self.capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._host = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        _check(lib().sim_arena_add(self.base, self.capacity, self._host), "arena_add")
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, self.capacity)]  # (offset, length), sorted
        self._used: dict[int, int] = {}

    @classmethod
    def get(cls) -> SimDevice:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = SimDevice()
            return cls._instance

    def alloc(self, nbytes: int) -> int:
        """A device address of `nbytes` (>= 1) zeroed bytes."""
        if nbytes <= 0:
            raise InvalidRequestError(f"device allocation must be > 0 bytes, got {nbytes}")
        want = (nbytes + _ALIGN - 1) & ~(_ALIGN - 1)
        with self._lock:
            for i, (off, ln) in enumerate(self._free):
                if ln >= want:
                    if ln == want:
                        del self._free[i]
                    else:
                        self._free[i] = (off + want, ln - want)
                    self._used[off] = want
                    break
            else:
                raise MemoryError(f"simulated device out of memory ({nbytes} bytes asked)")
        self._zero(off, want)
        return self.base + off

    def _zero(self, off: int, n: int) -> None:
        lo, hi = (off + _PAGE - 1) // _PAGE * _PAGE, (off + n) // _PAGE * _PAGE
        if hi - lo >= 1 << 20:  # give whole pages back to the kernel: they read as zero again
            self._map.madvise(mmap.MADV_REMOVE, lo, hi - lo)
            ctypes.memset(self._host + off, 0, lo - off)
            ctypes.memset(self._host + hi, 0, off + n - hi)
        else:
            ctypes.memset(self._host + off, 0, n)

    def free(self, addr: int) -> None:
        off = addr - self.base
        with self._lock:
            n = self._used.pop(off, None)
            if n is None:
                raise InvalidRequestError(f"{addr:#x} is not an allocation of the simulated device")
            self._free.append((off, n))
            self._free.sort()
            merged: list[tuple[int, int]] = []
            for o, ln in self._free:
                if merged and merged[-1][0] + merged[-1][1] == o:
                    merged[-1] = (merged[-1][0], merged[-1][1] + ln)
                else:
                    merged.append((o, ln))
            self._free = merged

    def host_view(self, addr: int, n: int) -> int:
        """The host address behind device range [addr, addr+n) (the runtime's private mapping)."""
        off = addr - self.base
        if off < 0 or n < 0 or off + n > self.capacity:
            raise InvalidRequestError(f"[{addr:#x}, +{n}) is not simulated device memory of this process")
        return self._host + off

    def contains(self, addr: int, n: int = 0) -> bool:
        return self.base <= addr and addr + n <= self.base + self.capacity

    def ipc_descriptor(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "fd": self.fd, "base": self.base, "size": self.capacity}


class SimArray:
    """Device memory of the simulated accelerator, as an application holds it (a CuPy array's
    stand-in). Registers with ``engine.register(arr)`` through ``__tent_memory__``."""

    def __init__(self, nbytes: int, device: SimDevice | None = None) -> None:
        self.device = device or SimDevice.get()
        self.nbytes = int(nbytes)
        self.ptr = self.device.alloc(self.nbytes)
        self._finalizer = weakref.finalize(self, self.device.free, self.ptr)

    @property
    def __tent_memory__(self) -> dict[str, Any]:
        return {"addr": self.ptr, "length": self.nbytes, "kind": MemoryKind.SIM.value, "device": self.device.index}

    def free(self) -> None:
        self._finalizer()

    def upload(self, data: np.ndarray | bytes, offset: int = 0) -> None:
        """Synchronous host -> device copy."""
        src = np.ascontiguousarray(np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data).reshape(-1).view(np.uint8)
        if offset < 0 or offset + src.size > self.nbytes:
            raise InvalidRequestError(f"upload of {src.size} bytes at {offset} exceeds the {self.nbytes}-byte array")
        _check(lib().sim_memcpy(self.ptr + offset, src.ctypes.data, src.size), "memcpy")

    def download(self, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Synchronous device -> host copy (a new numpy array)."""
        n = self.nbytes - offset if length is None else length
        if offset < 0 or n < 0 or offset + n > self.nbytes:
            raise InvalidRequestError(f"download [{offset}, {offset + n}) exceeds the {self.nbytes}-byte array")
        out = np.empty(n, np.uint8)
        if n:
            _check(lib().sim_memcpy(out.ctypes.data, self.ptr + offset, n), "memcpy")
        return out

    def __repr__(self) -> str:
        return f"<SimArray {self.nbytes} bytes at {self.ptr:#x}>"


class SimEvent:
    def __init__(self) -> None:
        self.handle = int(lib().sim_event_create())
        if not self.handle:
            raise MemoryError("simdev: event")
        self._finalizer = weakref.finalize(self, lib().sim_event_destroy, self.handle)

    def record(self, stream: SimStream) -> int:
        seq = int(lib().sim_event_record(self.handle, stream.handle))
        if not seq:
            raise MemoryError("simdev: event record")
        return seq

    def query(self) -> bool:
        return bool(lib().sim_event_query(self.handle))

    def synchronize(self, timeout: float = 30.0) -> bool:
        return bool(lib().sim_event_synchronize(self.handle, int(timeout * 1e9)))

    def close(self) -> None:
        self._finalizer()


_REAPER_LOCK = threading.Lock()
_REAPER: list[Any] = []  # [queue.SimpleQueue] once started


def _destroy_stream_later(handle: int, status: ctypes.c_int32) -> None:
    """A garbage-collected stream's finalizer: destroying a stream joins its thread after its queued
    work, which may wait on whatever thread the collector happened to run on (the engine's progress
    thread, say): a deadlock. A daemon thread destroys it instead; it holds `status` (which queued
    work writes) until then."""
    import queue

    with _REAPER_LOCK:
        if not _REAPER:
            q: queue.SimpleQueue[tuple[int, ctypes.c_int32]] = queue.SimpleQueue()

            def reap() -> None:
                while True:
                    h, _st = q.get()
                    lib().sim_stream_destroy(h)

            threading.Thread(target=reap, name="simdev-reaper", daemon=True).start()
            _REAPER.append(q)
    _REAPER[0].put((handle, status))


class SimStream:
    """An in-order queue of device work run by its own thread."""

    def __init__(self, copy_ns_per_mib: int = 0) -> None:
        self.handle = int(lib().sim_stream_create(copy_ns_per_mib))
        if not self.handle:
            raise MemoryError("simdev: stream")
        self._status = ctypes.c_int32(0)
        self._finalizer = weakref.finalize(self, _destroy_stream_later, self.handle, self._status)

    def _ok(self, rc: int, what: str) -> None:
        _check(rc, what)

    def fill(self, arr: SimArray, seed: int, offset: int = 0, length: int | None = None) -> None:
        """A kernel writing tent_core.testing.pattern(length, seed) into arr[offset:offset+length]."""
        n = arr.nbytes - offset if length is None else length
        self._ok(lib().sim_launch_fill(self.handle, arr.ptr + offset, n, seed, ctypes.byref(self._status)), "fill")

    def sleep(self, seconds: float) -> None:
        """A kernel that takes `seconds` (a slow producer)."""
        self._ok(lib().sim_launch_sleep(self.handle, int(seconds * 1e6)), "sleep")

    def copy(self, dst: int, src: int, n: int) -> None:
        self._ok(lib().sim_memcpy_async(self.handle, dst, src, n, ctypes.byref(self._status)), "copy")

    def wait_event(self, event: SimEvent) -> None:
        self._ok(lib().sim_stream_wait_event(self.handle, event.handle), "wait_event")

    def record(self, event: SimEvent | None = None) -> SimEvent:
        ev = event or SimEvent()
        ev.record(self)
        return ev

    def synchronize(self, timeout: float = 30.0) -> None:
        if not lib().sim_stream_synchronize(self.handle, int(timeout * 1e9)):
            raise TimeoutError(f"simulated stream not idle within {timeout}s")
        if self._status.value:
            raise RuntimeError(f"simdev: a copy or kernel on this stream failed: {os.strerror(-self._status.value)}")

    def close(self) -> None:
        if self._finalizer.detach() is not None:  # an explicit close waits for the queued work here
            lib().sim_stream_destroy(self.handle)


# ---------------------------------------------------------------------------- runtime


class _SimMark(devices.EventMark):
    def __init__(self, runtime: SimRuntime, event: int, seq: int, owned: SimEvent | None) -> None:
        self.runtime = runtime
        self.event, self.seq = event, seq
        self._owned = owned  # internal event recorded on a user stream: keep it alive

    def query(self) -> bool:
        return bool(lib().sim_event_passed(self.event, self.seq))

    def wait(self, timeout: float) -> bool:
        return bool(lib().sim_event_wait_seq(self.event, self.seq, max(1, int(timeout * 1e9))))

    @property
    def native(self) -> tuple[int, int]:
        return self.event, self.seq

    def release(self) -> None:
        self._owned = None


class _SimGate(devices.Gate):
    def __init__(self, gate: int) -> None:
        self.gate = gate
        self._opened = False
        self._lock = threading.Lock()

    def open(self) -> None:
        with self._lock:
            if self._opened:
                return
            self._opened = True
        lib().sim_gate_open(self.gate)  # and lets go of it: freed once its stream passed it


class SimRuntime(devices.DeviceRuntime):
    """The device runtime of MemoryKind.SIM (tent_core.devices)."""

    name = "simdev"
    kinds = frozenset({MemoryKind.SIM})

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, (SimStream, SimEvent))

    def mark_stream(self, stream: Any) -> devices.EventMark:
        if not isinstance(stream, SimStream):
            raise InvalidRequestError(f"not a simulated stream: {stream!r}")
        ev = SimEvent()
        seq = ev.record(stream)
        return _SimMark(self, ev.handle, seq, ev)

    def mark_event(self, event: Any) -> devices.EventMark:
        if not isinstance(event, SimEvent):
            raise InvalidRequestError(f"not a simulated event: {event!r}")
        # the mark holds the application's event: its handle stays valid while the engine polls it
        return _SimMark(self, event.handle, int(lib().sim_event_target(event.handle)), event)

    def join(self, marks: list[devices.EventMark]) -> devices.EventMark:
        s = SimStream()
        for m in marks:
            assert isinstance(m, _SimMark)
            if m.seq:
                _check(lib().sim_stream_wait_event(s.handle, m.event), "wait_event")
        ev = SimEvent()
        seq = ev.record(s)
        mark = _SimMark(self, ev.handle, seq, ev)
        mark._keep = (s, marks)  # type: ignore[attr-defined]
        return mark

    def arm_signal(self, event: Any, deadline: float) -> devices.Gate:
        """The event is recorded on a stream of its own behind a gate (gates of different batches
        never wait for each other); the stream goes away by itself once the gate opened."""
        if not isinstance(event, SimEvent):
            raise InvalidRequestError(f"not a simulated event: {event!r}")
        g = int(lib().sim_gate_create())
        if not g:
            raise MemoryError("simdev: gate")
        h = int(lib().sim_stream_create(0))
        if not h:
            lib().sim_gate_open(g)
            raise MemoryError("simdev: stream")
        dl = int(lib().sim_now_ns()) + max(0, int((deadline - time.monotonic()) * 1e9)) + 5_000_000_000
        _check(lib().sim_launch_gate(h, g, dl), "gate")
        recorded = lib().sim_event_record(event.handle, h)
        lib().sim_stream_release(h)
        if not recorded:
            lib().sim_gate_open(g)
            raise MemoryError("simdev: event record")
        return _SimGate(g)

    def checksum(self, addr: int, length: int, first_word: int = 0) -> int:
        out = ctypes.c_uint64(0)
        status = ctypes.c_int32(0)
        s = SimStream()
        try:
            _check(lib().sim_launch_wsum(s.handle, addr, length, first_word, ctypes.byref(out), ctypes.byref(status)), "wsum")
            s.synchronize()
        finally:
            s.close()
        if status.value:
            raise InvalidRequestError(f"[{addr:#x}, +{length}) is not device memory of this process")
        return int(out.value)

    def copy(self, dst: int, src: int, length: int) -> None:
        _check(lib().sim_memcpy(dst, src, length), "memcpy")

    def pin(self, addr: int, length: int) -> bool:
        return True  # host memory needs no page-locking for the simulated device


_runtime: SimRuntime | None = None
_runtime_lock = threading.Lock()


def runtime() -> SimRuntime:
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = SimRuntime()
            devices.register(_runtime)
        return _runtime


def wsum64_device(arr: SimArray, offset: int = 0, length: int | None = None) -> int:
    """wsum64 partial sum of arr[offset:offset+length] computed by a device kernel."""
    n = arr.nbytes - offset if length is None else length
    if offset % 8:
        raise InvalidRequestError("wsum64 chunks start at multiples of 8 bytes")
    return runtime().checksum(arr.ptr + offset, n, offset // 8)


# ---------------------------------------------------------------------------- transport


@dataclass
class _Link:
    engine_id: str
    pid: int
    handle: int
    regions: dict[int, tuple[int, int]] = field(default_factory=dict)  # rbase -> (length, map key)
    maps: dict[int, tuple[mmap.mmap, int, int]] = field(default_factory=dict)  # key -> (mapping, host addr, refs)
    lock: threading.Lock = field(default_factory=threading.Lock)


class SimDeviceTransport(Transport):
    """Moves MemoryKind.SIM memory: host <-> device and device <-> device, in this process and with
    same-host processes (their arenas mapped, like CUDA IPC), never across hosts."""

    name = "simdev"
    version = "0.1.0"
    config_keys: ClassVar[dict[str, Any]] = {
        "streams": 2,  # executor streams (worker threads)
        "ipc": True,  # other processes of this host may reach this process's device memory
        "copy_ns_per_mib": 0,  # emulated copy cost per MiB on top of memcpy (benchmarks)
        "bandwidth_gbps": 0.0,  # advertised rate for the path planner (0: unknown)
        # share READ-only device memory with other processes (off: like nvlink, such buffers are local
        # to their process and peers reach them through its target-side staging)
        "share_read_only": True,
    }

    def __init__(self) -> None:
        self._executor: Executor | None = None
        self._cfg: dict[str, Any] = dict(self.config_keys)
        self._host_id = ""
        self._links: dict[str, _Link] = {}
        self._by_handle: dict[int, _Link] = {}
        self._lock = threading.RLock()

    def probe(self) -> Availability:
        try:
            lib()
        except Exception as exc:
            return Availability.unavailable(f"simdev library unusable: {exc}")
        return Availability(True, "simulated device (tests)")

    def capabilities(self) -> CapabilityProfile:
        return CapabilityProfile(
            kind_pairs=frozenset(
                {(MemoryKind.HOST, MemoryKind.SIM), (MemoryKind.SIM, MemoryKind.HOST), (MemoryKind.SIM, MemoryKind.SIM)}
            ),
            same_host=True,
            cross_host=False,
            rank=5,
            bandwidth_gbps=float(self._cfg["bandwidth_gbps"]),
        )

    def start(self, ctx: TransportContext) -> None:
        self._cfg = self.resolve_config(ctx.config)
        self._host_id = ctx.host_id
        runtime()
        SimDevice.get()
        self._executor = lib().library.create(
            {"streams": int(self._cfg["streams"]), "copy_ns_per_mib": int(self._cfg["copy_ns_per_mib"])}
        )

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            raise RuntimeError("simdev transport not started")
        return self._executor

    def stats(self) -> dict[str, int]:
        out = (ctypes.c_uint64 * 3)()
        lib().simx_stats(self.executor.handle, out)
        return dict(zip(("slices", "bytes", "ordered_waits"), (int(x) for x in out), strict=True))

    def local_descriptor(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host_id": self._host_id, "ipc": bool(self._cfg["ipc"])}

    def export_buffer(self, buf: BufferInfo) -> dict[str, Any] | None:
        if buf.kind == MemoryKind.HOST:
            return {"host": True, "pid": os.getpid()}  # reachable by this process's own engine only
        if buf.kind != MemoryKind.SIM:
            return None
        dev = SimDevice.get()
        if not dev.contains(buf.addr, buf.length):
            raise InvalidRequestError(f"[{buf.addr:#x}, +{buf.length}) is not simulated device memory of this process")
        if not self._cfg["share_read_only"] and not Permission(buf.perm) & Permission.WRITE:
            return {"local": True, "pid": os.getpid()}
        return dev.ipc_descriptor()

    def access_control(self, link: PeerLink) -> AccessControl:
        return AccessControl(revocation=False, reason="a peer's mapping of a device arena stays until it unmaps it")

    def can_reach(self, peer: PeerInfo) -> str | None:
        d = peer.transports.get(self.name)
        if d is None:
            return f"peer does not offer {self.name}"
        if peer.host_id != self._host_id:
            return f"peer {peer.engine_id} is on another host"
        if int(d.get("pid", peer.pid)) != os.getpid() and not (d.get("ipc") and self._cfg["ipc"]):
            return "device memory IPC is disabled (config ipc = false) on one side"
        return None

    def connect(self, peer: PeerInfo, remote_buffers: list[dict[str, Any]]) -> PeerLink:
        if self._executor is None:
            raise RuntimeError("simdev transport not started")
        why = self.can_reach(peer)
        if why:
            raise PeerUnreachableError(f"simdev: cannot reach {peer.engine_id}: {why}")
        pid = int(peer.transports[self.name].get("pid", peer.pid))
        with self._lock:
            link = self._links.get(peer.engine_id)
            if link is not None and link.pid != pid:
                self._teardown(link)
                link = None
            if link is None:
                h = int(lib().simx_peer_add(self._executor.handle))
                if not h:
                    raise PeerUnreachableError(f"simdev: executor could not add {peer.engine_id}")
                link = self._links[peer.engine_id] = _Link(peer.engine_id, pid, h)
                self._by_handle[h] = link
        self._sync(link, remote_buffers)
        return PeerLink(handle=link.handle, rails=[RailInfo(0, "simdev")])

    def _sync(self, link: _Link, remote_buffers: list[dict[str, Any]]) -> None:
        own = link.pid == os.getpid()
        wanted: dict[int, tuple[int, str, dict[str, Any], bool]] = {}
        for b in remote_buffers:
            d = (b.get("desc") or {}).get(self.name)
            kind = str(b.get("kind", ""))
            if d is None or kind not in (MemoryKind.SIM.value, MemoryKind.HOST.value):
                continue
            if (kind == MemoryKind.HOST.value or d.get("local")) and not own:
                continue
            wanted[int(b["addr"])] = (int(b["length"]), kind, d, bool(int(b.get("perm", 3)) & Permission.WRITE))
        ex = self.executor.handle
        with link.lock:
            for rbase in [a for a, (ln, _) in link.regions.items() if a not in wanted or wanted[a][0] != ln]:
                self._drop_region(link, rbase)
            for rbase, (length, kind, d, writable) in wanted.items():
                if rbase in link.regions:
                    continue
                if own:
                    lptr = rbase if kind == MemoryKind.HOST.value else SimDevice.get().host_view(rbase, length)
                    key = 0
                else:
                    lptr, key = self._map_remote(link, d, rbase, length, writable)
                rc = int(lib().simx_map_add(ex, link.handle, rbase, length, lptr, int(writable)))
                if rc != 0:
                    self._unref(link, key)
                    raise PeerUnreachableError(f"simdev: mapping {link.engine_id} buffer {rbase:#x}: {os.strerror(-rc)}")
                link.regions[rbase] = (length, key)

    def _map_remote(self, link: _Link, d: dict[str, Any], rbase: int, length: int, writable: bool) -> tuple[int, int]:
        """Map the pages of the peer's arena that hold [rbase, rbase+length): only the registered
        range, read-only when the buffer is (the kernel refuses writes through that mapping)."""
        base, fd, size = int(d["base"]), int(d["fd"]), int(d["size"])
        off = rbase - base
        if off < 0 or length < 0 or off + length > size:
            raise PeerUnreachableError(f"simdev: {link.engine_id} advertises {rbase:#x} outside its arena")
        lo = off // _PAGE * _PAGE
        hi = max(lo + _PAGE, (off + length + _PAGE - 1) // _PAGE * _PAGE)
        try:
            rfd = os.open(f"/proc/{link.pid}/fd/{fd}", os.O_RDWR if writable else os.O_RDONLY)
        except OSError as exc:
            raise PeerUnreachableError(f"simdev: cannot open {link.engine_id}'s device arena: {exc}") from exc
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(rfd, hi - lo, mmap.MAP_SHARED, prot, offset=lo)
        finally:
            os.close(rfd)
        view = np.frombuffer(mm, dtype=np.uint8)
        host = int(view.__array_interface__["data"][0])
        del view
        link.maps[rbase] = (mm, host, 1)
        return host + (off - lo), rbase

    def _unref(self, link: _Link, key: int) -> None:
        ent = link.maps.pop(key, None)
        if ent is not None:
            ent[0].close()

    def _drop_region(self, link: _Link, rbase: int) -> None:
        _, key = link.regions.pop(rbase)
        lib().simx_map_remove(self.executor.handle, link.handle, rbase)  # drains slices through it
        self._unref(link, key)

    def _teardown(self, link: _Link) -> None:
        self._links.pop(link.engine_id, None)
        self._by_handle.pop(link.handle, None)
        if self._executor is not None:
            lib().simx_peer_remove(self._executor.handle, link.handle)
        with link.lock:
            link.regions.clear()
            for mm, _, _ in link.maps.values():
                mm.close()
            link.maps.clear()

    def disconnect(self, link: PeerLink) -> None:
        with self._lock:
            lk = self._by_handle.get(link.handle)
            if lk is not None:
                self._teardown(lk)

    # stream ordering: slices of an ordered batch wait for the event on the executor's streams
    def order_batch(self, token: int, mark: devices.EventMark, deadline: float) -> bool:
        if not isinstance(mark, _SimMark) or self._executor is None:
            return False
        ev, seq = mark.native
        dl = int(lib().sim_now_ns()) + max(0, int((deadline - time.monotonic()) * 1e9))
        return int(lib().simx_order_add(self._executor.handle, token, ev, seq, dl)) == 0

    def order_done(self, token: int) -> None:
        if self._executor is not None:
            lib().simx_order_remove(self._executor.handle, token)

    def close(self) -> None:
        with self._lock:
            if self._executor is None:
                return
            self._executor.close()  # runs what is queued: every slice reported once
            self._executor = None
            for lk in list(self._links.values()):
                with lk.lock:
                    for mm, _, _ in lk.maps.values():
                        mm.close()
                    lk.maps.clear()
            self._links.clear()
            self._by_handle.clear()


class SimDevicePlugin:
    """A pluggy plugin object registering the `simdev` transport: ``Engine(plugins=[SimDevicePlugin()])``."""

    __name__ = "tent-simdev"

    @hookimpl
    def tent_register_transports(self, registry: Any) -> None:
        registry.add("simdev", SimDeviceTransport, abi_version=EXECUTOR_ABI_VERSION, version="0.1.0",
                     description="simulated accelerator memory (tests)")


__all__ = [
    "SIM_BASE",
    "SimArray",
    "SimDevice",
    "SimDevicePlugin",
    "SimDeviceTransport",
    "SimEvent",
    "SimRuntime",
    "SimStream",
    "runtime",
    "wsum64_device",
]
