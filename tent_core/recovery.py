"""Phase 3, resilience: failed slices, rail health, heartbeats, and the progress thread driving them.

`Recovery` (one per engine) handles what the executors report asynchronously:

* `on_failure(handle, record)`: a slice failed with a retryable status. The rail monitor hears of
  it (a rail that just got PAUSED has its queued slices aborted so they re-route at once); the
  slice is re-issued where the Router's `next_hop` says, under the Decision of the request it
  belongs to (`BatchHandle.decision_for`: same memory kinds, same policy rule): another rail, or a
  substitute transport (which then stays preferred for that peer). When no path is left, the slice
  is finalized with its status and the peer is marked suspect (re-checked before its next
  request); routes other batches use are never torn down from here.
* `health_tick(now)`: every `HEALTH_TICK_S`, fold the native telemetry rows into the rails'
  models, share the rails' load with other processes on the host, pause stalled rails, send
  heartbeat slices on paused rails whose cooldown ended and judge the answers.

`Progress` is the one process-wide thread (`PROGRESS`) that waits on the native failure queue and
the health cadence and calls into its attached owners (engines) through `_handle_failure` and
`_health_tick`. `detach(owner)` is a fence: after it returns the thread never calls into that
owner again, and failures of its batches are finalized without it.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from . import _native
from .abi import ATTEMPT_MASK, FAILURE_DTYPE, Status
from .batch import BatchHandle
from .config import EngineConfig
from .peers import Peer, PeerDirectory, Route
from .qos import SharedRailLoad
from .rail_monitor import RailMonitor, RailState
from .rails import RAILS, Rail
from .request import LocalBuffer
from .routing import Router
from .types import OpCode

log = logging.getLogger(__name__)

HEALTH_TICK_S = 0.01  # telemetry/health cadence of the progress thread
PROBE_SEGMENT = "_tent_probe"
PROBE_BYTES = 4096
_CONGESTED = int(Status.E_CONGESTED)
_SHARED_LOAD: Any = None  # the process's SharedRailLoad (False: unavailable)


class Recovery:
    """Failure handling and rail health for one engine; see the module docstring."""

    def __init__(
        self,
        owner: Any,
        config: EngineConfig,
        peers: PeerDirectory,
        router: Router,
        monitor: RailMonitor,
        probe_buffer: Callable[[], LocalBuffer | None],
        progress: Progress,
    ) -> None:
        self._owner = owner  # the BatchHandle owner heartbeats are tracked under
        self.config = config
        self.peers = peers
        self.router = router
        self.monitor = monitor
        self._probe_buffer = probe_buffer
        self._progress = progress
        self._probes: list[tuple[Rail, BatchHandle, float]] = []

    # ---- failed slices --------------------------------------------------------------------------

    def _locate(self, rail: Rail | None, link_handle: int) -> tuple[Peer | None, Route | None]:
        """The live route a failed slice went through, or (peer, None) when it is gone (or the rail
        slot and link handle no longer belong together: the route was replaced meanwhile)."""
        if rail is None:
            return None, None
        peer = self.peers.lookup(rail.peer_id)
        route = peer.routes.get(rail.transport) if peer is not None else None
        if route is None or route.link.handle != link_handle or rail not in route.rails:
            return peer, None
        return peer, route

    def on_failure(self, handle: BatchHandle, rec: np.void) -> None:
        """A slice failed with a retryable status: re-issue it elsewhere, or finalize it."""
        s = rec["slice"]
        status = int(rec["status"])
        now = time.monotonic()
        batch = handle._batch
        if handle.is_probe:  # heartbeats are never retried; the health tick reads the outcome
            batch.fail_slice(status)
            return
        rail = RAILS.by_slot(int(s["stat_index"]))
        peer, route = self._locate(rail, int(s["peer"]))
        if route is not None:
            assert rail is not None
            was = self.monitor.state(rail.slot, now)
            state = self.monitor.on_error(rail.slot, now, congestion=status == _CONGESTED)
            if state == RailState.PAUSED and was != RailState.PAUSED and len(route.rails) > 1:
                self.abort_rail(route, rail)
        if batch.cancelled or now >= handle.deadline or peer is None or route is None or rail is None:
            batch.fail_slice(status)
            return
        local_addr, length = int(s["local_addr"]), int(s["length"])
        decision = handle.decision_for(route, local_addr)
        if decision is None:
            batch.fail_slice(status)
            return
        hints = int(s["attempt"]) & ~ATTEMPT_MASK  # the executor hints travel with the retry
        attempt = (int(s["attempt"]) & ATTEMPT_MASK) + 1
        target = self._next(peer, route, rail, decision, attempt, now)
        if target is None:
            log.info("slice to %s failed on every path (status %d, attempt %d)", peer.engine_id, status, attempt)
            self.peers.mark_suspect(peer)  # re-checked before its next request; in-flight work untouched
            batch.fail_slice(status)
            return
        new_route, new_rail = target
        if new_route is not route:
            handle.note_route(new_route, decision, local_addr, local_addr + length)
        new_rail.telemetry.add_pending(length, _native.now_ns())  # spread a burst of retries
        batch.note_retry()
        ex = new_route.transport.executor
        rc = _native.submit_one(
            ex.ops, ex.handle, batch, int(s["opcode"]), local_addr, int(s["remote_addr"]), length,
            new_route.link.handle, new_rail.info.index, new_rail.slot, attempt | hints,
        )
        if rc != 0:
            batch.fail_slice(rc)

    def _next(self, peer: Peer, route: Route, failed: Rail, decision: Any, attempt: int, now: float) -> tuple[Route, Rail] | None:
        positions = self.router.allowed_rails(decision, route.indices)
        rails = [route.rails[p] for p in positions]
        failed_pos = rails.index(failed) if failed in rails else -1
        tels = [r.telemetry for r in rails]
        states = [self.monitor.state(r.slot, now) for r in rails]
        unusable = set(peer.dead_transports)
        while True:
            hop = self.router.next_hop(decision, failed.transport, tels, states, failed_pos, attempt, unusable)
            if hop is None:
                return None
            if hop.rail is not None:
                return route, rails[hop.rail]
            alt = self.peers.connect(peer, hop.transport)
            alt_positions = self.router.allowed_rails(decision, alt.indices) if alt is not None else []
            if alt is None or not alt_positions:
                unusable.add(hop.transport)
                continue
            self.peers.mark_dead(peer, failed.transport, hop.transport)
            return alt, alt.rails[alt_positions[attempt % len(alt_positions)]]

    # ---- health -----------------------------------------------------------------------------------

    def health_tick(self, now: float) -> None:
        """Feed telemetry to the rail monitor: completions, stalls, heartbeats of paused rails."""
        now_ns = _native.now_ns()
        hc = self.config.health
        stall_ns = hc.stall_min_s * 1e9
        shared = self._shared_load()
        for peer in self.peers.peers():
            for route in list(peer.routes.values()):
                if len(route.rails) < 2:
                    continue  # a single rail has nowhere else to go: transport substitution handles it
                latest = 0
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
                        self.abort_rail(route, rail)
                    if self.monitor.due_probe(rail.slot, now):
                        self._send_probe(peer, route, rail, now)
        self._judge_probes(now)

    def _judge_probes(self, now: float) -> None:
        hc = self.config.health
        still: list[tuple[Rail, BatchHandle, float]] = []
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

    def _send_probe(self, peer: Peer, route: Route, rail: Rail, now: float) -> None:
        bufs = peer.segments.get(PROBE_SEGMENT)
        probe = self._probe_buffer()
        if not bufs or probe is None:
            self.monitor.on_success(rail.slot, now)  # nothing to probe with: re-admit on trust
            return
        h = batch = BatchHandle(self._owner, 1, now + 10.0, 1)
        h.is_probe = True
        self._progress.track(h)
        ex = route.transport.executor
        rc = _native.submit_one(ex.ops, ex.handle, batch, int(OpCode.READ), probe.addr, bufs[0].addr,
                                PROBE_BYTES, route.link.handle, rail.info.index, rail.slot, 0)
        if rc != 0:
            batch.fail_slice(rc)
        self._probes.append((rail, h, now))

    def abort_rail(self, route: Route, rail: Rail) -> None:
        try:
            n = route.transport.abort_rail(route.link, rail.info.index)
        except Exception:
            log.exception("transport %s failed to abort rail %s", route.transport.name, rail.info.name)
            return
        if n:
            log.info("re-routing %d queued slice(s) off rail %s", n, rail.info.name)

    # ---- host-wide load sharing -------------------------------------------------------------------

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
                atexit.register(_SHARED_LOAD.close)  # the last process out removes the table
            except (OSError, ValueError) as exc:
                log.warning("shared rail load table unavailable (%s); each process sees only its own load", exc)
                _SHARED_LOAD = False
        return _SHARED_LOAD or None


class ProgressClient(Protocol):
    """What the progress thread calls on an attached owner (an Engine)."""

    def _handle_failure(self, handle: BatchHandle, rec: np.void) -> None: ...

    def _health_tick(self, now: float) -> None: ...


class Progress:
    """One process-wide thread: takes retryable slice failures from the native queue and hands
    them to the owner of the batch; ticks every owner's health; expires batches past deadline."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._owners: set[Any] = set()
        self._busy: Any = None  # the owner the thread is calling into right now
        self._inflight: dict[int, BatchHandle] = {}
        self._thread: threading.Thread | None = None
        self._fd = _native.failure_fd()

    def attach(self, owner: ProgressClient) -> None:
        with self._cv:
            self._owners.add(owner)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tent-progress", daemon=True)
                self._thread.start()

    def detach(self, owner: ProgressClient) -> None:
        """After return the thread never calls into `owner` again (it waits for a call in progress,
        unless called from that very call)."""
        with self._cv:
            self._owners.discard(owner)
            if threading.current_thread() is not self._thread:
                while self._busy is owner:
                    self._cv.wait()

    @property
    def inflight(self) -> dict[int, BatchHandle]:
        """token -> handle of batches with slices out; the native fast path adds its batches here."""
        return self._inflight

    def track(self, handle: BatchHandle) -> None:
        self._inflight[handle._batch.token] = handle

    def untrack(self, handle: BatchHandle) -> None:
        self._inflight.pop(handle._batch.token, None)

    def _call(self, owner: Any, fn: Callable[..., None], *args: Any) -> bool:
        """Run `fn(*args)` as a call into `owner` unless it is detached; False if it was."""
        with self._cv:
            if owner not in self._owners:
                return False
            self._busy = owner
        try:
            fn(*args)
        finally:
            with self._cv:
                self._busy = None
                self._cv.notify_all()
        return True

    def _failures(self) -> None:
        data = _native.pop_failures()
        if not data:
            return
        foreign = []
        for rec in np.frombuffer(data, FAILURE_DTYPE):
            handle = self._inflight.get(int(rec["slice"]["token"]))
            if handle is None:
                foreign.append(rec)  # someone drives an executor directly: theirs to pop
                continue
            status = int(rec["status"])
            try:
                owner = handle.engine
                if not self._call(owner, owner._handle_failure, handle, rec):
                    handle._batch.fail_slice(status)  # its engine is closed: nothing retries it
            except Exception:
                log.exception("retry handling failed")
                try:
                    handle._batch.fail_slice(status)
                except RuntimeError:
                    pass
        if foreign:
            _native.requeue_failures(np.array(foreign, FAILURE_DTYPE).tobytes())

    def _inflight_snapshot(self) -> list[tuple[int, BatchHandle]]:
        # submitters add entries without a lock; a collection run inside list() can let one in
        # mid-copy ("dictionary changed size during iteration"): copy again
        while True:
            try:
                return list(self._inflight.items())
            except RuntimeError:
                continue

    def _run(self) -> None:
        last_sweep = last_tick = time.monotonic()
        while True:
            try:
                last_sweep, last_tick = self._step(last_sweep, last_tick)
            except Exception:  # the one thread that retries and expires every batch must not die
                log.exception("progress thread step failed")
                time.sleep(HEALTH_TICK_S)

    def _step(self, last_sweep: float, last_tick: float) -> tuple[float, float]:
        r, _, _ = select.select([self._fd], [], [], HEALTH_TICK_S)
        if r:
            try:
                os.read(self._fd, 8)
            except BlockingIOError:
                pass
            self._failures()
        now = time.monotonic()
        if now - last_tick >= HEALTH_TICK_S:
            last_tick = now
            with self._cv:
                owners = list(self._owners)
            for owner in owners:
                try:
                    self._call(owner, owner._health_tick, now)
                except Exception:
                    log.exception("health tick failed")
        if now - last_sweep > 0.2:
            last_sweep = now
            for tok, h in self._inflight_snapshot():
                if h._batch.remaining == 0:
                    self._inflight.pop(tok, None)
                    continue
                h._batch.kick()  # work an executor left to a waiter goes on even if nobody waits
                if now > h.deadline and not h._batch.cancelled:
                    h._expire()  # nobody waits on it: stop its slices anyway
                elif now > h.deadline + 60:
                    log.error("batch %x still has %d slices a minute past its deadline", tok, h._batch.remaining)
        return last_sweep, last_tick

PROGRESS = Progress()

__all__ = ["HEALTH_TICK_S", "PROBE_BYTES", "PROBE_SEGMENT", "PROGRESS", "Progress", "Recovery"]
