"""Phase 3, resilience: failed slices, rail health, heartbeats, and the progress thread driving them.

`Recovery` (one per engine) handles what the executors report asynchronously:

* `on_failure(handle, record)`: a slice failed with a retryable status. The rail monitor hears of
  it (a rail that just got PAUSED has its queued slices aborted so they re-route at once); the
  slice is re-issued where the Router's `next_hop` says, under the Decision of the request it
  belongs to (`BatchHandle.decision_for`: same memory kinds, same policy rule): another rail, or a
  substitute transport (which then stays preferred for that peer). When no path is left the slice
  *waits* (a request fails only at its deadline or when no path can ever serve it): it is re-issued
  as soon as a rail of its route is re-admitted, else one waiting slice per back-off step goes out
  as a probe with real data (`[peers] retry_backoff_*`). The peer's `liveness.PeerLiveness` hears
  of it and the `PeerWatch` thread checks the peer's control endpoint: a gone process (connection
  refused) fails the waiting slices at once; a silent one (stopped, links cut) keeps them until
  their deadline, whose error (`PeerSilentError`) says what was tried and for how long, and is
  then remembered as dead so new requests fail at once until it answers again. Slices handed back
  untouched (`E_REROUTED`: a rail aborted) are not errors of that rail. Routes other batches use
  are never torn down from here.
* `health_tick(now)`: every `HEALTH_TICK_S`, fold the native telemetry rows into the rails'
  models, share the rails' load with other processes on the host, count the executors'
  congestion reports, pause stalled rails (serving, no byte moved for `health.stall_s`, while a
  sibling moves bytes), mark outliers DEGRADED (a rail far slower than its siblings), send
  heartbeat slices on paused rails whose cooldown ended and judge the answers; tell each peer's
  liveness about completions, start due checks, re-issue or finalize waiting slices.

`Progress` is the one process-wide thread (`PROGRESS`) that waits on the native failure queue and
the health cadence and calls into its attached owners (engines) through `_handle_failure` and
`_health_tick`. `detach(owner)` is a fence: after it returns the thread never calls into that
owner again, and failures of its batches are finalized without it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from . import _native
from .abi import ATTEMPT_MASK, FAILURE_DTYPE, HINT_MASK, MAX_ROUNDS, ROUND_SHIFT, Status
from .batch import BatchHandle
from .config import EngineConfig
from .liveness import CheckResult, PeerState
from .peers import Peer, PeerDirectory, Route
from .qos import SharedRailLoad
from .rail_monitor import RailMonitor, RailState
from .rails import RAILS, Rail, fold_fast, publish
from .request import LocalBuffer
from .routing import Router
from .slice_scheduler import SliceScheduler
from .telemetry import slowness, stalled
from .types import OpCode

log = logging.getLogger(__name__)

HEALTH_TICK_S = 0.01  # telemetry/health cadence of the progress thread
PROBE_SEGMENT = "_tent_probe"
PROBE_BYTES = 4096
_CONGESTED = int(Status.E_CONGESTED)
_REROUTED = int(Status.E_REROUTED)
_SHARED_LOADS: dict[str, Any] = {}  # table name -> the process's SharedRailLoad of it (False: unavailable)


def _netns_id() -> str:
    """This process's network namespace (the inode of /proc/self/ns/net), "" where unknown."""
    try:
        return str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        return ""


_NETNS = _netns_id()


