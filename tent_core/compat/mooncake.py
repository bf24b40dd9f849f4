"""Mooncake Transfer Engine's Python API (``mooncake.engine.TransferEngine``) on top of TENT.

Code written for Mooncake (SGLang's and vLLM's disaggregation connectors, checkpoint-engine, Mooncake's
own tests) keeps its calls, arguments and return conventions:

- ``initialize(local_hostname, metadata_server, protocol, device_name)`` with ``metadata_server``
  ``"P2PHANDSHAKE"`` (no metadata service: the server name becomes ``host:<rpc port>``), or an etcd
  address (``127.0.0.1:2379``, ``etcd://host:port``) through which every peer is found by its fixed
  server name (``local_hostname``, e.g. ``127.0.0.1:12345``). ``protocol`` (``tcp``, ``rdma``, ...) is
  a hint as in Mooncake's default build: the engine still picks the transport per request (a named
  transport that is unavailable here is logged loudly); ``MC_FORCE_TCP`` restricts it to TCP.
- memory is named by raw virtual addresses inside registered memory, on both sides: a remote address
  is translated to the peer's segment and offset from the buffers the peer published;
- status codes: 0 on success, Mooncake's negative error codes (``ERR_*`` below) on failure, batch ids
  that are 0 on failure, ``transfer_check_status`` 1 done / 0 pending / -1 failed / -2 timed out.

Every buffer registered through the facade lives in one engine segment, ``mooncake``. Transfers run
through the ordinary ``Engine.submit`` path, so rails, spraying, retries and failover apply. What has
no meaning here returns Mooncake's error code and logs why (notifications: ``ERR_NOT_IMPLEMENTED``;
redis/http metadata: initialize fails); nothing succeeds silently.
"""

from __future__ import annotations

import bisect
import ctypes
import enum
import itertools
import json
import logging
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from .. import errors
from ..engine import Engine, LocalBuffer, Request
from ..types import MemoryKind, OpCode

log = logging.getLogger(__name__)

# Mooncake's error codes (mooncake-transfer-engine/include/error.h)
ERR_INVALID_ARGUMENT = -1
ERR_TOO_MANY_REQUESTS = -2
ERR_ADDRESS_NOT_REGISTERED = -3
ERR_BATCH_BUSY = -4
ERR_DEVICE_NOT_FOUND = -6
ERR_ADDRESS_OVERLAPPED = -7
ERR_DNS = -101
ERR_SOCKET = -102
ERR_MALFORMED_JSON = -103
ERR_REJECT_HANDSHAKE = -104
ERR_METADATA = -200
ERR_ENDPOINT = -201
ERR_CONTEXT = -202
ERR_NUMA = -300
ERR_CLOCK = -301
ERR_MEMORY = -302
ERR_NOT_IMPLEMENTED = -303

P2PHANDSHAKE = "P2PHANDSHAKE"
SEGMENT = "mooncake"  # the engine segment holding every buffer registered through the facade
DEFAULT_HANDSHAKE_PORT = 12001  # Mooncake's port for a server name given without one
WILDCARD_LOCATION = "*"
MAX_OUTSTANDING_BATCHES = 65536
DEFAULT_TIMEOUT_S = 30.0  # MC_TRANSFER_TIMEOUT (at least 5 s), plus 1 s per GB moved, as Mooncake

# Managed buffers: power-of-two classes from 8 KiB to 4 MiB carved (buddy-split) out of 64 MiB arenas
# registered once; larger requests get their own registration. Mooncake carves 2 GiB arenas.
SLAB_MIN = 8 << 10
SLAB_CLASSES = 10
SLAB_MAX = SLAB_MIN << (SLAB_CLASSES - 1)
ARENA_BYTES = 64 << 20

# protocol -> the TENT transport that serves that fabric (the engine may still pick another one)
PROTOCOL_TRANSPORTS = {
    "tcp": "tcp",
    "rdma": "rdma",
    "efa": "rdma",
    "cxi": "rdma",
    "barex": "rdma",
    "nvlink": "nvlink",
    "nvlink_intra": "nvlink",
    "ascend": "ascend",
    "hccs": "ascend",
}


class TransferOpcode(enum.IntEnum):
    Read = 0
    Write = 1


class TransferNotify:
    """A notification attached to a transfer (accepted for signature compatibility)."""

    def __init__(self, name: str = "", msg: str = "") -> None:
        self.name = name
        self.msg = msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


