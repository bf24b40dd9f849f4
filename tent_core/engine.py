"""The Engine: a thin I/O shell around the policies.

Applications register memory into named segments and submit intents (READ/WRITE
between a local buffer and a remote segment); the engine resolves a transport per
request (phase 1), sprays slices over that transport's rails (phase 2) and retries
failed slices on other rails or transports (phase 3). Completion is counted in the
native module; the application waits on a batch handle.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _native, errors, resolver
from .abi import FAILURE_DTYPE, SLICE_DTYPE
from .batch import BatchHandle, status_error
from .config import EngineConfig, load_config
from .memory import MemfdBuffer, describe
from .metadata import ControlClient, ControlServer, host_identity
from .path_planner import StagedPath, plan_staged_path
from .plugin_manager import PluginSet, discover, instantiate
from .policy_rules import RequestTraits, Rule, first_match, parse_rules
from .qos import PrioritySlots, SharedRailLoad
from .rail_monitor import RailMonitor, RailState
from .rails import RAILS, Rail
from .slice_scheduler import SliceScheduler
from .staged import StagingPool, run_staged
from .transport import Transport, TransportContext
from .types import (
    Availability,
    BufferInfo,
    MemoryKind,
    OpCode,
    PeerInfo,
    PeerLink,
    Permission,
    Priority,
)

log = logging.getLogger(__name__)

_UNSET: Any = object()
_PERM_READ, _PERM_WRITE = int(Permission.READ), int(Permission.WRITE)
_SHARED_LOAD: Any = None  # the process's SharedRailLoad (False: unavailable)
HEALTH_TICK_S = 0.01  # telemetry/health cadence of the progress thread
PROBE_SEGMENT = "_tent_probe"
PROBE_BYTES = 4096

# Registered files get synthetic, non-overlapping "addresses" far above user space.
FILE_BASE = 1 << 56
FILE_STRIDE = 1 << 44



@dataclass
class Request:
    """One intent. `local` is a buffer returned by Engine.register/allocate."""

    op: OpCode
    local: LocalBuffer
    local_offset: int
    remote: str  # "host:port/segment"
    remote_offset: int
    length: int
    priority: Priority = Priority.MID
    tag: str | None = None  # a class name administrators' policy rules can match


@dataclass
class LocalBuffer:
    """A registered local buffer. `offset` is its place inside `segment`."""

    segment: str
    offset: int
    addr: int
    length: int
    kind: MemoryKind
    perm: Permission
    device: int = -1
    array: np.ndarray | None = None
    info: BufferInfo | None = None
    _keepalive: Any = None
    _owned: MemfdBuffer | None = None
    _engine_id: str = ""
    registered: bool = True


@dataclass
class _LocalSegment:
    name: str
    buffers: list[LocalBuffer] = field(default_factory=list)
    next_offset: int = 0


@dataclass
class _RemoteBuffer:
    offset: int
    addr: int
    length: int
    perm: int  # Permission bits as a plain int: checked on every request
    kind: MemoryKind
    desc: dict[str, Any]


@dataclass
class _Route:
    transport: Transport
    link: PeerLink
    rails: list[Rail]


@dataclass
class _Peer:
    engine_id: str
    info: PeerInfo
    segments: dict[str, list[_RemoteBuffer]]
    starts: dict[str, list[int]]
    raw_buffers: list[dict[str, Any]]
    client: ControlClient | None
    same_host: bool
    routes: dict[str, _Route] = field(default_factory=dict)
    route_order: dict[tuple[MemoryKind, MemoryKind], list[str]] = field(default_factory=dict)
    dead_transports: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def parse_segment_name(name: str) -> tuple[str, str]:
    """'host:port/segment' -> ('host:port', 'segment')."""
    if not isinstance(name, str) or "/" not in name:
        raise errors.InvalidRequestError(f"remote segment must look like 'host:port/segment', got {name!r}")
    engine_id, _, seg = name.partition("/")
    host, _, port = engine_id.rpartition(":")
    if not host or not port.isdigit() or not seg:
        raise errors.InvalidRequestError(f"remote segment must look like 'host:port/segment', got {name!r}")
    return engine_id, seg


class Engine:
    """A declarative transfer engine instance (one per process is typical)."""

    def __init__(
        self,
        config: dict[str, Any] | str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        transports: Sequence[str] | None = None,
        plugins: list[Any] | None = None,
        autoload: bool = True,
    ) -> None:
        self.config: EngineConfig = load_config(config)
        if not 0 <= self.config.wait_spin_us <= 10_000:
            raise errors.InvalidRequestError(f"wait_spin_us must be within [0, 10000], got {self.config.wait_spin_us}")
        _native.set_wait_spin_ns(int(self.config.wait_spin_us * 1000))
        self.host_id = host_identity()
        self._lock = threading.RLock()
        self._segments: dict[str, _LocalSegment] = {}
        self._peers: dict[str, _Peer] = {}
        self._closed = False
        self._control = ControlServer(host, port, self._handle_control)
        self.engine_id = f"{host}:{self._control.port}"
        self.scheduler = SliceScheduler(
            self.config.scheduler, qos=PrioritySlots(self.config.qos) if self.config.qos.enabled else None
        )
        try:
            self._rules = parse_rules(self.config.rules)
        except ValueError as exc:
            raise errors.InvalidRequestError(f"bad policy rules in config: {exc}") from exc
        self.monitor = RailMonitor(self.config.health)
        self._file_bases = 0
        self._staged_pool_threads: ThreadPoolExecutor | None = None
        self._staging: StagingPool | None = None
        self._announced_paths: set[tuple[Any, ...]] = set()
        self._remote_cache: dict[str, tuple[_Peer, str]] = {}
        self._path_cache: dict[tuple[Any, ...], Any] = {}
        self.plugins: PluginSet = discover(plugins, autoload=autoload)
        self.availability: dict[str, Availability] = {}
        self.transports: dict[str, Transport] = {}
        allow = set(transports) if transports is not None else None
        for name, entry in sorted(self.plugins.registry.entries.items()):
            if allow is not None and name not in allow:
                continue
            transport, avail = instantiate(entry)
            if transport is not None and avail.available:
                ctx = TransportContext(
                    engine_id=self.engine_id,
                    host_id=self.host_id,
                    config={"slice_timeout_ms": int(self.config.slice_timeout_s * 1000), **self.config.transports.get(name, {})},
                    bind_host=host,
                )
                try:
                    transport.start(ctx)
                except Exception as exc:
                    avail = Availability.unavailable(f"start failed: {type(exc).__name__}: {exc}")
                    log.warning("transport %s could not start: %s", name, exc)
                else:
                    self.transports[name] = transport
            self.availability[name] = avail
        if not self.transports:
            log.warning("engine %s has no available transport: %s", self.engine_id, self.availability)
        self._profiles = {n: t.capabilities() for n, t in self.transports.items()}
        self._probe_remote: dict[str, int] = {}
        self._probes: list[tuple[Rail, Any, float]] = []
        # every engine exposes a tiny read-only buffer that peers' heartbeat slices read
        self._probe_buf = self.allocate(PROBE_BYTES, segment=PROBE_SEGMENT, perm=Permission.READ) if self.transports else None
        PROGRESS.attach(self)
        log.info("engine %s up with transports %s", self.engine_id, sorted(self.transports))

    # ------------------------------------------------------------------ memory
    def register(
        self, obj: Any, segment: str = "default", perm: Permission = Permission.READ_WRITE
    ) -> LocalBuffer:
        """Register memory (numpy, torch, CUDA array, buffer, or (addr, length)) into `segment`."""
        region = describe(obj)
        return self._add_buffer(segment, region.addr, region.length, region.kind, region.device, perm, region.array, obj, None)

    def allocate(self, size: int, segment: str = "default", perm: Permission = Permission.READ_WRITE) -> LocalBuffer:
        """Engine-allocated host memory: memfd-backed (same-host peers can map it), pre-faulted."""
        mem = MemfdBuffer(size, name=f"tent-{segment}")
        try:
            return self._add_buffer(segment, mem.addr, size, MemoryKind.HOST, -1, perm, mem.array, None, mem)
        except BaseException:
            mem.close()
            raise

    def register_file(
        self,
        path: str | os.PathLike[str],
        segment: str = "files",
        perm: Permission = Permission.READ_WRITE,
        size: int | None = None,
    ) -> LocalBuffer:
        """Register a file as a buffer of kind FILE. `size` creates/extends the file.

        File buffers get a synthetic virtual base address (unique per engine), so
        transports address file offsets like memory ranges: offset = addr - base."""
        full = os.path.abspath(os.fspath(path))
        if size is not None:
            if size < 0:
                raise errors.InvalidRequestError(f"file size must be >= 0, got {size}")
            fd = os.open(full, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)
            finally:
                os.close(fd)
        try:
            length = os.stat(full).st_size
        except FileNotFoundError as exc:
            raise errors.InvalidRequestError(f"cannot register {full}: no such file (pass size= to create it)") from exc
        with self._lock:
            self._file_bases += 1
            base = FILE_BASE + self._file_bases * FILE_STRIDE
        if length >= FILE_STRIDE:
            raise errors.InvalidRequestError(f"{full}: files up to {FILE_STRIDE} bytes can be registered")
        buf = self._add_buffer(segment, base, length, MemoryKind.FILE, -1, perm, None, None, None, path=full)
        return buf

    def _add_buffer(
        self,
        segment: str,
        addr: int,
        length: int,
        kind: MemoryKind,
        device: int,
        perm: Permission,
        array: np.ndarray | None,
        keepalive: Any,
        owned: MemfdBuffer | None,
        path: str | None = None,
    ) -> LocalBuffer:
        if not isinstance(segment, str) or not segment or "/" in segment:
            raise errors.InvalidRequestError(f"segment name must be a non-empty string without '/', got {segment!r}")
        perm = Permission(perm)
        self._check_open()
        with self._lock:
            seg = self._segments.setdefault(segment, _LocalSegment(segment))
            offset = seg.next_offset
            seg.next_offset = offset + ((length + 63) & ~63)
            info = BufferInfo(
                segment=segment,
                offset=offset,
                addr=addr,
                length=length,
                kind=kind,
                device=device,
                perm=perm,
                memfd=owned.fd if owned else -1,
                path=path,
            )
            buf = LocalBuffer(segment, offset, addr, length, kind, perm, device, array, info, keepalive, owned, self.engine_id)
            exported: dict[str, Any] = {}
            called: list[str] = []
            try:
                for name, t in self.transports.items():
                    if not any(kind in pair for pair in self._profiles[name].kind_pairs):
                        continue  # e.g. a file's synthetic address must never reach a memory transport
                    d = t.export_buffer(info)
                    called.append(name)
                    if d is not None:
                        exported[name] = d
            except BaseException:
                for name in called:
                    self.transports[name].release_buffer(info)
                raise
            info.extra["desc"] = exported
            info.extra["exported"] = called
            seg.buffers.append(buf)
        return buf

    def unregister(self, buf: LocalBuffer) -> None:
        """After return, no peer can touch the buffer through this engine's transports."""
        with self._lock:
            seg = self._segments.get(buf.segment)
            if seg is None or buf not in seg.buffers:
                raise errors.NotRegisteredError(f"buffer at {buf.addr:#x} is not registered with {self.engine_id}")
            seg.buffers.remove(buf)
            if not seg.buffers:
                del self._segments[buf.segment]
            buf.registered = False
        for name in buf.info.extra.get("exported", []) if buf.info else []:
            try:
                self.transports[name].release_buffer(buf.info)  # type: ignore[arg-type]
            except Exception:
                log.exception("transport %s failed to release a buffer", name)
        if buf._owned is not None:
            buf.array = None
            buf._owned.close()

    def segment_name(self, segment: str = "default") -> str:
        return f"{self.engine_id}/{segment}"

    # ----------------------------------------------------------- metadata (server side)
    def describe(self) -> dict[str, Any]:
        with self._lock:
            segments = {
                name: [
                    {
                        "offset": b.offset,
                        "addr": b.addr,
                        "length": b.length,
                        "perm": int(b.perm),
                        "kind": b.kind.value,
                        "desc": b.info.extra.get("desc", {}) if b.info else {},
                    }
                    for b in seg.buffers
                ]
                for name, seg in self._segments.items()
            }
        return {
            "ok": True,
            "engine_id": self.engine_id,
            "host_id": self.host_id,
            "pid": os.getpid(),
            "transports": {n: t.local_descriptor() for n, t in self.transports.items()},
            "segments": segments,
        }

    def _handle_control(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg["op"]
        if op == "describe":
            return self.describe()
        if op == "ping":
            return {"ok": True}
        if op == "transport":  # a transport's own handshake (e.g. RDMA QPs), routed by name
            transport = self.transports.get(msg.get("transport"))  # type: ignore[arg-type]
            if transport is None:
                raise errors.ProtocolError(f"no transport {msg.get('transport')!r} on {self.engine_id}")
            return transport.handle_control(msg.get("body"))
        raise errors.ProtocolError(f"unknown op {op!r}")

    # ----------------------------------------------------------- peers (initiator side)
    def _fetch_peer(self, engine_id: str, timeout: float) -> _Peer:
        if engine_id == self.engine_id:
            client = None
            desc = self.describe()
        else:
            client = ControlClient(engine_id)
            try:
                desc = client.call({"op": "describe"}, timeout)
            except errors.PeerUnreachableError:
                client.close()
                raise
            if not desc.get("ok"):
                client.close()
                raise errors.PeerUnreachableError(f"engine {engine_id} refused describe: {desc.get('error')}")
        peer = _Peer(
            engine_id=engine_id,
            info=PeerInfo(engine_id, str(desc["host_id"]), int(desc["pid"]), dict(desc["transports"])),
            segments={},
            starts={},
            raw_buffers=[],
            client=client,
            same_host=desc["host_id"] == self.host_id,
        )
        self._load_segments(peer, desc["segments"])
        return peer

    @staticmethod
    def _load_segments(peer: _Peer, segments: dict[str, list[dict[str, Any]]]) -> None:
        peer.segments = {}
        peer.starts = {}
        raw: list[dict[str, Any]] = []
        for name, bufs in segments.items():
            rb = sorted(
                (
                    _RemoteBuffer(
                        int(b["offset"]), int(b["addr"]), int(b["length"]), int(b["perm"]), MemoryKind(b["kind"]), b["desc"]
                    )
                    for b in bufs
                ),
                key=lambda r: r.offset,
            )
            peer.segments[name] = rb
            peer.starts[name] = [r.offset for r in rb]
            raw.extend(dict(b, segment=name) for b in bufs)
        peer.raw_buffers = raw

    def _peer(self, engine_id: str, timeout: float) -> _Peer:
        peer = self._peers.get(engine_id)
        if peer is None:
            fetched = self._fetch_peer(engine_id, timeout)
            with self._lock:
                peer = self._peers.setdefault(engine_id, fetched)
            if peer is not fetched and fetched.client is not None:
                fetched.client.close()  # another thread won the race
        return peer

    def refresh_peer(self, engine_id: str, timeout: float | None = None) -> None:
        """Re-read a peer's segments (it registered new memory)."""
        peer = self._peer(engine_id, timeout or self.config.control_timeout_s)
        if peer.client is None:
            desc = self.describe()
        else:
            desc = peer.client.call({"op": "describe"}, timeout or self.config.control_timeout_s)
        with peer.lock:
            self._load_segments(peer, desc["segments"])
            for r in peer.routes.values():
                r.transport.connect(peer.info, peer.raw_buffers)

    def _route(
        self,
        peer: _Peer,
        local_kind: MemoryKind,
        remote_kind: MemoryKind,
        skip: frozenset[str] | set[str] = frozenset(),
        rule: Rule | None = None,
    ) -> _Route:
        key = (local_kind, remote_kind)
        order = peer.route_order.get(key)
        if order is None:
            reachable = [n for n, t in self.transports.items() if t.can_reach(peer.info) is None]
            order = resolver.rank_transports(self._profiles, local_kind, remote_kind, peer.same_host, reachable)
            peer.route_order[key] = order
            if not order:
                raise errors.NoPathError(
                    resolver.explain_no_path(self._profiles, local_kind, remote_kind, peer.same_host, reachable)
                )
        if rule is not None:
            allowed = rule.filter_transports(order)
            if not allowed:
                raise errors.PolicyRejectedError(
                    f"policy rule {rule.name!r} allows none of the transports that could serve this request ({', '.join(order)})"
                )
            order = allowed
        last_exc: Exception | None = None
        for name in order:
            if name in skip or name in peer.dead_transports:
                continue
            route = peer.routes.get(name)
            if route is not None:
                return route
            with peer.lock:
                route = peer.routes.get(name)
                if route is not None:
                    return route
                transport = self.transports[name]
                try:
                    link = transport.connect(peer.info, peer.raw_buffers)
                except Exception as exc:
                    log.warning("transport %s cannot connect to %s: %s; trying the next one", name, peer.engine_id, exc)
                    peer.dead_transports.add(name)
                    last_exc = exc
                    continue
                rails = [RAILS.get(name, peer.engine_id, ri, self.config.scheduler) for ri in link.rails]
                route = peer.routes[name] = _Route(transport, link, rails)
                return route
        raise errors.NoPathError(
            f"no usable transport to {peer.engine_id} for {local_kind.value}<->{remote_kind.value}"
            + (f" (last error: {last_exc})" if last_exc else "")
        )

    # ----------------------------------------------------------------- transfers
    def _check_open(self) -> None:
        if self._closed:
            raise errors.TentError("engine is closed")

    def _map_remote(
        self, peer: _Peer, seg: str, offset: int, length: int, op: OpCode, refreshed: bool = False
    ) -> list[tuple[_RemoteBuffer, int, int]]:
        """[offset, offset+length) of a remote segment -> (buffer, addr, length) pieces."""
        bufs = peer.segments.get(seg)
        if bufs is None:
            if not refreshed:
                self.refresh_peer(peer.engine_id)
                return self._map_remote(peer, seg, offset, length, op, True)
            raise errors.UnknownSegmentError(f"engine {peer.engine_id} has no segment {seg!r}")
        starts = peer.starts[seg]
        pieces: list[tuple[_RemoteBuffer, int, int]] = []
        pos, end = offset, offset + length
        need = _PERM_READ if op == OpCode.READ else _PERM_WRITE
        while True:
            i = bisect.bisect_right(starts, pos) - 1
            b = bufs[i] if i >= 0 else None
            if b is None or pos >= b.offset + max(b.length, 1) or (b.length == 0 and pos != b.offset):
                if not refreshed:
                    self.refresh_peer(peer.engine_id)
                    return self._map_remote(peer, seg, offset, length, op, True)
                if pieces or (b is not None and pos == b.offset + b.length):
                    raise errors.OutOfBoundsError(
                        f"{peer.engine_id}/{seg}: range [{offset}, {end}) runs past registered memory at offset {pos}"
                    )
                raise errors.NotRegisteredError(f"{peer.engine_id}/{seg}: offset {pos} is not inside a registered buffer")
            if not (b.perm & need):
                raise errors.PermissionDeniedError(
                    f"{peer.engine_id}/{seg}: buffer at offset {b.offset} is registered {Permission(b.perm)!r}, "
                    f"{op.name} needs {Permission(need).name}"
                )
            take = min(end, b.offset + b.length) - pos
            pieces.append((b, b.addr + (pos - b.offset), take))
            pos += take
            if pos >= end:
                return pieces

    def submit(self, requests: Sequence[Request] | Request, deadline: float | None = None) -> BatchHandle:
        """Queue requests and return at once. `deadline` is seconds from now (default from config)."""
        self._check_open()
        if isinstance(requests, Request):
            requests = [requests]
        timeout = self.config.request_deadline_s if deadline is None else float(deadline)
        if timeout <= 0:
            raise errors.InvalidRequestError(f"deadline must be > 0 seconds, got {deadline!r}")
        plan: list[tuple[_Route, Rail, int, int, int, int, _Peer]] = []  # route, rail, op, local, remote, len, peer
        staged: list[tuple[Request, StagedPath]] = []
        rule_rails: dict[str, frozenset[int]] = {}
        for req in requests:
            self._plan_request(req, timeout, plan, staged, rule_rails)
        batch = _native.Batch(len(plan) + len(staged))
        handle = BatchHandle(self, batch, time.monotonic() + timeout, len(requests))
        handle.rule_rails = rule_rails
        if plan:
            PROGRESS.track(handle)
            self._dispatch(batch, plan)
        for req, path in staged:
            self._staged_workers().submit(run_staged, self, handle, req, path, self._staging_pool())
        return handle

    def _staged_workers(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._staged_pool_threads is None:
                self._staged_pool_threads = ThreadPoolExecutor(
                    max_workers=self.config.staging_workers, thread_name_prefix="tent-staged"
                )
            return self._staged_pool_threads

    def _staging_pool(self) -> StagingPool:
        with self._lock:
            if self._staging is None:
                self._staging = StagingPool(self, self.config.staging_chunk_bytes, self.config.staging_buffers)
            return self._staging

    def _plan_request(
        self, req: Request, timeout: float, plan: list, staged: list, handle_rails: dict[str, frozenset[int]]
    ) -> None:
        if not isinstance(req, Request):
            raise errors.InvalidRequestError(f"expected a Request, got {type(req).__name__}")
        op = req.op
        if op is not OpCode.READ and op is not OpCode.WRITE:
            try:
                op = OpCode(op)
            except ValueError as exc:
                raise errors.InvalidRequestError(f"op must be READ or WRITE, got {req.op!r}") from exc
        buf = req.local
        if not isinstance(buf, LocalBuffer) or not buf.registered or buf._engine_id != self.engine_id:
            raise errors.NotRegisteredError("the local buffer is not registered with this engine")
        if req.length < 0 or req.local_offset < 0 or req.remote_offset < 0:
            raise errors.InvalidRequestError(
                f"offsets and length must be >= 0 (local_offset={req.local_offset}, remote_offset={req.remote_offset}, length={req.length})"
            )
        if req.local_offset + req.length > buf.length:
            raise errors.OutOfBoundsError(
                f"local range [{req.local_offset}, {req.local_offset + req.length}) exceeds the {buf.length}-byte buffer"
            )
        target = self._remote_cache.get(req.remote)
        if target is None:
            engine_id, seg = parse_segment_name(req.remote)
            peer = self._peer(engine_id, min(timeout, self.config.control_timeout_s))
            if len(self._remote_cache) < 65536:
                self._remote_cache[req.remote] = (peer, seg)
        else:
            peer, seg = target
        if req.length == 0:
            if seg not in peer.segments:  # nothing to move, but the segment must exist
                self._map_remote(peer, seg, req.remote_offset, 0, op)  # refreshes once, then raises
            return
        local = buf.addr + req.local_offset
        prio = req.priority
        if prio.__class__ is not Priority:
            try:
                prio = Priority(prio)
            except ValueError as exc:
                raise errors.InvalidRequestError(f"priority must be HIGH, MID or LOW, got {req.priority!r}") from exc
        pieces = self._map_remote(peer, seg, req.remote_offset, req.length, op)
        if len(pieces) == 1:
            pkey = (peer.engine_id, buf.kind, pieces[0][0].kind, op)
            path = self._path_cache.get(pkey, _UNSET)
            if path is _UNSET:
                path = self._path_cache[pkey] = self._staged_path(peer, buf.kind, pieces[0][0].kind, op)
        else:
            path = None
        if path is not None:
            self._check_local_stage(buf, req, op)
            staged.append((req, path))
            return
        for rbuf, raddr, length in pieces:
            rule = None
            if self._rules:
                traits = RequestTraits(prio, req.length, buf.kind, rbuf.kind, peer.same_host, req.tag)
                rule = first_match(self._rules, traits)
            route = self._route(peer, buf.kind, rbuf.kind, rule=rule)
            rails = route.rails
            if rule is not None and rule.rails is not None:
                rails = [r for r in rails if r.info.index in rule.rails]
                if not rails:
                    raise errors.PolicyRejectedError(
                        f"policy rule {rule.name!r} allows rails {sorted(rule.rails)} but {route.transport.name} to "
                        f"{peer.engine_id} has rails {[r.info.index for r in route.rails]}"
                    )
                handle_rails[route.transport.name] = rule.rails
            if len(rails) == 1:
                step = route.transport.split_bytes
                if step <= 0 or length <= step:
                    plan.append((route, rails[0], op, local, raddr, length, peer))
                else:
                    for off in range(0, length, step):
                        plan.append((route, rails[0], op, local + off, raddr + off, min(step, length - off), peer))
            else:
                now = time.monotonic()
                weights: list[float] | None = [self.monitor.weight(r.slot, now) for r in rails]
                if not any(weights):  # type: ignore[arg-type]
                    weights = None  # every rail paused: try them all rather than fail; retries sort it out
                for idx, off, ln in self.scheduler.plan(length, [r.telemetry for r in rails], prio, weights):
                    plan.append((route, rails[idx], op, local + off, raddr + off, ln, peer))
            local += length

    def _staged_path(self, peer: _Peer, local_kind: MemoryKind, remote_kind: MemoryKind, op: OpCode) -> StagedPath | None:
        """A synthesized path when no single transport serves the pair (None: a direct one exists)."""
        reachable = [n for n, t in self.transports.items() if t.can_reach(peer.info) is None]
        if resolver.rank_transports(self._profiles, local_kind, remote_kind, peer.same_host, reachable):
            return None
        path = plan_staged_path(self._profiles, local_kind, remote_kind, peer.same_host, reachable, op)
        if path is None:
            raise errors.NoPathError(
                resolver.explain_no_path(self._profiles, local_kind, remote_kind, peer.same_host, reachable)
                + "; no staged path through host memory either"
            )
        key = (peer.engine_id, local_kind, remote_kind, op)
        if key not in self._announced_paths:
            self._announced_paths.add(key)
            log.info("synthesized path to %s: %s", peer.engine_id, path.describe())
        return path

    def _check_local_stage(self, buf: LocalBuffer, req: Request, op: OpCode) -> None:
        # the local buffer is reached through our own segment: validate that leg now, not mid-pipeline
        self_peer = self._peer(self.engine_id, self.config.control_timeout_s)
        self._map_remote(self_peer, buf.segment, buf.offset + req.local_offset, req.length,
                         OpCode.READ if op == OpCode.WRITE else OpCode.WRITE)
        if self_peer.segments.get(buf.segment) is None:
            raise errors.NotRegisteredError("local buffer's segment vanished")

    def _dispatch(self, batch: Any, plan: list) -> None:
        if len(plan) == 1:
            route, rail, op, local, remote, length, _ = plan[0]
            ex = route.transport.executor
            rc = _native.submit_one(
                ex.ops, ex.handle, batch, int(op), local, remote, length, route.link.handle, rail.info.index, rail.slot, 0
            )
            if rc != 0:
                batch.fail_slice(rc)
            return
        groups: dict[str, list] = {}
        for item in plan:
            groups.setdefault(item[0].transport.name, []).append(item)
        for items in groups.values():
            arr = np.zeros(len(items), SLICE_DTYPE)
            route0 = items[0][0]
            arr["opcode"] = [int(it[2]) for it in items]
            arr["local_addr"] = [it[3] for it in items]
            arr["remote_addr"] = [it[4] for it in items]
            arr["length"] = [it[5] for it in items]
            arr["peer"] = [it[0].link.handle for it in items]
            arr["rail"] = [it[1].info.index for it in items]
            arr["stat_index"] = [it[1].slot for it in items]
            ex = route0.transport.executor
            rc = _native.submit(ex.ops, ex.handle, batch, arr)
            if rc != 0:
                for _ in items:
                    batch.fail_slice(rc)

    # ------------------------------------------------------------------ retries
    def _handle_failure(self, handle: BatchHandle, rec: np.void) -> None:
        """A slice failed with a retryable status: re-issue it elsewhere, or finalize it."""
        s = rec["slice"]
        status = int(rec["status"])
        now = time.monotonic()
        batch = handle._batch
        if handle.is_probe:  # heartbeats are never retried; the health tick reads the outcome
            batch.fail_slice(status)
            return
        rail = RAILS.by_slot(int(s["stat_index"]))
        if rail is not None:
            was = self.monitor.state(rail.slot, now)
            if self.monitor.on_error(rail.slot, now, congestion=status == -4) == RailState.PAUSED and was != RailState.PAUSED:
                peer_ = self._peers.get(rail.peer_id)
                route_ = peer_.routes.get(rail.transport) if peer_ else None
                if route_ is not None and len(route_.rails) > 1:
                    self._abort_rail(route_, rail)
        attempt = int(s["attempt"]) + 1
        if batch.cancelled or now >= handle.deadline or rail is None:
            batch.fail_slice(status)
            return
        peer = self._peers.get(rail.peer_id)
        if peer is None:
            batch.fail_slice(status)
            return
        target = None
        if attempt <= self.config.max_retries_per_slice:
            target = self._pick_retry(peer, rail, attempt, now, handle.rule_rails.get(rail.transport))
        if target is None:
            log.info("slice to %s failed on every path (status %d, attempt %d)", peer.engine_id, status, attempt)
            self._forget_peer(peer)  # next time, ask the peer afresh (it may have restarted)
            batch.fail_slice(status)
            return
        route, new_rail = target
        new_rail.telemetry.add_pending(int(s["length"]), _native.now_ns())  # spread a burst of retries
        batch.note_retry()
        ex = route.transport.executor
        rc = _native.submit_one(
            ex.ops,
            ex.handle,
            batch,
            int(s["opcode"]),
            int(s["local_addr"]),
            int(s["remote_addr"]),
            int(s["length"]),
            route.link.handle,
            new_rail.info.index,
            new_rail.slot,
            attempt,
        )
        if rc != 0:
            batch.fail_slice(rc)

    def _pick_retry(
        self, peer: _Peer, failed: Rail, attempt: int, now: float, allowed: frozenset[int] | None = None
    ) -> tuple[_Route, Rail] | None:
        route = peer.routes.get(failed.transport)
        if route is not None:
            rails = [r for r in route.rails if allowed is None or r.info.index in allowed]
            idx = self.scheduler.pick_retry_rail(
                [r.telemetry for r in rails],
                rails.index(failed) if failed in rails else -1,
                [self.monitor.state(r.slot, now) for r in rails],
                set(),
            )
            if idx is not None and (rails[idx] is not failed or len(rails) == 1):
                if rails[idx] is not failed or attempt <= self.config.max_retries_per_slice // 2:
                    return route, rails[idx]  # one rail only: try it again before giving up on the transport
            if allowed is not None:
                return None  # policy pins this flow to these rails of this transport
        # every rail of this transport failed: substitute another transport
        if attempt > self.config.max_transport_failovers + 1 and route is not None and len(route.rails) > 1:
            return None
        kinds = [k for k in peer.route_order]
        for lk, rk in kinds:
            try:
                alt = self._route(peer, lk, rk, skip={failed.transport})
            except errors.NoPathError:
                continue
            if alt.transport.name != failed.transport:
                if failed.transport not in peer.dead_transports:
                    log.warning(
                        "transport %s to %s keeps failing; substituting %s",
                        failed.transport,
                        peer.engine_id,
                        alt.transport.name,
                    )
                    peer.dead_transports.add(failed.transport)
                return alt, alt.rails[attempt % len(alt.rails)]
        return None

    # ------------------------------------------------------------------ health
    def _health_tick(self, now: float) -> None:
        """Feed telemetry to the rail monitor: completions, stalls, heartbeats of paused rails."""
        now_ns = _native.now_ns()
        hc = self.config.health
        for peer in list(self._peers.values()):
            for route in list(peer.routes.values()):
                if len(route.rails) < 2:
                    continue  # a single rail has nowhere else to go: transport substitution handles it
                latest = 0
                shared = self._shared_load()
                for rail in route.rails:
                    tel = rail.telemetry
                    delta = tel.observe(RAILS.row(rail.slot), now_ns)
                    if shared is not None:
                        self._share_load(shared, rail)
                    if delta.slices_done and self.monitor.state(rail.slot, now) != RailState.PAUSED:
                        self.monitor.on_success(rail.slot, now)
                    latest = max(latest, tel.last_complete_ns)
                # A rail is stalled when it has work and has completed nothing for stall_min_s while
                # another rail to the same peer kept completing (so it is the rail, not the peer or
                # our CPU). Queue-inclusive latencies are not used: under load they are long.
                stall_ns = hc.stall_min_s * 1e9
                for rail in route.rails:
                    tel = rail.telemetry
                    if (
                        tel.inflight_slices
                        and tel.stall_s(now_ns) * 1e9 > stall_ns
                        and now_ns - latest < stall_ns
                        and self.monitor.state(rail.slot, now) != RailState.PAUSED
                    ):
                        log.info("rail %s to %s stalled (%.0f ms without progress): pausing",
                                 rail.info.name, peer.engine_id, tel.stall_s(now_ns) * 1e3)
                        self.monitor.pause(rail.slot, now)
                        self._abort_rail(route, rail)
                    if self.monitor.due_probe(rail.slot, now):
                        self._send_probe(peer, route, rail, now)
        still: list[tuple[Rail, Any, float]] = []
        for rail, h, sent in self._probes:
            b = h._batch
            if b.remaining:
                if now - sent > max(hc.probe_timeout_s, self.config.slice_timeout_s) * 4:
                    h.cancel()  # the executor's progress timer ends it; stop waiting here
                    self.monitor.on_error(rail.slot, now)
                    continue
                still.append((rail, h, sent))
            elif b.error == 0:
                log.debug("heartbeat on rail %s ok after %.1f ms", rail.info.name, (now - sent) * 1e3)
                rail.telemetry.reset_bandwidth()
                self.monitor.on_success(rail.slot, now)
            else:
                log.debug("heartbeat on rail %s failed (status %d) after %.1f ms", rail.info.name, b.error, (now - sent) * 1e3)
                self.monitor.on_error(rail.slot, now)
        self._probes = still

    def _forget_peer(self, peer: _Peer) -> None:
        """Drop a peer that no path reaches: cached routes, segments and parsed names."""
        with self._lock:
            if self._peers.get(peer.engine_id) is not peer:
                return
            del self._peers[peer.engine_id]
            for key in [k for k, (p, _) in self._remote_cache.items() if p is peer]:
                del self._remote_cache[key]
            for key in [k for k in self._path_cache if k[0] == peer.engine_id]:
                del self._path_cache[key]
        for route in peer.routes.values():
            try:
                route.transport.disconnect(route.link)
            except Exception:
                log.exception("disconnect from %s failed", peer.engine_id)
        if peer.client is not None:
            peer.client.close()

    def _share_load(self, shared: SharedRailLoad, rail: Rail) -> None:
        global _SHARED_LOAD
        # the physical path (transport, local address -> remote address), not the remote port:
        # engines of different processes talking through the same NICs share it
        key = f"{rail.transport}:{rail.info.name.rsplit(':', 1)[0]}"
        try:
            shared.set(key, rail.telemetry.inflight_bytes)
            rail.telemetry.set_external(shared.others(key))
        except (RuntimeError, OSError, ValueError) as exc:
            log.warning("shared rail load table unusable (%s); each process now sees only its own load", exc)
            _SHARED_LOAD = False

    def _shared_load(self) -> SharedRailLoad | None:
        """The host-wide rail load table (one per process), or None when off or unavailable."""
        global _SHARED_LOAD
        if not self.config.qos.shared_load:
            return None
        if _SHARED_LOAD is None:
            try:
                _SHARED_LOAD = SharedRailLoad(config=self.config.qos)
            except (OSError, ValueError) as exc:
                log.warning("shared rail load table unavailable (%s); each process sees only its own load", exc)
                _SHARED_LOAD = False
        return _SHARED_LOAD or None

    def _abort_rail(self, route: _Route, rail: Rail) -> None:
        try:
            n = route.transport.abort_rail(route.link, rail.info.index)
        except Exception:
            log.exception("transport %s failed to abort rail %s", route.transport.name, rail.info.name)
            return
        if n:
            log.info("re-routing %d queued slice(s) off rail %s", n, rail.info.name)

    def _send_probe(self, peer: _Peer, route: _Route, rail: Rail, now: float) -> None:
        bufs = peer.segments.get(PROBE_SEGMENT)
        if not bufs or self._probe_buf is None:
            self.monitor.on_success(rail.slot, now)  # nothing to probe with: re-admit on trust
            return
        batch = _native.Batch(1)
        h = BatchHandle(self, batch, now + 10.0, 1)
        h.is_probe = True
        PROGRESS.track(h)
        ex = route.transport.executor
        rc = _native.submit_one(ex.ops, ex.handle, batch, int(OpCode.READ), self._probe_buf.addr, bufs[0].addr,
                                PROBE_BYTES, route.link.handle, rail.info.index, rail.slot, 0)
        if rc != 0:
            batch.fail_slice(rc)
        self._probes.append((rail, h, now))

    # ---------------------------------------------------------------- helpers
    def transfer(
        self,
        op: OpCode,
        local: LocalBuffer,
        local_offset: int,
        remote: str,
        remote_offset: int,
        length: int,
        *,
        priority: Priority = Priority.MID,
        timeout: float | None = None,
    ) -> None:
        """Submit one request and wait for it (the simple case)."""
        h = self.submit([Request(op, local, local_offset, remote, remote_offset, length, priority)], deadline=timeout)
        h.wait()

    def read(self, local: LocalBuffer, remote: str, length: int | None = None, *, local_offset: int = 0, remote_offset: int = 0, timeout: float | None = None) -> None:
        n = local.length - local_offset if length is None else length
        self.transfer(OpCode.READ, local, local_offset, remote, remote_offset, n, timeout=timeout)

    def write(self, local: LocalBuffer, remote: str, length: int | None = None, *, local_offset: int = 0, remote_offset: int = 0, timeout: float | None = None) -> None:
        n = local.length - local_offset if length is None else length
        self.transfer(OpCode.WRITE, local, local_offset, remote, remote_offset, n, timeout=timeout)

    def rail_stats(self) -> list[dict[str, Any]]:
        """Per-rail telemetry and health, for display and benchmarks."""
        now = time.monotonic()
        out = []
        for peer in list(self._peers.values()):
            for route in list(peer.routes.values()):
                for r in route.rails:
                    row = RAILS.row(r.slot)
                    out.append(
                        {
                            "transport": r.transport,
                            "peer": peer.engine_id,
                            "rail": r.info.name,
                            "index": r.info.index,
                            "bytes": int(row[2]),
                            "slices": int(row[3]),
                            "errors": int(row[4]),
                            "inflight_bytes": int(row[0]),
                            "bandwidth_GBps": r.telemetry.bandwidth_Bps / 1e9,
                            "state": self.monitor.state(r.slot, now).name,
                            "numa_node": r.info.numa_node,
                            "pci": r.info.pci,
                        }
                    )
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._staged_pool_threads is not None:
            self._staged_pool_threads.shutdown(wait=True, cancel_futures=True)
        PROGRESS.detach(self)
        self._control.close()
        for peer in self._peers.values():
            if peer.client is not None:
                peer.client.close()
            for route in peer.routes.values():
                try:
                    route.transport.disconnect(route.link)
                except Exception:
                    log.exception("disconnect failed")
        for t in self.transports.values():
            try:
                t.close()
            except Exception:
                log.exception("transport %s failed to close", t.name)
        for seg in list(self._segments.values()):
            for b in seg.buffers:
                b.registered = False
                if b._owned is not None:
                    b.array = None
                    b._owned.close()
        self._segments.clear()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Progress:
    """One process-wide thread: takes retryable slice failures from the native
    queue and hands them to the engine that owns the batch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: set[Engine] = set()
        self._inflight: dict[int, BatchHandle] = {}
        self._thread: threading.Thread | None = None
        self._fd = _native.failure_fd()

    def attach(self, engine: Engine) -> None:
        with self._lock:
            self._engines.add(engine)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tent-progress", daemon=True)
                self._thread.start()

    def detach(self, engine: Engine) -> None:
        with self._lock:
            self._engines.discard(engine)

    def track(self, handle: BatchHandle) -> None:
        self._inflight[handle._batch.token] = handle

    def untrack(self, handle: BatchHandle) -> None:
        self._inflight.pop(handle._batch.token, None)

    def _run(self) -> None:
        import select

        last_sweep = last_tick = time.monotonic()
        while True:
            r, _, _ = select.select([self._fd], [], [], HEALTH_TICK_S)
            if r:
                try:
                    os.read(self._fd, 8)
                except BlockingIOError:
                    pass
                data = _native.pop_failures()
                if data:
                    foreign = []
                    for rec in np.frombuffer(data, FAILURE_DTYPE):
                        handle = self._inflight.get(int(rec["slice"]["token"]))
                        if handle is None:
                            foreign.append(rec)  # someone drives an executor directly: theirs to pop
                            continue
                        try:
                            handle.engine._handle_failure(handle, rec)
                        except Exception:
                            log.exception("retry handling failed")
                            try:
                                handle._batch.fail_slice(int(rec["status"]))
                            except RuntimeError:
                                pass
                    if foreign:
                        _native.requeue_failures(np.array(foreign, FAILURE_DTYPE).tobytes())
            now = time.monotonic()
            if now - last_tick >= HEALTH_TICK_S:
                last_tick = now
                with self._lock:
                    engines = list(self._engines)
                for eng in engines:
                    try:
                        eng._health_tick(now)
                    except Exception:
                        log.exception("health tick failed")
            if now - last_sweep > 0.2:
                last_sweep = now
                for tok, h in list(self._inflight.items()):
                    if h._batch.remaining == 0:
                        self._inflight.pop(tok, None)
                    elif now > h.deadline and not h._batch.cancelled:
                        h._expire()  # nobody waits on it: stop its slices anyway
                    elif now > h.deadline + 60:
                        log.error("batch %x still has %d slices a minute past its deadline", tok, h._batch.remaining)


PROGRESS = _Progress()

__all__ = ["Engine", "Request", "LocalBuffer", "parse_segment_name", "status_error", "SLICE_DTYPE"]