def shared_load_key(transport: str, rail_name: str, netns: str = _NETNS) -> str:
    """The shared load table's key of a rail: the physical path (transport, local address -> remote
    address, not the remote port: engines of different processes talking through the same NICs
    share it) within one network namespace. Namespaces on one host share /dev/shm but not NICs, and
    they reuse addresses: every benchmark fabric's rail i is 198.18.i.1 -> 198.18.i.2, so without the
    namespace another fabric's (or a --wire bench's) traffic read as load on our rail 0 and the
    spray left it idle for seconds (docs/benchmarks.md, open loop)."""
    return f"{transport}:{netns}:{rail_name.rsplit(':', 1)[0]}"


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
        self._parked: dict[Peer, _PeerWait] = {}  # slices out of paths, per peer (progress thread only)
        self._waiting: dict[BatchHandle, Peer] = {}  # batches that waited on a peer's outage
        self._cut: dict[int, int] = {}  # rail slot -> progress stamp of the silence last cut short
        self._watch = PeerWatch(peers, config.peers.check_timeout_s)

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
        """A slice failed with a retryable status: re-issue it elsewhere, park it until a path comes
        back, or finalize it (deadline passed, batch cancelled, peer gone)."""
        s = rec["slice"]
        status = int(rec["status"])
        now = time.monotonic()
        batch = handle._batch
        if handle.is_probe:  # heartbeats are never retried; the health tick reads the outcome
            batch.fail_slice(status)
            return
        rail = RAILS.by_index(int(s["stat_index"]))  # None once its rail let the slot go
        peer, route = self._locate(rail, int(s["peer"]))
        log.debug("slice failed (status %d, %d bytes, rail %s): retrying or parking", status, int(s["length"]),
                  rail.info.name if rail is not None else "gone")  # fmt: skip
        if route is not None and status != _REROUTED:  # a slice handed back untouched did not fail here
            assert rail is not None
            was = self.monitor.state(rail.slot, now)
            state = self.monitor.on_error(rail.slot, now, congestion=status == _CONGESTED)
            fast = getattr(self._owner, "_fast", None)
            if fast is not None and len(route.rails) > 1:  # mice stop going there before the next tick
                fast.rail_weight(rail.stat_index, self.monitor.weight(rail.slot, now))
            if state == RailState.PAUSED and was != RailState.PAUSED and len(route.rails) > 1:
                self.abort_rail(route, rail)
        if batch.cancelled or now >= handle.deadline:
            if not batch.cancelled:
                handle._expire()  # the deadline, not this slice's status, is why the batch ends
            batch.fail_slice(status)
            return
        if peer is None or route is None or rail is None:
            who = rail.peer_id if rail is not None else "the peer"
            self._give_up(handle, status, f"the route to engine {who} went away while the request ran "
                          "(the peer restarted or was forgotten)")  # fmt: skip
            return
        if self._fail_if_dead(handle, peer, now, status):
            return
        local_addr, length = int(s["local_addr"]), int(s["length"])
        decision = handle.decision_for(route, local_addr)
        if decision is None:
            log.warning("no routing decision recorded for a failed slice to %s (local 0x%x)", peer.engine_id, local_addr)
            self._give_up(handle, status, "internal: no routing decision recorded for a failed slice")
            return
        attempt = int(s["attempt"])
        hints = attempt & HINT_MASK  # the executor hints travel with the retry
        rounds, retry = attempt >> ROUND_SHIFT, (attempt & ATTEMPT_MASK) + 1
        target = self._next(peer, route, rail, decision, retry, now)
        if target is None:
            log.debug("slice to %s out of paths (status %d, retry %d, round %d): waiting", peer.engine_id, status,
                      retry, rounds)  # fmt: skip
            self._park(handle, peer, route, decision, s, status, rounds, f"{route.transport.name} rail {rail.info.index}", now)
            return
        new_route, new_rail = target
        self._resubmit(handle, new_route, new_rail, decision, int(s["opcode"]), local_addr, int(s["remote_addr"]),
                       length, _attempt(retry, hints, rounds), route)  # fmt: skip

    def _resubmit(self, handle: BatchHandle, route: Route, rail: Rail, decision: Any, opcode: int, local: int,
                  remote: int, length: int, attempt: int, was: Route | None) -> None:  # fmt: skip
        batch = handle._batch
        if route is not was:
            handle.note_route(route, decision, local, local + length)
        rail.telemetry.add_pending(length, _native.now_ns())  # spread a burst of retries
        batch.note_retry()
        ex = route.transport.executor
        rc = _native.submit_one(ex.ops, ex.handle, batch, opcode, local, remote, length, route.link.handle,
                                rail.info.index, rail.stat_index, attempt)  # fmt: skip
        if rc != 0:
            self._give_up(handle, rc, f"the {route.transport.name} executor refused the retried slice")

    @staticmethod
    def _give_up(handle: BatchHandle, status: int, why: str) -> None:
        """Finalize one slice of the batch with `status`; `why` becomes the application's error text
        (the first reason given for the batch wins)."""
        if handle.failure_detail is None:
            handle.failure_detail = why
        log.info("giving up a slice (status %d): %s", status, why)
        handle._batch.fail_slice(status)

    def _fail_if_dead(self, handle: BatchHandle, peer: Peer, now: float, status: int) -> bool:
        """Finalize the slice when its peer's process is known to be gone (True), with the reason.
        A peer only judged dead from silence keeps the slice waiting for its own deadline."""
        if not peer.liveness.dead:
            return False
        with peer.lock:
            why = peer.liveness.ends_waiting(now)
        if why is None:
            return False
        self._give_up(handle, status, why)
        return True

    # ---- slices out of paths: wait with back-off until a path returns or the deadline passes ------

    def _park(self, handle: BatchHandle, peer: Peer, route: Route, decision: Any, s: np.void, status: int,
              rounds: int, path: str, now: float) -> None:  # fmt: skip
        with peer.lock:
            if status != _REROUTED:  # handed back untouched: nothing was tried
                handle.outage = peer.liveness.on_no_path(now, path, status)
            elif handle.outage is None:
                handle.outage = peer.liveness.outage
        self._waiting[handle] = peer
        pc = self.config.peers
        delay = 0.0 if rounds == 0 else min(pc.retry_backoff_cap_s, pc.retry_backoff_base_s * (2 ** (rounds - 1)))
        wait = self._parked.get(peer)
        if wait is None:
            wait = self._parked[peer] = _PeerWait(next_canary=now + pc.retry_backoff_base_s, backoff=pc.retry_backoff_base_s)
        wait.entries.append(_Parked(handle, route, decision, int(s["opcode"]), int(s["local_addr"]),
                                    int(s["remote_addr"]), int(s["length"]), status, rounds + 1, int(s["attempt"]) & HINT_MASK, now + delay))  # fmt: skip

    def _watch_deadlines(self, now: float) -> None:
        """A batch that waited on a peer's outage reached its deadline while the outage went on: the
        peer's liveness hears of it at once (a silent peer is then remembered as dead), whether the
        batch's slices are parked or in flight right now."""
        for handle, peer in list(self._waiting.items()):
            if handle._batch.remaining == 0 and not handle._deadline_hit:
                del self._waiting[handle]
            elif now >= handle.deadline:
                del self._waiting[handle]
                outage = handle.outage
                cancelled_by_app = handle._batch.cancelled and not handle._deadline_hit
                if outage is not None and outage.ongoing and not cancelled_by_app:
                    with peer.lock:
                        if peer.liveness.outage is outage:
                            peer.liveness.on_deadline(now)
                    if peer.liveness.dead:
                        self.peers.on_change()  # cached plans must not send to a dead peer

    def _drive_parked(self, now: float) -> None:
        """Finalize parked slices whose batch ended or whose peer is gone; re-issue the others when a
        rail of their route is usable again, else one of them per back-off step (a real-data probe)."""
        pc = self.config.peers
        for peer, wait in list(self._parked.items()):
            keep: list[_Parked] = []
            for p in wait.entries:
                batch = p.handle._batch
                if batch.cancelled or now >= p.handle.deadline:
                    if not batch.cancelled:
                        p.handle._expire()  # wait() raises the deadline's error, with the outage it waited on
                    batch.fail_slice(int(Status.E_CANCELLED))
                elif peer.retired or peer.routes.get(p.route.transport.name) is not p.route:
                    self._give_up(p.handle, p.status, f"engine {peer.engine_id} "
                                  + ("restarted: the memory this request addressed is gone" if peer.restarted
                                     else "was forgotten while the request waited"))  # fmt: skip
                elif not self._fail_if_dead(p.handle, peer, now, p.status):
                    keep.append(p)
            wait.entries = keep
            canary = now >= wait.next_canary
            still: list[_Parked] = []
            for p in keep:
                target = self._redrive_target(peer, p, wait, now, canary) if now >= p.not_before else None
                if target is None:
                    still.append(p)
                    continue
                route, rail, was_canary = target
                if was_canary:
                    canary = False
                    wait.next_canary = now + wait.backoff
                    with peer.lock:
                        peer.liveness.on_retry_round(wait.backoff)
                    wait.backoff = min(pc.retry_backoff_cap_s, wait.backoff * 2)
                self._resubmit(p.handle, route, rail, p.decision, p.opcode, p.local, p.remote, p.length,
                               _attempt(0, p.hints, p.rounds), p.route)  # fmt: skip
            wait.entries = still
            if not still:
                del self._parked[peer]

    def _redrive_target(self, peer: Peer, p: _Parked, wait: _PeerWait, now: float, canary: bool) -> tuple[Route, Rail, bool] | None:
        """A usable rail of the parked slice's route (healthy first), or, for the one canary of this
        back-off step, the next rail in turn whatever its state. None: keep waiting."""
        route = p.route
        rails = [route.rails[i] for i in self.router.allowed_rails(p.decision, route.indices)]
        if not rails:
            return None
        states = [self.monitor.state(r.slot, now) for r in rails]
        pos = SliceScheduler.pick_retry_rail([r.telemetry for r in rails], -1, states)
        if pos is not None:
            wait.backoff = self.config.peers.retry_backoff_base_s  # a path is back: start the back-off over
            return route, rails[pos], False
        if not canary:
            return None
        wait.turn += 1
        return route, rails[wait.turn % len(rails)], True

    def parked(self) -> int:
        """Slices waiting for a path (for tests and introspection)."""
        return sum(len(w.entries) for w in self._parked.values())

    def close(self) -> None:
        """The engine closes: waiting slices are cancelled, the peer watch stops."""
        for wait in self._parked.values():
            for p in wait.entries:
                p.handle._batch.fail_slice(int(Status.E_CANCELLED))
        self._parked.clear()
        self._waiting.clear()
        self._watch.close()

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

    def health_tick(self, now: float) -> bool:
        """Feed telemetry to the rail monitor: completions, congestion, stalls, outliers, heartbeats.
        True while the next tick is needed on time: bytes in flight on a rail (or other processes'
        on a shared one), a rail not HEALTHY, a heartbeat out, a peer not ALIVE, slices waiting for
        a path. False lets the progress thread sleep long (`progress_idle_s`)."""
        watch = False
        now_ns = _native.now_ns()
        hc = self.config.health
        every = hc.single_rail_fold_ticks
        monitor = self.monitor
        shared = self._shared_load()
        fast = getattr(self._owner, "_fast", None)  # the engine's plan cache (made after this object)
        snapshot = _native.stat_row  # RAILS.snapshot of the installed table, without a Python call
        for peer in self.peers.peers():
            progressed = False
            for route in list(peer.routes.values()):
                rails = route.rails
                multi = len(rails) > 1
                # Every rail HEALTHY (RailMonitor.calm): no heartbeat, re-admission or pause waits,
                # and a completion changes nothing there, so the monitor is asked nothing per rail.
                # Re-read per route: this tick may have paused a rail. The common case of a cold
                # tick (docs/benchmarks.md, the health tick), which must stay cheap.
                calm = monitor.calm
                if calm and len(rails) == 1:
                    # the common case, kept short: the one rail's snapshot (its fold waits, see
                    # observe_lazily), the host-wide load, completions for the peer's liveness
                    rail = rails[0]
                    tel = rail.telemetry
                    delta = tel.observe_lazily(snapshot(rail.slot), now_ns, every)
                    if shared is not None:
                        self._share_load(shared, rail)
                    if tel.inflight_bytes or tel.external_bytes:
                        watch = True
                    if delta.slices_done:
                        progressed = True  # a HEALTHY rail's monitor hears nothing of it
                    if delta.congestion and monitor.on_error(rail.slot, now, congestion=True) == RailState.PAUSED:
                        log.info("rail %s to %s congested: paused", rail.info.name, peer.engine_id)
                    continue
                tels = []
                # the rails whose rows the native fast path reads (a cached entry of mice names them)
                # or that hold its assignments not folded yet: only those are published (below)
                watched = [fast.rail_watched(r.stat_index) for r in rails] if fast is not None and multi else None
                folded: list[int | None] = [None] * len(rails)
                for pos, rail in enumerate(rails):
                    tel = rail.telemetry
                    # The row is read first (a copy): a mouse the fast path placed here whose bytes
                    # it shows was placed before, so it is folded now (fold_fast, as the planner's
                    # own), and observe() takes its bytes off pending exactly once (read after the
                    # fold, the row could show a mouse placed in between, not yet pending, and the
                    # next fold would count it once too often)
                    row = snapshot(rail.slot)
                    if watched is not None and watched[pos]:
                        folded[pos] = fold_fast(fast, rail)
                    delta = tel.observe(row, now_ns)
                    tels.append(tel)
                    if shared is not None:
                        self._share_load(shared, rail)
                    if tel.inflight_bytes or tel.external_bytes:
                        watch = True
                    if delta.slices_done:
                        # also on a paused rail: a completion is as good as a heartbeat (the monitor
                        # re-admits it only once its cooldown is over)
                        progressed = True
                        if not calm:
                            monitor.on_success(rail.slot, now)
                    if delta.congestion and (calm or monitor.state(rail.slot, now) != RailState.PAUSED):
                        # one signal per tick: the pieces a rail serves at once stall together
                        if monitor.on_error(rail.slot, now, congestion=True) == RailState.PAUSED:
                            log.info("rail %s to %s congested: paused", rail.info.name, peer.engine_id)
                            if multi:
                                self.abort_rail(route, rail, in_flight=False)  # slow, not broken
                if not calm:
                    for rail in rails:
                        if monitor.due_probe(rail.slot, now):
                            self._send_probe(peer, route, rail, now)
                if not multi:
                    continue  # a single rail has no sibling to compare with; its executor's timeout rules
                for pos in stalled(tels, now_ns, hc.stall_s):
                    rail = rails[pos]
                    if monitor.state(rail.slot, now) == RailState.PAUSED:
                        continue
                    log.info("rail %s to %s stalled (%.0f ms serving without progress): pausing",
                             rail.info.name, peer.engine_id, tels[pos].stall_s(now_ns) * 1e3)
                    monitor.pause(rail.slot, now)
                    self.abort_rail(route, rail, in_flight=False)  # its queue moves; what it serves may still finish
                for pos in stalled(tels, now_ns, hc.stall_cut_s):
                    rail = rails[pos]
                    if self._cut.get(rail.slot) == tels[pos].progress_ns:
                        continue  # already cut for this silence
                    self._cut[rail.slot] = tels[pos].progress_ns
                    log.info("rail %s to %s silent for %.0f ms: cutting what it serves", rail.info.name,
                             peer.engine_id, tels[pos].stall_s(now_ns) * 1e3)  # fmt: skip
                    monitor.pause(rail.slot, now)
                    self.abort_rail(route, rail, in_flight=True)
                slow = slowness(tels, now_ns, hc.outlier_window_s)
                if monitor.outlier_possible(slow.values()):
                    before = {p: monitor.state(rails[p].slot, now) for p in slow}
                    marked = set(monitor.check_outliers({rails[p].slot: v for p, v in slow.items()}, now))
                    for p in slow:
                        rail = rails[p]
                        if rail.slot in marked and before[p] == RailState.HEALTHY:
                            # its queue was sized for its old rate: hand it back to be re-planned
                            log.info("rail %s to %s far slower than its siblings: DEGRADED", rail.info.name, peer.engine_id)
                            self.abort_rail(route, rail, in_flight=False)
                calm = monitor.calm  # a weight read now says what this tick decided
                for rail, taken in zip(rails, folded, strict=True):
                    if taken is not None:  # back out to the fast path, with what health says now
                        publish(fast, rail, 1.0 if calm else monitor.weight(rail.slot, now), taken)
            liveness = peer.liveness
            if liveness.outage is not None or liveness.state is not PeerState.ALIVE:
                watch = True
            if progressed and (liveness.outage is not None or liveness.state is not PeerState.ALIVE):
                with peer.lock:
                    liveness.on_progress(now)
            if liveness.state is not PeerState.ALIVE:
                with peer.lock:
                    due = liveness.check_due(now)
                if due:
                    self._watch.request(peer)
        if self._probes:
            self._judge_probes(now)
        if self._waiting:
            self._watch_deadlines(now)
        if self._parked:
            self._drive_parked(now)
        # settled() also tells the monitor it is calm again: called on every tick that it is not
        settled = monitor.calm or monitor.settled(now)
        return bool(watch or self._probes or self._waiting or self._parked or not settled)

    def _judge_probes(self, now: float) -> None:
        hc = self.config.health
        still: list[tuple[Rail, BatchHandle, float]] = []
        for rail, h, sent in self._probes:
            if RAILS.by_index(rail.stat_index) is not rail:
                continue  # released meanwhile: its slot (and health entry) may be another rail's now
            b = h._batch
            if b.remaining:
                if now - sent > max(hc.probe_timeout_s, self.config.slice_timeout_s) * 4:
                    h.cancel()  # the executor's progress timer ends it; stop waiting here
                    self.monitor.on_error(rail.slot, now)
                    continue
                if now - sent > hc.probe_timeout_s and not h.failure_detail:
                    # Unanswered: cut it (and whatever else hangs on this paused rail) now, so the
                    # next heartbeat starts on a fresh connection instead of queueing behind one
                    # whose packets were lost while the link was down (TCP backs its retransmissions
                    # off for seconds).
                    h.failure_detail = "heartbeat unanswered"
                    route = self._route_of(rail)
                    if route is not None and self.monitor.state(rail.slot, now) == RailState.PAUSED:
                        self.abort_rail(route, rail)
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
                                PROBE_BYTES, route.link.handle, rail.info.index, rail.stat_index, 0)
        if rc != 0:
            batch.fail_slice(rc)
        self._probes.append((rail, h, now))

    def _route_of(self, rail: Rail) -> Route | None:
        peer = self.peers.lookup(rail.peer_id)
        route = peer.routes.get(rail.transport) if peer is not None else None
        return route if route is not None and rail in route.rails else None

    def abort_rail(self, route: Route, rail: Rail, in_flight: bool = True) -> None:
        try:
            n = route.transport.abort_rail(route.link, rail.info.index, in_flight)
        except Exception:
            log.exception("transport %s failed to abort rail %s", route.transport.name, rail.info.name)
            return
        if n:
            log.info("re-routing %d queued slice(s) off rail %s", n, rail.info.name)

    # ---- host-wide load sharing -------------------------------------------------------------------

    def _share_load(self, shared: SharedRailLoad, rail: Rail) -> None:
        key = rail.load_key
        if not key:
            key = rail.load_key = shared_load_key(rail.transport, rail.info.name)
        tel = rail.telemetry
        try:
            others = shared.exchange(key, tel.inflight_bytes)
            tel.external_bytes = others if others > 0 else 0  # set_external, inline: every tick, every rail
        except (RuntimeError, OSError, ValueError) as exc:
            log.warning("shared rail load table unusable (%s); each process now sees only its own load", exc)
            _SHARED_LOADS[self.config.qos.shared_load_name] = False

    def _shared_load(self) -> SharedRailLoad | None:
        """The host-wide rail load table of this engine's `qos.shared_load_name` (one per name and
        process), or None when off or unavailable."""
        qos = self.config.qos
        if not qos.shared_load:
            return None
        table = _SHARED_LOADS.get(qos.shared_load_name)
        if table is None:
            try:
                table = SharedRailLoad(config=qos)
                # the last process out removes the table; closed after the health ticks (see there)
                atexit.register(close_shared_load, qos.shared_load_name)
            except (OSError, ValueError) as exc:
                log.warning("shared rail load table unavailable (%s); each process sees only its own load", exc)
                table = False
            _SHARED_LOADS[qos.shared_load_name] = table
        return table or None