class _Fail(Exception):
    """A call fails with this Mooncake status code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class _Regions:
    """Sorted, immutable view of registered buffers: lookups never take a lock. Rebuilt (and swapped in
    whole) on every registration change; `_last` remembers the last hit (transfers cluster on a few buffers)."""

    __slots__ = ("starts", "ends", "items", "_last")

    def __init__(self, starts: tuple[int, ...] = (), ends: tuple[int, ...] = (), items: tuple[Any, ...] = ()) -> None:
        self.starts = starts
        self.ends = ends
        self.items = items
        self._last = 0

    def find(self, addr: int, length: int) -> Any | None:
        i = self._last
        starts = self.starts
        if i < len(starts) and starts[i] <= addr and addr + length <= self.ends[i]:
            return self.items[i]
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0 or addr + length > self.ends[i]:
            return None
        self._last = i
        return self.items[i]

    def overlaps(self, addr: int, length: int) -> bool:
        i = bisect.bisect_right(self.starts, addr + max(length, 1) - 1) - 1
        return i >= 0 and self.ends[i] > addr

    @classmethod
    def build(cls, entries: list[tuple[int, int, Any]]) -> _Regions:
        entries = sorted(entries, key=lambda e: e[0])
        return cls(tuple(e[0] for e in entries), tuple(e[0] + e[1] for e in entries), tuple(e[2] for e in entries))


@dataclass(frozen=True)
class _RemoteBuf:
    addr: int
    length: int
    offset: int


@dataclass
class _Target:
    name: str
    remote: str  # "name/mooncake"
    regions: _Regions
    first_addr: int


@dataclass
class _Batch:
    handle: Any  # tent_core BatchHandle
    target: str


class _DeviceRegion:
    """A raw CUDA range, described to Engine.register through __cuda_array_interface__."""

    def __init__(self, addr: int, length: int, device: int) -> None:
        self.__cuda_array_interface__ = {"data": (addr, False), "shape": (length,), "typestr": "|u1", "version": 3}
        self.device = SimpleNamespace(index=device)


_libcuda: Any = None


def _cuda_device_of(addr: int) -> int | None:
    """The CUDA device owning `addr`, or None (host memory, or no CUDA driver here)."""
    global _libcuda
    if _libcuda is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuInit.argtypes = [ctypes.c_uint]
            lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
            _libcuda = lib if lib.cuInit(0) == 0 else False
        except OSError:
            _libcuda = False
    if not _libcuda:
        return None
    memtype = ctypes.c_uint(0)
    if _libcuda.cuPointerGetAttribute(ctypes.byref(memtype), 2, addr) != 0 or memtype.value != 2:  # MEMORY_TYPE, DEVICE
        return None
    ordinal = ctypes.c_int(0)
    if _libcuda.cuPointerGetAttribute(ctypes.byref(ordinal), 9, addr) != 0:  # DEVICE_ORDINAL
        return None
    return ordinal.value


def _split_host_port(name: str) -> tuple[str, int | None]:
    """'h', 'h:p', '[v6]:p' -> (host, port or None)."""
    if name.startswith("["):
        host, _, rest = name[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    host, sep, port = name.rpartition(":")
    if sep and port.isdigit() and ":" not in host:
        return host, int(port)
    return name, None


def _slab_class(length: int) -> int:
    """Mooncake's findClassId: the smallest class holding `length`, -1 above the largest."""
    if length > SLAB_MAX:
        return -1
    ci = 0
    while (SLAB_MIN << ci) < length:
        ci += 1
    return ci


