"""The Engine: the public facade over the engine's parts.

Applications register memory into named segments and submit intents (READ/WRITE between a local
buffer and a remote segment); the engine resolves a transport per request (phase 1), sprays slices
over that transport's rails (phase 2) and retries failed slices on other rails or transports
(phase 3). Completion is counted in the native module; the application waits on a batch handle.

The work is done by (one object each per engine):

* `segments.LocalSegments`: registered local memory and its export to the transports;
* `peers.PeerDirectory`: remote engines, their segments and the connected routes to them (found
  through their control ports, or through a cluster directory, `tent_core.directory`);
* `routing.Router`: every transport / rail choice (pure policy);
* `dispatch.Submitter`: the submit path (validation, planning, slicing, native submit);
* `recovery.Recovery`: failed slices, rail health and heartbeats, driven by the process-wide
  progress thread `recovery.PROGRESS`.

This module wires them together, starts the transports and owns the engine's lifecycle.
"""

from __future__ import annotations

import bisect
import logging
import os
import resource
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _native, errors
from .abi import SLICE_DTYPE, WAIT_DTYPE, StatField
from .auth import AuthError, ClusterAuth
from .auth import from_config as auth_from_config
from .batch import BatchHandle, status_error
from .config import EngineConfig, load_config
from .dispatch import Submitter
from .metadata import ControlClient, ControlServer, host_identity
from .peers import PeerDirectory
from .plugin_manager import PluginSet, discover, instantiate
from .policy_rules import parse_rules
from .qos import PrioritySlots
from .rail_monitor import RailMonitor
from .rails import RAILS
from .recovery import HEALTH_TICK_S, PROBE_BYTES, PROBE_SEGMENT, PROGRESS, Recovery
from .request import LocalBuffer, Request, WaitWord, parse_segment_name
from .routing import RetryLimits, Router
from .segments import FILE_BASE, FILE_STRIDE, LocalSegments
from .slice_scheduler import SliceScheduler
from .target_staging import STAGE_OPS, TargetStager
from .transport import Transport, TransportContext
from .types import Availability, OpCode, Permission, Priority

log = logging.getLogger(__name__)

_BYTES, _SLICES, _ERRORS, _INFLIGHT, _INFLIGHT_SLICES, _CONGESTION = (
    int(StatField.BYTES_DONE), int(StatField.SLICES_DONE), int(StatField.ERRORS), int(StatField.INFLIGHT_BYTES),
    int(StatField.INFLIGHT_SLICES), int(StatField.CONGESTION),
)