def close_shared_load(name: str | None = None) -> None:
    """Close the process's host-wide rail load table `name` (every one when None; at exit): ordered
    after the health ticks, so that none uses it once closed (engines never closed still tick until
    the process ends). A tick that started before finishes first; later ones find no table."""
    tables = []
    for n in [name] if name is not None else list(_SHARED_LOADS):
        table = _SHARED_LOADS.get(n)
        _SHARED_LOADS[n] = False
        if table:
            tables.append(table)
    if tables:
        PROGRESS.wait_idle(5.0)
        for table in tables:
            table.close()


def _attempt(retry: int, hints: int, rounds: int) -> int:
    """A slice's `attempt` field (abi.py): its retries in a row (what the Router limits), the
    executor hints of its request, and the times it waited for a path (its back-off step)."""
    return (min(rounds, MAX_ROUNDS) << ROUND_SHIFT) | hints | min(retry, ATTEMPT_MASK)


@dataclass(eq=False)
class _Parked:
    """A slice that found no usable path, waiting to be re-issued."""

    handle: BatchHandle
    route: Route
    decision: Any
    opcode: int
    local: int
    remote: int
    length: int
    status: int  # its last failure
    rounds: int  # times it waited so far (this one included)
    hints: int  # executor hints of its request (abi.HINT_MASK bits)
    not_before: float  # its own back-off: a slice that keeps failing waits longer each time