class TransferEngine:
    """Mooncake's ``TransferEngine`` Python class, served by a TENT engine."""

    TransferOpcode = TransferOpcode

    def __init__(self, config: dict[str, Any] | str | None = None) -> None:
        # `config`: optional TENT engine config (dict or TOML path; default $TENT_CONFIG). Mooncake's
        # constructor takes no argument, so existing code is unaffected.
        self._config_src = config
        self._engine: Engine | None = None
        self._name = ""
        self._metadata = ""
        self._lock = threading.RLock()
        self._local = _Regions()
        self._local_bufs: dict[int, LocalBuffer] = {}  # base address -> buffer (user-registered)
        self._targets: dict[str, _Target] = {}
        self._batches: dict[int, _Batch] = {}
        self._batch_ids = itertools.count(1)
        self._arenas: set[int] = set()  # base addresses of managed arenas
        self._free: list[list[int]] = [[] for _ in range(SLAB_CLASSES)]
        self._managed: dict[int, int] = {}  # outstanding managed buffer -> class (-1: own registration)
        self._warned: set[str] = set()
        try:
            t = float(os.environ.get("MC_TRANSFER_TIMEOUT", DEFAULT_TIMEOUT_S))
        except ValueError:
            t = DEFAULT_TIMEOUT_S
        self._timeout_s = max(5.0, t)

    # ------------------------------------------------------------------ setup
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        """Start the engine. Returns 0, or -1 (logged) when it cannot."""
        server = metadata_server or ""
        if server == P2PHANDSHAKE:
            return self.initialize_ext(local_hostname, server, protocol, device_name, "")
        scheme, sep, rest = server.partition("://")
        if sep:
            return self.initialize_ext(local_hostname, rest, protocol, device_name, scheme)
        return self.initialize_ext(local_hostname, server, protocol, device_name, "etcd")

    def initialize_ext(
        self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, metadata_type: str
    ) -> int:
        with self._lock:
            if self._engine is not None:
                log.error("initialize: this TransferEngine is already initialized as %s", self._name)
                return -1
            try:
                self._start(local_hostname or "", metadata_server or "", protocol or "", device_name or "", metadata_type or "")
            except _Fail as exc:
                log.error("initialize(%r, %r, %r): %s", local_hostname, metadata_server, protocol, exc)
                return -1
            except errors.TentError as exc:
                log.error("initialize(%r, %r, %r): %s: %s", local_hostname, metadata_server, protocol, type(exc).__name__, exc)
                return -1
        return 0

    def _start(self, local_hostname: str, server: str, protocol: str, device_name: str, metadata_type: str) -> None:
        if server == P2PHANDSHAKE:
            directory = ""
        else:
            conn = server if "://" in server else f"{metadata_type or 'etcd'}://{server}"
            scheme = conn.partition("://")[0]
            if scheme != "etcd":
                raise _Fail(ERR_METADATA, f"metadata {conn!r}: TENT supports P2PHANDSHAKE and etcd, not {scheme}")
            directory = conn
        host, port = _split_host_port(local_hostname)
        if not host:
            raise _Fail(ERR_INVALID_ARGUMENT, "local_hostname is empty")
        try:
            bind = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
        except OSError as exc:
            raise _Fail(ERR_DNS, f"cannot resolve local hostname {host!r}: {exc}") from exc
        config = self._base_config()
        bind_port = port if (port and os.environ.get("MC_LEGACY_RPC_PORT_BINDING")) else 0
        if directory:
            name = local_hostname if port is not None else f"{local_hostname}:{DEFAULT_HANDSHAKE_PORT}"
            config["directory"] = {**config.get("directory", {}), "url": directory, "name": name}
        elif bind_port:
            pass  # the server name is host:port, the port bound as given
        transports = ["tcp"] if os.environ.get("MC_FORCE_TCP") else None
        engine = Engine(config, host=bind, port=bind_port, transports=transports)
        if not engine.transports:
            engine.close()
            raise _Fail(ERR_DEVICE_NOT_FOUND, f"no transport is available here: {engine.availability}")
        self._engine = engine
        self._name = engine.engine_id
        self._metadata = directory or P2PHANDSHAKE
        wanted = PROTOCOL_TRANSPORTS.get(protocol.lower())
        if protocol and wanted is None:
            log.warning("protocol %r is not a fabric TENT knows; the engine picks among %s", protocol, sorted(engine.transports))
        elif wanted and wanted not in engine.transports:
            avail = engine.availability.get(wanted)
            why = avail.reason if avail is not None else "no such transport plugin installed"
            log.warning(
                "protocol %r asks for the %s transport, which is unavailable here (%s); TENT uses %s",
                protocol, wanted, why, sorted(engine.transports),
            )
        if device_name:
            log.info("device_name %r noted: TENT picks NICs per slice itself (restrict rails in the engine config)", device_name)
        log.info("Mooncake facade up as %s (metadata %s, transports %s)", self._name, self._metadata, sorted(engine.transports))

    def _base_config(self) -> dict[str, Any]:
        src = self._config_src if self._config_src is not None else os.environ.get("TENT_CONFIG")
        if src is None:
            return {}
        if isinstance(src, dict):
            return {k: (dict(v) if isinstance(v, dict) else v) for k, v in src.items()}
        try:
            import tomllib
        except ModuleNotFoundError:  # pragma: no cover
            import tomli as tomllib  # type: ignore[no-redef]
        with open(src, "rb") as fh:
            return tomllib.load(fh)

    @property
    def engine(self) -> Engine:
        """The TENT engine behind the facade (for code moving to the native API)."""
        if self._engine is None:
            raise errors.TentError("TransferEngine is not initialized")
        return self._engine

    @property
    def server_name(self) -> str:
        """This engine's name as peers address it (``host:port``)."""
        return self._name

    def get_rpc_port(self) -> int:
        if self._engine is None:
            log.error("get_rpc_port: not initialized")
            return -1
        return int(self._engine.control_endpoint.rpartition(":")[2])

    def close(self) -> None:
        """Stop the engine (Mooncake frees it in its destructor)."""
        with self._lock:
            eng, self._engine = self._engine, None
            self._batches.clear()
            self._targets.clear()
            self._local = _Regions()
            self._local_bufs.clear()
            self._arenas.clear()
            self._managed.clear()
            self._free = [[] for _ in range(SLAB_CLASSES)]
        if eng is not None:
            eng.close()

    # ------------------------------------------------------------------ memory
    def _rebuild_local(self) -> None:
        entries = [(b.addr, b.length, b) for b in self._local_bufs.values()]
        self._local = _Regions.build(entries)

    def _register(self, addr: int, length: int, location: str) -> LocalBuffer:
        eng = self._engine
        if eng is None:
            raise _Fail(ERR_INVALID_ARGUMENT, "not initialized")
        if not isinstance(addr, int) or addr <= 0 or not isinstance(length, int) or length <= 0:
            raise _Fail(ERR_INVALID_ARGUMENT, f"bad region addr={addr!r} length={length!r}")
        if self._local.overlaps(addr, length):
            raise _Fail(ERR_ADDRESS_OVERLAPPED, f"[{addr:#x}, +{length}) overlaps memory already registered")
        loc = (location or WILDCARD_LOCATION).strip()
        device: int | None
        if loc == WILDCARD_LOCATION:
            device = _cuda_device_of(addr)
        elif loc == "cpu" or loc.startswith("cpu:"):
            device = None
        elif loc.startswith("cuda:") and loc[5:].isdigit():
            device = int(loc[5:])
        else:
            raise _Fail(ERR_INVALID_ARGUMENT, f"location {location!r}: TENT serves host ('cpu:N', '*') and CUDA ('cuda:N') memory")
        obj: Any = (addr, length) if device is None else _DeviceRegion(addr, length, device)
        try:
            buf = eng.register(obj, segment=SEGMENT)
        except errors.TentError as exc:
            raise _Fail(ERR_INVALID_ARGUMENT, f"registering [{addr:#x}, +{length}) failed: {exc}") from exc
        self._local_bufs[addr] = buf
        self._rebuild_local()
        return buf

    def register_memory(self, buffer_addr: int, capacity: int, location: str = WILDCARD_LOCATION) -> int:
        with self._lock:
            try:
                self._register(buffer_addr, capacity, location)
            except _Fail as exc:
                log.error("register_memory: %s", exc)
                return exc.code
        return 0

    def unregister_memory(self, buffer_addr: int) -> int:
        with self._lock:
            code = self._unregister(buffer_addr)
        return code

    def _unregister(self, addr: int) -> int:
        if self._engine is None:
            log.error("unregister_memory: not initialized")
            return ERR_INVALID_ARGUMENT
        if addr in self._arenas:
            log.error("unregister_memory(%#x): managed memory is released with free_managed_buffer", addr)
            return ERR_INVALID_ARGUMENT
        buf = self._local_bufs.pop(addr, None)
        if buf is None:
            log.error("unregister_memory(%#x): not the start of a registered buffer", addr)
            return ERR_ADDRESS_NOT_REGISTERED
        self._rebuild_local()
        try:
            self._engine.unregister(buf)
        except errors.TentError as exc:
            log.error("unregister_memory(%#x): %s", addr, exc)
            return ERR_ADDRESS_NOT_REGISTERED
        return 0

    def batch_register_memory(
        self, buffer_addresses: Sequence[int], capacities: Sequence[int], location: str = WILDCARD_LOCATION
    ) -> int:
        """All or nothing: on an error the buffers this call registered are unregistered again."""
        if len(buffer_addresses) != len(capacities):
            log.error("batch_register_memory: %d addresses but %d capacities", len(buffer_addresses), len(capacities))
            return ERR_INVALID_ARGUMENT
        with self._lock:
            done: list[int] = []
            for addr, cap in zip(buffer_addresses, capacities, strict=True):
                try:
                    self._register(addr, cap, location)
                except _Fail as exc:
                    log.error("batch_register_memory: %s", exc)
                    for a in done:
                        self._unregister(a)
                    return exc.code
                done.append(addr)
        return 0

    def batch_unregister_memory(self, buffer_addresses: Sequence[int]) -> int:
        """Unregisters every address it can; returns the first error (0 if none)."""
        first = 0
        with self._lock:
            for addr in buffer_addresses:
                code = self._unregister(addr)
                first = first or code
        return first

    def allocate_managed_buffer(self, length: int) -> int:
        """Registered host memory from the facade's pool; 0 on failure."""
        with self._lock:
            try:
                return self._allocate(int(length))
            except _Fail as exc:
                log.error("allocate_managed_buffer(%d): %s", length, exc)
                return 0

    def _allocate(self, length: int) -> int:
        eng = self._engine
        if eng is None:
            raise _Fail(ERR_INVALID_ARGUMENT, "not initialized")
        if length < 0:
            raise _Fail(ERR_INVALID_ARGUMENT, "negative length")
        ci = _slab_class(length)
        if ci < 0:
            buf = self._allocate_region((length + 4095) & ~4095)
            self._managed[buf.addr] = -1
            return buf.addr
        addr = self._take(ci)
        self._managed[addr] = ci
        return addr

    def _allocate_region(self, size: int) -> LocalBuffer:
        eng = self._engine
        assert eng is not None
        try:
            buf = eng.allocate(size, segment=SEGMENT)
        except (errors.TentError, OSError) as exc:
            raise _Fail(ERR_MEMORY, f"allocating {size} bytes failed: {exc}") from exc
        self._local_bufs[buf.addr] = buf
        self._rebuild_local()
        return buf

    def _take(self, ci: int) -> int:
        free = self._free[ci]
        if free:
            return free.pop()
        if ci == SLAB_CLASSES - 1:
            arena = self._allocate_region(ARENA_BYTES)
            self._arenas.add(arena.addr)
            free.extend(range(arena.addr + ARENA_BYTES - SLAB_MAX, arena.addr - 1, -SLAB_MAX))
            return free.pop()
        block = self._take(ci + 1)  # split a block of the next class in two buddies
        free.append(block + (SLAB_MIN << ci))
        return block

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        with self._lock:
            ci = self._managed.get(buffer_addr)
            if ci is None:
                log.error("free_managed_buffer(%#x): not a buffer from allocate_managed_buffer", buffer_addr)
                return ERR_INVALID_ARGUMENT
            want = _slab_class(int(length))
            if want != ci:
                log.error("free_managed_buffer(%#x, %d): it was allocated with another length", buffer_addr, length)
                return ERR_INVALID_ARGUMENT
            del self._managed[buffer_addr]
            if ci >= 0:
                self._free[ci].append(buffer_addr)
                return 0
            return self._unregister(buffer_addr)

    def get_first_buffer_address(self, segment_name: str) -> int:
        """The first registered buffer of a server (this one or a peer); 0 if it has none."""
        eng = self._engine
        if eng is None:
            log.error("get_first_buffer_address: not initialized")
            return 0
        name = self._normalize(segment_name)
        if name == self._name:
            bufs = [b for b in self._local_bufs.values() if b.registered]
            return min(bufs, key=lambda b: b.offset).addr if bufs else 0
        try:
            target = self._load_target(name)
        except _Fail as exc:
            log.error("get_first_buffer_address(%r): %s", segment_name, exc)
            return 0
        return target.first_addr

    def write_bytes_to_buffer(self, dest_address: int, src_ptr: bytes | str, length: int) -> int:
        """Copy `length` bytes of `src_ptr` into registered local memory."""
        data = src_ptr.encode() if isinstance(src_ptr, str) else bytes(src_ptr)
        if length < 0 or len(data) < length:
            log.error("write_bytes_to_buffer: %d bytes requested, %d given", length, len(data))
            return ERR_INVALID_ARGUMENT
        buf = self._local.find(dest_address, length)
        if buf is None:
            log.error("write_bytes_to_buffer: [%#x, +%d) is not inside registered memory", dest_address, length)
            return ERR_ADDRESS_NOT_REGISTERED
        if buf.kind is not MemoryKind.HOST:
            log.error("write_bytes_to_buffer: %#x is device memory", dest_address)
            return ERR_INVALID_ARGUMENT
        ctypes.memmove(dest_address, data, length)
        return 0

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """`length` bytes of registered local host memory. Raises ValueError outside of it."""
        buf = self._local.find(source_address, length) if length >= 0 else None
        if buf is None or buf.kind is not MemoryKind.HOST:
            raise ValueError(f"read_bytes_from_buffer: [{source_address:#x}, +{length}) is not registered host memory")
        return ctypes.string_at(source_address, length)

    # ------------------------------------------------------------------ peers
    def _normalize(self, name: str) -> str:
        if self._metadata != P2PHANDSHAKE and _split_host_port(name)[1] is None:
            return f"{name}:{DEFAULT_HANDSHAKE_PORT}"
        return name

    def _load_target(self, name: str, refresh: bool = True) -> _Target:
        eng = self._engine
        assert eng is not None
        if self._metadata == P2PHANDSHAKE:
            host, port = _split_host_port(name)
            if port is None:
                raise _Fail(ERR_INVALID_ARGUMENT, f"segment name {name!r} must be host:port")
            try:  # fail at once, as Mooncake does, instead of at the control timeout
                socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise _Fail(ERR_DNS, f"cannot resolve {host!r}: {exc}") from exc
        try:
            bufs = eng.peer_buffers(name, refresh=refresh)
        except errors.TentError as exc:
            self._targets.pop(name, None)
            code = ERR_METADATA if self._metadata != P2PHANDSHAKE else ERR_SOCKET
            raise _Fail(code, f"cannot open segment {name!r}: {exc}") from exc
        mine = [b for b in bufs if b["segment"] == SEGMENT]
        entries = [(b["addr"], b["length"], _RemoteBuf(b["addr"], b["length"], b["offset"])) for b in mine]
        first = min(mine, key=lambda b: b["offset"])["addr"] if mine else 0
        target = _Target(name, f"{name}/{SEGMENT}", _Regions.build(entries), first)
        self._targets[name] = target
        return target

    def _target(self, name: str) -> _Target:
        t = self._targets.get(name)
        if t is None:
            t = self._load_target(self._normalize(name), refresh=False)
            self._targets[name] = t
        return t

    # ------------------------------------------------------------------ transfers
    def _submit(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_addresses: Sequence[int],
        lengths: Sequence[int],
        op: OpCode,
    ) -> Any:
        eng = self._engine
        if eng is None:
            raise _Fail(ERR_INVALID_ARGUMENT, "not initialized")
        n = len(buffers)
        if n != len(peer_addresses) or n != len(lengths):
            raise _Fail(ERR_INVALID_ARGUMENT, "buffers, peer_buffer_addresses and lengths have different sizes")
        target = self._target(target_hostname)
        local = self._local
        reqs = []
        total = 0
        refreshed = False
        for laddr, raddr, length in zip(buffers, peer_addresses, lengths, strict=True):
            if length < 0:
                raise _Fail(ERR_INVALID_ARGUMENT, f"negative length {length}")
            lb = local.find(laddr, length)
            if lb is None:
                raise _Fail(ERR_ADDRESS_NOT_REGISTERED, f"local [{laddr:#x}, +{length}) is not inside registered memory")
            rb = target.regions.find(raddr, length)
            if rb is None and not refreshed:
                target = self._load_target(target.name)  # the peer may have registered it since
                self._targets[target_hostname] = target
                refreshed = True
                rb = target.regions.find(raddr, length)
            if rb is None:
                raise _Fail(
                    ERR_ADDRESS_NOT_REGISTERED,
                    f"remote [{raddr:#x}, +{length}) is not inside memory {target.name} registered",
                )
            reqs.append(Request(op, lb, laddr - lb.addr, target.remote, rb.offset + (raddr - rb.addr), length))
            total += length
        try:
            return eng.submit(reqs, deadline=self._timeout_s + total / 1e9)
        except errors.TentError as exc:
            self._targets.pop(target_hostname, None)
            raise _Fail(ERR_INVALID_ARGUMENT, f"submit to {target_hostname}: {type(exc).__name__}: {exc}") from exc

    def _run_sync(
        self,
        what: str,
        target_hostname: str,
        buffers: Sequence[int],
        peer_addresses: Sequence[int],
        lengths: Sequence[int],
        op: OpCode,
        notify: TransferNotify | None,
    ) -> int:
        if notify is not None:
            log.error("%s: notifications are not supported by TENT's Mooncake facade (nothing transferred)", what)
            return ERR_NOT_IMPLEMENTED
        try:
            handle = self._submit(target_hostname, buffers, peer_addresses, lengths, op)
            handle.wait()
        except _Fail as exc:
            log.error("%s to %s: %s", what, target_hostname, exc)
            return -1
        except errors.TentError as exc:
            self._targets.pop(target_hostname, None)
            log.error("%s to %s failed: %s: %s", what, target_hostname, type(exc).__name__, exc)
            return -1
        return 0

    def _sync_one(self, what: str, target_hostname: str, laddr: int, raddr: int, length: int, op: OpCode) -> int:
        """One request: the common case, without the batch path's lists (same checks, same codes)."""
        t = self._targets.get(target_hostname)
        eng = self._engine
        if t is not None and eng is not None and length >= 0:
            lb = self._local.find(laddr, length)
            rb = t.regions.find(raddr, length)
            if lb is not None and rb is not None:
                try:
                    eng.submit(
                        Request(op, lb, laddr - lb.addr, t.remote, rb.offset + (raddr - rb.addr), length),
                        deadline=self._timeout_s + length / 1e9,
                    ).wait()
                except errors.TentError as exc:
                    self._targets.pop(target_hostname, None)
                    log.error("%s to %s failed: %s: %s", what, target_hostname, type(exc).__name__, exc)
                    return -1
                return 0
        return self._run_sync(what, target_hostname, (laddr,), (raddr,), (length,), op, None)

    def transfer_sync_write(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int:
        return self._sync_one("transfer_sync_write", target_hostname, buffer, peer_buffer_address, length, OpCode.WRITE)

    def transfer_sync_read(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int:
        return self._sync_one("transfer_sync_read", target_hostname, buffer, peer_buffer_address, length, OpCode.READ)

    def transfer_sync(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        opcode: TransferOpcode | int,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int:
        op = self._opcode(opcode)
        if op is None:
            return ERR_INVALID_ARGUMENT
        return self._run_sync("transfer_sync", target_hostname, (buffer,), (peer_buffer_address,), (length,), op, notify)

    def batch_transfer_sync_write(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        return self._run_sync("batch_transfer_sync_write", target_hostname, buffers, peer_buffer_addresses, lengths, OpCode.WRITE, None)

    def batch_transfer_sync_read(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        return self._run_sync("batch_transfer_sync_read", target_hostname, buffers, peer_buffer_addresses, lengths, OpCode.READ, None)

    def batch_transfer_sync(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: TransferOpcode | int,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int:
        op = self._opcode(opcode)
        if op is None:
            return ERR_INVALID_ARGUMENT
        return self._run_sync("batch_transfer_sync", target_hostname, buffers, peer_buffer_addresses, lengths, op, notify)

    def _opcode(self, opcode: Any) -> OpCode | None:
        try:
            return OpCode(int(opcode))
        except (TypeError, ValueError):
            log.error("opcode must be TransferOpcode.Read or TransferOpcode.Write, got %r", opcode)
            return None

    def _submit_async(
        self,
        what: str,
        target_hostname: str,
        buffers: Sequence[int],
        peer_addresses: Sequence[int],
        lengths: Sequence[int],
        op: OpCode,
    ) -> int:
        if len(self._batches) >= MAX_OUTSTANDING_BATCHES:
            log.error("%s: %d batches are outstanding; collect them with get_batch_transfer_status", what, len(self._batches))
            return 0
        try:
            handle = self._submit(target_hostname, buffers, peer_addresses, lengths, op)
        except _Fail as exc:
            log.error("%s to %s: %s", what, target_hostname, exc)
            return 0
        bid = next(self._batch_ids)
        self._batches[bid] = _Batch(handle, target_hostname)
        return bid

    def batch_transfer_async_write(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        return self._submit_async("batch_transfer_async_write", target_hostname, buffers, peer_buffer_addresses, lengths, OpCode.WRITE)

    def batch_transfer_async_read(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        return self._submit_async("batch_transfer_async_read", target_hostname, buffers, peer_buffer_addresses, lengths, OpCode.READ)

    def batch_transfer_async(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: TransferOpcode | int,
        transport_hint: str = "",
    ) -> int:
        op = self._opcode(opcode)
        if op is None:
            return 0
        return self._submit_async("batch_transfer_async", target_hostname, buffers, peer_buffer_addresses, lengths, op)

    def transfer_submit_write(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int:
        return self._submit_async("transfer_submit_write", target_hostname, (buffer,), (peer_buffer_address,), (length,), OpCode.WRITE)

    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int:
        """Wait for every batch; 0 when all completed, -1 when one failed or timed out."""
        failed = False
        for bid in batch_ids:
            b = self._batches.pop(bid, None)
            if b is None:
                log.error("get_batch_transfer_status: unknown batch id %r", bid)
                failed = True
                continue
            if failed:
                b.handle.cancel()
                continue
            try:
                b.handle.wait()
            except errors.TentError as exc:
                self._targets.pop(b.target, None)
                log.error("batch %d to %s failed: %s: %s", bid, b.target, type(exc).__name__, exc)
                failed = True
        return -1 if failed else 0

    def transfer_check_status(self, batch_id: int) -> int:
        """1 completed, 0 pending, -1 failed, -2 timed out (completed and failed ids are released)."""
        b = self._batches.get(batch_id)
        if b is None:
            log.error("transfer_check_status: unknown batch id %r", batch_id)
            return -1
        state = b.handle.poll()
        if state == "pending":
            return 0
        self._batches.pop(batch_id, None)
        if state == "done":
            return 1
        try:
            b.handle.wait(0)
        except errors.DeadlineExceededError as exc:
            log.error("batch %d to %s timed out: %s", batch_id, b.target, exc)
            return -2
        except errors.TentError as exc:
            log.error("batch %d to %s failed: %s", batch_id, b.target, exc)
        self._targets.pop(b.target, None)
        return -1

    # ------------------------------------------------------------------ misc
    def send_probe(self, peer_server_name: str) -> int:
        """0 when the peer answers; ERR_METADATA (unknown name), ERR_DNS or ERR_SOCKET otherwise."""
        eng = self._engine
        if eng is None:
            log.error("send_probe: not initialized")
            return -1
        name = self._normalize(peer_server_name)
        if self._metadata == P2PHANDSHAKE:
            host, port = _split_host_port(name)
            if port is None:
                log.error("send_probe(%r): the name must be host:port", peer_server_name)
                return ERR_INVALID_ARGUMENT
            try:
                socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.error("send_probe(%r): cannot resolve %s: %s", peer_server_name, host, exc)
                return ERR_DNS
        try:
            eng.ping(name)
        except errors.PeerUnreachableError as exc:
            unknown = self._metadata != P2PHANDSHAKE and "no engine named" in str(exc)
            log.error("send_probe(%r): %s", peer_server_name, exc)
            return ERR_METADATA if unknown else ERR_SOCKET
        except errors.TentError as exc:
            log.error("send_probe(%r): %s", peer_server_name, exc)
            return ERR_SOCKET
        return 0

    def get_local_topology(self, device_name: str | None = None) -> str:
        """JSON in Mooncake's shape: per NUMA node ("cpu:N") and GPU ("cuda:N") the preferred and
        available RDMA devices, from what `tent doctor` finds on this host."""
        from ..doctor import mooncake_topology

        filt = [d.strip() for d in (device_name or "").split(",") if d.strip()]
        return json.dumps(mooncake_topology(filt))

    def get_notifies(self) -> list[TransferNotify]:
        """Always empty: the facade refuses to send notifications, so none can arrive."""
        if "notifies" not in self._warned:
            self._warned.add("notifies")
            log.info("get_notifies: TENT's Mooncake facade does not carry notifications")
        return []

    def warmup_efa_segment(self, segment_name: str) -> int:
        """Mooncake's no-op outside EFA builds (0); TENT connects rails on first use."""
        return 0

    def get_engine(self) -> Engine | None:
        """The TENT engine (Mooncake returns its C++ engine object here)."""
        return self._engine

    def get_engine_ptr(self) -> int:
        log.error("get_engine_ptr: there is no C++ Mooncake engine behind TENT's facade")
        return 0

    def __repr__(self) -> str:
        return f"<TransferEngine (TENT facade) {self._name or 'uninitialized'} metadata={self._metadata or '-'}>"


__all__ = [
    "ERR_ADDRESS_NOT_REGISTERED",
    "ERR_ADDRESS_OVERLAPPED",
    "ERR_DNS",
    "ERR_INVALID_ARGUMENT",
    "ERR_METADATA",
    "ERR_NOT_IMPLEMENTED",
    "ERR_SOCKET",
    "P2PHANDSHAKE",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
]