def _raise_fd_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (capped at 1 Mi): see EngineConfig.raise_fd_limit."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 1 << 20 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            log.debug("open-file limit raised from %d to %d", soft, want)
    except (OSError, ValueError) as exc:
        log.debug("cannot raise the open-file limit: %s", exc)


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
        if not (0 <= self.config.progress_idle_s <= 3600 and 0 <= self.config.progress_idle_after_s <= 3600):
            raise errors.InvalidRequestError(
                f"progress_idle_s and progress_idle_after_s must be within [0, 3600], got "
                f"{self.config.progress_idle_s} and {self.config.progress_idle_after_s}")
        try:
            rules = parse_rules(self.config.rules)
        except ValueError as exc:
            raise errors.InvalidRequestError(f"bad policy rules in config: {exc}") from exc
        _native.set_wait_spin_ns(int(self.config.wait_spin_us * 1000))
        self.host_id = host_identity()
        self._closed = False
        self._close_lock = threading.Lock()
        # the cluster secret (SECURITY.md): every control request and data connection is authenticated
        self.auth: ClusterAuth | None = auth_from_config(self.config, [host], what="engine")
        cfg = self.config
        if cfg.raise_fd_limit:
            _raise_fd_limit()
        # the control port answers from here on; requests that need the engine's state wait until
        # __init__ has built it (a peer may describe us before we finished starting)
        self._ready = threading.Event()
        self._control = ControlServer(
            host, port, self._handle_control, auth=self.auth,
            max_request_bytes=cfg.control_max_request_bytes, send_hwm=cfg.control_send_hwm,
            handshake_ms=cfg.control_handshake_ms,
        )
        self.control_endpoint = f"{host}:{self._control.port}"  # where peers send metadata requests
        dcfg = self.config.directory
        # with a directory, peers may know this engine by a fixed name instead of its control endpoint
        self.engine_id = dcfg.name if dcfg.url and dcfg.name else self.control_endpoint
        self.plugins: PluginSet = discover(plugins, autoload=autoload)
        self.availability: dict[str, Availability] = {}
        self.transports: dict[str, Transport] = self._start_transports(host, transports)
        self._profiles = {n: t.capabilities() for n, t in self.transports.items()}
        self._wait_transports = [t for t in self.transports.values() if getattr(t, "wait_read", False)]
        self.router = Router(
            self._profiles, rules, RetryLimits(cfg.max_retries_per_slice, cfg.max_transport_failovers), cfg.path_cost,
            cfg.staging_chunk_bytes, (cfg.target_staging_min_chunk_bytes, cfg.target_staging_chunks),
            (cfg.staging_min_chunk_bytes, cfg.staging_chunks), mapped=cfg.mapped_paths,
        )
        self.scheduler = SliceScheduler(cfg.scheduler, qos=PrioritySlots(cfg.qos) if cfg.qos.enabled else None)
        self.monitor = RailMonitor(cfg.health)
        self._segments = LocalSegments(self.engine_id, self.transports, self._profiles)
        self.peers = PeerDirectory(
            self.engine_id, self.host_id, self.transports, self.router, self.describe, self.monitor,
            control_timeout_s=cfg.control_timeout_s, scheduler=cfg.scheduler, peer_config=cfg.peers,
            control_client=lambda endpoint: ControlClient(
                endpoint, auth=self.auth, max_reply_bytes=cfg.control_max_reply_bytes, send_hwm=cfg.control_send_hwm
            ),
        )
        self._probe_buf: LocalBuffer | None = None
        self._recovery = Recovery(self, cfg, self.peers, self.router, self.monitor, lambda: self._probe_buf, PROGRESS)
        self._submitter = Submitter(self, cfg, self._segments, self.peers, self.router, self.scheduler, self.monitor, PROGRESS)
        self._fast: Any = None
        if cfg.fast_path:
            self._fast = _native.FastPath(
                Request, BatchHandle, self, PROGRESS.inflight, cfg.request_deadline_s,
                size_keyed=any(r.min_size is not None or r.max_size is not None for r in rules),
                small_bytes=max(0, cfg.small_request_bytes), fallback=self._submit_planned,
            )
            sc = cfg.scheduler
            slots = self.scheduler.qos  # noted alike by the planner and the fast path (the same list)
            self._fast.mouse_policy(sc.b0_s, sc.b1, sc.gamma, sc.bandwidth_stale_s, self._submitter.mice_below,
                                    None if slots is None else slots.native_view())
            self._submitter.fast = self._fast
            self.peers.on_change = self._fast.invalidate  # peers, routes or their buffers changed
            # submit() is the native fast path itself (the planner is its fallback): no Python frame
            # between the application and the executor for requests whose plan is cached
            self.submit = self._fast  # type: ignore[method-assign]
            self.run = self._fast.run  # type: ignore[method-assign]
        # stages copies between its own host staging and device memory for peers that cannot reach it
        self._stager = TargetStager(self._submitter, self._segments, self.peers, self.router, self._profiles, cfg)
        # every engine exposes a tiny read-only buffer that peers' heartbeat slices read
        if self.transports:
            self._probe_buf = self.allocate(PROBE_BYTES, segment=PROBE_SEGMENT, perm=Permission.READ)
        self._ready.set()
        if dcfg.url:
            self._attach_directory()
        if cfg.metrics.port:
            from . import metrics

            try:
                metrics.attach(self, cfg.metrics)  # e.g. its port is taken
            except BaseException:
                self.close()
                raise
        PROGRESS.attach(self)
        log.info("engine %s up with transports %s", self.engine_id, sorted(self.transports))

    def _attach_directory(self) -> None:
        """Publish this engine in the configured directory; peers are then resolved through it only."""
        from .directory import bind_engine

        try:
            binding = bind_engine(
                self.config.directory, self.engine_id, self.control_endpoint, self.describe, self.peers.control_client
            )
        except BaseException:
            self.close()
            raise
        self.peers.use_directory(binding)  # closed with the peers
        self._segments.on_change = binding.segment_changed

    def _start_transports(self, host: str, only: Sequence[str] | None) -> dict[str, Transport]:
        started: dict[str, Transport] = {}
        allow = set(only) if only is not None else None
        for name in sorted(set(self.config.transports) - set(self.plugins.registry.entries)):
            log.warning("config section transports.%s names no installed transport", name)
        for name, entry in sorted(self.plugins.registry.entries.items()):
            if allow is not None and name not in allow:
                continue
            transport, avail = instantiate(entry)
            if transport is not None:
                section = {"slice_timeout_ms": int(self.config.slice_timeout_s * 1000), **self.config.transports.get(name, {})}
                try:  # a typo in a transport's section is an error, even where the transport is unavailable
                    section = transport.resolve_config(section)
                except errors.ConfigError:
                    for running in started.values():
                        running.close()
                    self._control.close()
                    raise
            if transport is not None and avail.available:
                ctx = TransportContext(engine_id=self.engine_id, host_id=self.host_id, config=section, bind_host=host,
                                       auth=self.auth, require_auth=self.config.require_auth)
                try:
                    transport.start(ctx)
                except AuthError:  # a listener would be exposed without a token: refuse, do not degrade
                    for running in started.values():
                        running.close()
                    self._control.close()
                    raise
                except Exception as exc:
                    avail = Availability.unavailable(f"start failed: {type(exc).__name__}: {exc}")
                    log.warning("transport %s could not start: %s", name, exc)
                else:
                    started[name] = transport
            self.availability[name] = avail
        if not started:
            log.warning("engine %s has no available transport: %s", self.engine_id, self.availability)
        return started

    # ------------------------------------------------------------------ memory
    def register(self, obj: Any, segment: str = "default", perm: Permission = Permission.READ_WRITE) -> LocalBuffer:
        """Register memory (numpy, torch, CUDA array, buffer, or (addr, length)) into `segment`."""
        self._check_open()
        return self._segments.register(obj, segment, perm)

    def allocate(self, size: int, segment: str = "default", perm: Permission = Permission.READ_WRITE) -> LocalBuffer:
        """Engine-allocated host memory: memfd-backed (same-host peers can map it), pre-faulted."""
        self._check_open()
        return self._segments.allocate(size, segment, perm)

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
        self._check_open()
        return self._segments.register_file(path, segment, perm, size)

    def unregister(self, buf: LocalBuffer) -> None:
        """After return, no peer can touch the buffer through this engine's transports."""
        if self._fast is not None:
            self._fast.invalidate()  # cached plans naming the buffer are gone before it is
        self._submitter.forget(buf)  # its mappings (tent_core.mapped), unmapped once no request uses them
        self._segments.unregister(buf)

    def segment_name(self, segment: str = "default") -> str:
        return f"{self.engine_id}/{segment}"

    # ----------------------------------------------------------- metadata (server side)
    def describe(self) -> dict[str, Any]:
        table, epochs = self._segments.snapshot()
        return {
            "ok": True,
            "engine_id": self.engine_id,
            "host_id": self.host_id,
            "pid": os.getpid(),
            "transports": {n: t.local_descriptor() for n, t in self.transports.items()},
            "segments": table,
            "epochs": epochs,
            "staging": self._stager.offer() if hasattr(self, "_stager") else {},
        }

    def _handle_control(self, msg: dict[str, Any]) -> Any:
        op = msg["op"]
        if op != "ping" and not self._ready.wait(self.config.control_timeout_s):
            return {"ok": False, "error": "engine still starting"}
        if op == "describe":
            seg = msg.get("segment")
            if seg is None:
                return self.describe()
            # one segment, incrementally (see LocalSegments.describe_segment)
            if not isinstance(seg, str):
                raise errors.ProtocolError("describe: segment must be a string")
            epoch, start = msg.get("epoch", 0), msg.get("from_offset", 0)
            if not isinstance(epoch, int) or not isinstance(start, int):
                raise errors.ProtocolError("describe: epoch and from_offset must be integers")
            part = self._segments.describe_segment(seg, epoch, start)
            return {"ok": True, "engine_id": self.engine_id, "pid": os.getpid(), "segment": seg, "found": part is not None,
                    **(part or {})}
        if op == "ping":
            return {"ok": True}
        if op in STAGE_OPS:  # target-side staging (a BatchReply for copies: replied when they are done)
            return self._stager.handle(msg)
        if op == "transport":  # a transport's own handshake (e.g. RDMA QPs), routed by name
            name = msg.get("transport")
            transport = self.transports.get(name) if isinstance(name, str) else None
            if transport is None:
                raise errors.ProtocolError(f"no transport {msg.get('transport')!r} on {self.engine_id}")
            return transport.handle_control(msg.get("body"))
        raise errors.ProtocolError(f"unknown op {op!r}")

    def refresh_peer(self, engine_id: str, timeout: float | None = None) -> None:
        """Re-read a peer's segments (it registered new memory)."""
        self.peers.refresh(engine_id, timeout or self.config.control_timeout_s)

    def peer_buffers(self, engine_id: str, refresh: bool = False) -> list[dict[str, Any]]:
        """A peer's registered buffers: dicts with ``segment``, ``offset`` (inside the segment), ``addr``
        (its virtual address there), ``length``, ``perm`` and ``kind``. For adapters that address
        remote memory by raw address (the Mooncake facade)."""
        self._check_open()
        return self.peers.buffers(engine_id, refresh)

    def ping(self, engine_id: str, timeout: float | None = None) -> float:
        """Round trip (seconds) to a peer's control port. Raises PeerUnreachableError when the peer
        is unknown (to the directory, if one is configured) or does not answer."""
        self._check_open()
        return self.peers.ping(engine_id, timeout)

    # ----------------------------------------------------------------- transfers
    def _check_open(self) -> None:
        if self._closed:
            raise errors.TentError("engine is closed")

    def submit(self, requests: Sequence[Request] | Request, deadline: float | None = None, *,
               digest: Any = None) -> BatchHandle:
        """Queue requests and return at once. `deadline` is seconds from now (default from config).

        Small same-host copies may complete inside this call (the transport runs them on the calling
        thread: no hand-off, no wake-up); the handle then reports done at once.

        `digest` (a :class:`tent_core.Digest`): a transport that copies a READ on this thread inside
        the call (``Transport.inline_digest``) folds the landed bytes into it as it copies them, if
        they continue its stream (``digest.next``). What was not folded (another transport, a
        worker, a retry) the caller folds itself after the wait: ``digest.update`` of its buffer
        from ``digest.next`` on. See tent/digest.h.

        `digest` may also be a list of at most ``tent_core.DIGESTS_PER_SUBMIT`` Digests, each
        bounded to its stream (``Digest(start, end)``): each slice gets the one whose range holds
        its destination. A transport that receives READ
        answers on other threads (``Transport.receive_digest``, tcp) folds them as they land, in
        stream order; the caller then folds what was not with ``digest.land(landed bytes)``."""
        # with the fast path on, the instance's submit is the native FastPath (see __init__), which
        # takes digest= itself and calls _submit_planned for what it cannot take
        if digest is None:
            return self._submit_planned(requests, deadline)
        _native.digest_arm(digest)
        try:
            return self._submit_planned(requests, deadline)
        finally:
            _native.digest_arm(None)

    def can_wait(self, remote: str, timeout: float | None = None) -> bool:
        """Whether READs of `remote` ("host:port/segment") may wait at the target (``submit_when``):
        every transport that can reach its peer declares ``Transport.wait_read``."""
        self._check_open()
        peer, _ = self.peers.resolve(remote, timeout or self.config.control_timeout_s)
        return bool(peer.reachable) and all(
            getattr(self.transports.get(n), "wait_read", False) for n in peer.reachable)

    def word_written(self) -> None:
        """This process advanced a word that waiting READs of its peers may name (``submit_when``
        on their side): the transports' parked READs look again now, rather than on their timers."""
        for t in self._wait_transports:
            t.word_written()

    def submit_when(self, requests: Sequence[Request], waits: Sequence[WaitWord | None],
                    deadline: float | None = None, *, digest: Any = None) -> BatchHandle:
        """`submit`, with READs that wait at the target: request i (a READ) is answered only once the
        word `waits[i]` names (in its remote segment) is in the condition's range; None: a plain
        request. Lets a reader post READs of bytes its source does not hold yet (they cost no link
        bytes until the bytes land). Raises InvalidRequestError where a peer's transports cannot
        (``can_wait``). A READ whose condition fails completes with NotReadyError."""
        self._check_open()
        if len(waits) != len(requests):
            raise errors.InvalidRequestError(f"submit_when: {len(waits)} conditions for {len(requests)} requests")
        rows = []
        timeout = self.config.control_timeout_s
        for req, w in zip(requests, waits, strict=True):
            if w is None:
                continue
            if req.op != OpCode.READ:
                raise errors.InvalidRequestError("submit_when: only a READ may wait")
            if not (0 <= w.floor <= w.lo <= w.hi < 1 << 64) or w.offset < 0 or w.offset % 8 or not w.timeout_s > 0:
                raise errors.InvalidRequestError(f"submit_when: bad condition {w}")
            if not self.can_wait(req.remote, timeout):
                raise errors.InvalidRequestError(f"submit_when: no transport to {req.remote} can wait at the target")
            peer, seg = self.peers.resolve(req.remote, timeout)
            bufs, starts = peer.segments.get(seg), peer.starts.get(seg)
            if not bufs:
                raise errors.UnknownSegmentError(req.remote)
            k = bisect.bisect_right(starts, w.offset) - 1
            if k < 0 or w.offset + 8 > bufs[k].offset + bufs[k].length:
                raise errors.OutOfBoundsError(f"submit_when: word at {w.offset} outside {req.remote}'s buffers")
            start = req.local.addr + req.local_offset
            rows.append((start, start + req.length, bufs[k].addr + w.offset - bufs[k].offset, w.floor, w.lo, w.hi,
                         max(1, min(0xFFFFFFFF, int(w.timeout_s * 1000))), 0))
        if not rows:
            return self.submit(requests, deadline, digest=digest)
        _native.wait_arm(np.array(rows, dtype=WAIT_DTYPE).tobytes())
        try:
            return self.submit(requests, deadline, digest=digest)
        finally:
            _native.wait_arm(None)

    def run(self, requests: Sequence[Request] | Request, deadline: float | None = None) -> None:
        """Submit and wait: `submit(requests, deadline).wait()`, raising the same typed errors.

        The synchronous form lets the engine skip the handle: a batch the fast path finishes inside
        the call (small same-host copies run on the calling thread) returns without one."""
        # with the fast path on, the instance's run is the native FastPath.run (see __init__)
        self.submit(requests, deadline).wait()

    def _submit_planned(self, requests: Sequence[Request] | Request, deadline: float | None = None) -> BatchHandle:
        if self._closed:
            raise errors.TentError("engine is closed")
        return self._submitter.submit(requests, deadline)

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
        self.run(Request(op, local, local_offset, remote, remote_offset, length, priority), timeout)

    def read(self, local: LocalBuffer, remote: str, length: int | None = None, *, local_offset: int = 0, remote_offset: int = 0, timeout: float | None = None) -> None:
        n = local.length - local_offset if length is None else length
        self.transfer(OpCode.READ, local, local_offset, remote, remote_offset, n, timeout=timeout)

    def write(self, local: LocalBuffer, remote: str, length: int | None = None, *, local_offset: int = 0, remote_offset: int = 0, timeout: float | None = None) -> None:
        n = local.length - local_offset if length is None else length
        self.transfer(OpCode.WRITE, local, local_offset, remote, remote_offset, n, timeout=timeout)

    def explain(self, request: Request | None = None, **kind: Any) -> Any:
        """The path a request takes and the alternatives, priced (`tent_core.explain.PathExplanation`;
        `str()` of it is a readable report). Pass a Request, or describe one without a buffer:
        ``explain(op="WRITE", local_kind="cuda", remote="host:port/seg", remote_offset=0, length=n)``.
        Nothing moves; the peer is contacted once (describe) if it is not known yet."""
        from .explain import explain_request

        self._check_open()
        return explain_request(self, request, **kind)

    # ----------------------------------------------------------- progress thread entry points
    def _handle_failure(self, handle: BatchHandle, rec: np.void) -> None:
        self._recovery.on_failure(handle, rec)

    def _health_tick(self, now: float) -> bool:
        return self._recovery.health_tick(now)

    # ----------------------------------------------------------------- introspection
    def rail_stats(self) -> list[dict[str, Any]]:
        """Per-rail telemetry and health, for display and benchmarks."""
        now = time.monotonic()
        out = []
        for peer in self.peers.peers():
            for route in list(peer.routes.values()):
                for r in route.rails:
                    row = RAILS.row(r.slot)
                    out.append(
                        {
                            "transport": r.transport,
                            "peer": peer.engine_id,
                            "rail": r.info.name,
                            "index": r.info.index,
                            "bytes": int(row[_BYTES]),
                            "slices": int(row[_SLICES]),
                            "errors": int(row[_ERRORS]),
                            "congestion": int(row[_CONGESTION]),
                            "inflight_bytes": int(row[_INFLIGHT]),
                            "inflight_slices": int(row[_INFLIGHT_SLICES]),
                            "bandwidth_GBps": r.telemetry.bandwidth_Bps / 1e9,
                            "state": self.monitor.state(r.slot, now).name,
                            "numa_node": r.info.numa_node,
                            "pci": r.info.pci,
                        }
                    )
        return out

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Stop the engine. When it returns the progress thread no longer calls into this engine,
        no submit reaches its executors, every batch it started has been finalized or will be by
        its deadline, and its rails and memory are released."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._fast is not None:
            self._fast.close()  # every later submit is refused by the open check; drop cached plans
        self._submitter.close()  # staged pipelines finish (their legs fail fast once transports go)
        self._stager.close()
        PROGRESS.detach(self)  # fence: no retry, tick or probe of this engine runs after this
        self._recovery.close()  # slices waiting for a path are cancelled, the peer watch stops
        if self.config.metrics.port:
            from . import metrics

            metrics.detach(self)
        self.peers.close()  # withdraw from the directory, disconnect every route, release rails
        self._control.close()
        for t in self.transports.values():
            try:
                t.close()  # executors retire (no submit reaches them) and report what they held
            except Exception:
                log.exception("transport %s failed to close", t.name)
        self._segments.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "FILE_BASE",
    "FILE_STRIDE",
    "HEALTH_TICK_S",
    "PROBE_BYTES",
    "PROBE_SEGMENT",
    "PROGRESS",
    "SLICE_DTYPE",
    "Engine",
    "LocalBuffer",
    "Request",
    "parse_segment_name",
    "status_error",
]