@dataclass(eq=False)
class _PeerWait:
    next_canary: float
    backoff: float
    entries: list[_Parked] = field(default_factory=list)
    turn: int = 0  # canaries rotate over the rails


class PeerWatch:
    """Runs the peer directory's liveness checks (blocking: a TCP connect and a describe, each
    bounded) on one daemon thread per engine, off the progress thread and the submit path, and
    feeds the results to each peer's `PeerLiveness`."""

    def __init__(self, peers: PeerDirectory, timeout: float) -> None:
        self._peers = peers
        self._timeout = timeout
        self._cv = threading.Condition()
        self._queue: list[Peer] = []
        self._stop = False
        self._thread: threading.Thread | None = None

    def request(self, peer: Peer) -> None:
        with self._cv:
            if self._stop:
                with peer.lock:
                    peer.liveness.check_lost(time.monotonic())
                return
            if peer not in self._queue:
                self._queue.append(peer)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tent-peer-watch", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                peer = self._queue.pop(0)
            try:
                result, detail = self._peers.check(peer, self._timeout)
            except Exception as exc:  # a check must never kill the watch
                log.exception("liveness check of %s failed", peer.engine_id)
                result, detail = CheckResult.NO_ANSWER, f"check failed: {type(exc).__name__}: {exc}"
            with peer.lock:
                was = peer.liveness.state
                peer.liveness.on_check(time.monotonic(), result, detail)
                now_state = peer.liveness.state
            if now_state is not was:
                if PeerState.DEAD in (was, now_state):
                    self._peers.on_change()  # cached plans must not send to a dead peer (nor skip a revived one)
                level = logging.WARNING if PeerState.DEAD in (was, now_state) else logging.DEBUG
                log.log(level, "engine %s: %s -> %s (%s: %s)", peer.engine_id, was.value, now_state.value, result.value, detail)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self._timeout * 3 + 1)


class ProgressClient(Protocol):
    """What the progress thread calls on an attached owner (an Engine)."""

    config: EngineConfig

    def _handle_failure(self, handle: BatchHandle, rec: np.void) -> None: ...

    def _health_tick(self, now: float) -> bool: ...


_AWAKE, _ARMED, _IDLE = 0, 1, 2  # native.c's progress watch states


class Progress:
    """One process-wide thread: takes retryable slice failures from the native queue and hands
    them to the owner of the batch; ticks every owner's health; expires batches past deadline.

    It ticks every `HEALTH_TICK_S` while an owner's tick says something needs watching or a batch
    is tracked in flight. Once neither held and no submit came for `progress_idle_after_s`, it
    sleeps `progress_idle_s` between ticks; the native submit path (every slice handed to an
    executor) wakes it through the failure eventfd, which the thread waits on anyway. The handshake
    lives in native.c (`progress_arm` / `progress_sleep` / the submit's `progress_poke`): a submit
    that races the decision to sleep either disarms it or finds it asleep and signals, never neither.
    """

    def __init__(self) -> None:
        # a plain lock under the condition: the thread takes it around every call into an owner,
        # and `with` on it runs no Python code (a Condition's own __enter__ and notify_all do, ~50
        # us of a cold tick's CPU: docs/benchmarks.md, the health tick); never taken re-entrantly
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._waiters = 0  # threads waiting in detach / wait_idle for a call to end (held: _lock)
        self._owners: set[Any] = set()
        self._busy: Any = None  # the owner the thread is calling into right now
        self._inflight: dict[int, BatchHandle] = {}
        self._thread: threading.Thread | None = None
        self._idle_s = EngineConfig.progress_idle_s
        self._idle_after_s = EngineConfig.progress_idle_after_s
        self._quiet_since: float | None = None  # armed since (no submit, nothing to watch)
        self._sleeping = False
        self.ticks = 0  # health-tick rounds run (an idle process runs about one per progress_idle_s)
        self.wakeups = 0  # times the thread woke: its cadence, a failure, a submit after a sleep

    def _settings(self) -> None:
        """The smallest idle interval of the attached engines rules (held: self._cv)."""
        cfgs = [o.config for o in self._owners if isinstance(getattr(o, "config", None), EngineConfig)]
        self._idle_s = min((c.progress_idle_s for c in cfgs), default=EngineConfig.progress_idle_s)
        self._idle_after_s = min((c.progress_idle_after_s for c in cfgs), default=EngineConfig.progress_idle_after_s)

    def attach(self, owner: ProgressClient) -> None:
        with self._cv:
            self._owners.add(owner)
            self._settings()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tent-progress", daemon=True)
                self._thread.start()
        self.wake()  # the new owner's first ticks come at the cadence, not after a sleep

    def wake(self) -> None:
        """Tick at the cadence again now (what a submit does): for whoever starts something the
        health tick must watch other than by a submit."""
        _native.progress_wake()

    def detach(self, owner: ProgressClient) -> None:
        """After return the thread never calls into `owner` again (it waits for a call in progress,
        unless called from that very call)."""
        with self._cv:
            self._owners.discard(owner)
            self._settings()
            if threading.current_thread() is not self._thread:
                while self._busy is owner:
                    self._waiters += 1
                    try:
                        self._cv.wait()
                    finally:
                        self._waiters -= 1

    def wait_idle(self, timeout: float) -> bool:
        """Wait (at most `timeout`) until the thread is not calling into any owner; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._busy is not None and threading.current_thread() is not self._thread:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._waiters += 1
                try:
                    self._cv.wait(left)
                finally:
                    self._waiters -= 1
        return True

    @property
    def inflight(self) -> dict[int, BatchHandle]:
        """token -> handle of batches with slices out; the native fast path adds its batches here."""
        return self._inflight

    def track(self, handle: BatchHandle) -> None:
        self._inflight[handle._batch.token] = handle

    def untrack(self, handle: BatchHandle) -> None:
        self._inflight.pop(handle._batch.token, None)

    def _call(self, owner: Any, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        """Run `fn(*args)` as a call into `owner` unless it is detached: (False, None) if it was,
        else (True, what it returned)."""
        with self._lock:
            if owner not in self._owners:
                return False, None
            self._busy = owner
        try:
            out = fn(*args)
        finally:
            with self._lock:
                self._busy = None
                if self._waiters:
                    self._cv.notify_all()
        return True, out

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
                if not self._call(owner, owner._handle_failure, handle, rec)[0]:
                    handle._batch.fail_slice(status)  # its engine is closed: nothing retries it
            except Exception as exc:
                log.exception("retry handling failed")
                if handle.failure_detail is None:
                    handle.failure_detail = f"internal error while retrying: {type(exc).__name__}: {exc}"
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
        asleep = self._sleeping
        # asleep, a submit's wake-up is followed by one cadence of waiting in C: the thread takes the
        # GIL 10 ms later, not while the request that woke it completes (a failure still ends it)
        if _native.progress_wait(self._idle_s, HEALTH_TICK_S) if asleep else _native.progress_wait(HEALTH_TICK_S):
            self._failures()
        self.wakeups += 1
        now = time.monotonic()
        if asleep and _native.progress_state()[0] != _IDLE:
            # a submit woke it (or a retry of a failure just handled): back to the cadence
            self._sleeping = False
            self._quiet_since = None
        if now - last_tick >= HEALTH_TICK_S:
            last_tick = now
            watch = False
            with self._lock:
                owners = list(self._owners)
            for owner in owners:
                try:
                    watch = bool(self._call(owner, owner._health_tick, now)[1]) or watch
                except Exception:
                    log.exception("health tick failed")
                    watch = True
            self.ticks += 1
            self._pace(now, watch or bool(self._inflight))
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

    def _pace(self, now: float, watch: bool) -> None:
        """After a tick: keep the cadence while something needs watching, else arm, and sleep once
        armed for `progress_idle_after_s` without a submit."""
        if watch or self._idle_s <= 0:
            self._quiet_since = None
            if self._sleeping:
                self._sleeping = False
                _native.progress_resume()
            return
        if self._sleeping:
            return  # slept its interval, nothing to watch: sleep on
        if self._quiet_since is None or _native.progress_state()[0] == _AWAKE:
            _native.progress_arm()  # a submit from here on disarms it
            self._quiet_since = now
        elif now - self._quiet_since >= self._idle_after_s:
            self._sleeping = _native.progress_sleep()  # False: a submit came just now
            if not self._sleeping:
                self._quiet_since = None


PROGRESS = Progress()

__all__ = ["HEALTH_TICK_S", "PROBE_BYTES", "PROBE_SEGMENT", "PROGRESS", "PeerWatch", "Progress", "Recovery"]
