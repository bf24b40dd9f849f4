"""Per-rail telemetry: bandwidth estimate, completion latency, queued bytes, predicted cost.

The native completion path keeps, per rail, a row of cumulative int64 counters whose layout is
`enum tent_stat_field` in ``include/tent/executor_abi.h`` (mirrored by `tent_core.abi.StatField`):

    inflight_bytes, inflight_slices, bytes_done, slices_done, errors,
    latency_ns_sum, last_latency_ns, last_complete_ns      (CLOCK_MONOTONIC ns)
    serving, progress_ns, bytes_moved, congestion          (service telemetry, from host->note)

`inflight` counts slices from submit to completion, queue included; `serving` counts the pieces an
executor is working on right now and `progress_ns` stamps the last byte moved (or service start).
Stall detection uses only the latter: a rail is stalled when it serves something and nothing moved
for a while, never because slices wait in a queue (a deep queue is load, not a fault).

`RailTelemetry.observe(row, now_ns)` turns successive snapshots of that row into the quantities the
cost model of the paper (section 4.2, eq. 1) needs:

    t = (b0 + b1 * (A + L) / B) * P

with A the bytes queued on the rail (in flight + assigned by the scheduler but not yet seen by the
executor + other processes' load on the same NIC), B the bandwidth estimate and P the topology
penalty. Everything here is pure arithmetic on numbers passed in: no clocks, no sockets, no threads,
so tests drive it with synthetic rows.

Bandwidth (paper eq. 2, "peak-picking"): every observation yields a few *lower bounds* on what the
rail can carry (each is conservative for a different reason, so the largest is the best):

* per slice, L / tau (mean slice bytes over mean slice latency): exact for one slice at a time,
  too low when slices queue behind each other;
* Little's law, min(inflight before, inflight after) / tau: right when slices queue (latency includes
  the queue), kept conservative by using the smaller of the two inflight snapshots. Only while the
  queue holds or grows: a burst draining away (slices all submitted at once, as one large batch is)
  completes early slices after short waits with the whole burst still queued behind them, and
  inflight / tau would then claim up to burst-size times the real rate. Only for executors without
  service telemetry: a new request landing on a draining burst passes that guard and reads the
  same multiple, and the goodput while busy (below) measures a queued rail directly;
* goodput while busy: with service telemetry, bytes moved during intervals the rail was serving the
  whole time, over those intervals, once they add up to half a window (a shorter busy time carries
  over to the next window, and that window folds no per-slice sample: see `_roll_window`).
  Without it (completions only), bytes completed from one completion to a later one while the
  rail held work the whole time, over the time between the two, summed over spans of at least
  `rate_span_completions` completions and one window (shorter ones carry over to the next window),
  so that a slow rail whose slices take longer than a window is measured at its rate, not at
  "one slice per window". While such a span is open the per-slice sample is left out (its latency
  includes the queue).
* goodput while holding work: bytes completed from a snapshot at which the rail held nothing (so
  every one of them was submitted after it) to the next such snapshot, over that time (up to the
  last completion); idle time at either end only lowers it. Counted only where the per-slice
  sample would count alone, in a window of a rail (with service telemetry) that has not yet shown
  a busy rate and served no two consecutive snapshots: a request that fits between two of them (a
  32 MiB read of ~40 ms on loopback, whose health ticks came 43 ms apart on a loaded host) left the
  queue-inclusive per-slice sample, 512 KiB over ~17 ms of mean latency = 0.03 GB/s, to replace the
  prior of a fresh rail that had moved 30 MiB in those 43 ms; with probes off the spray then gave
  that rail nothing, so nothing ever measured it again. (Bytes counted as they move, over the
  intervals they moved in, are no such bound: they are counted at the socket, and a receiver that
  drains a buffer filled while it waited for a core read 2.2 GB/s for a ~1 GB/s loopback rail.)

Within a measurement window the largest sample is kept (the "cleanest path condition": application
load and idle gaps only ever make samples smaller), clamped to the nominal rate when it is known, and
the window peaks are EWMA-smoothed (when the nominal rate is unknown, the first window that measured
a rate over bytes and time, either goodput, replaces the made-up prior instead; one whose best
sample is a per-slice latency, queue included, moves it only as far as the EWMA does). A rail that
stops completing anything produces no samples, so its estimate does not move; its queue A grows
instead and with it its cost, and `is_stalled` says so explicitly (a downed veth gives no socket
error: traffic just stops). `service_rate_Bps` is the rate of the last window in which the rail
was busy serving, for comparing a rail with its siblings.

A low estimate is no life sentence, yet only a sample moves it. Samples are lower bounds, and one
from a bad moment (a sender descheduled on a loaded host, a cold connection) can leave a rail
looking far slower than its siblings; the spray then gives it nothing (water-filling by cost; mice
go to the cheapest rails) and nothing ever measures it again when probes are off or traffic is
mice only (probes spray only every `probe_every`-th elephant). `unconfirmed_s` says for how long
no window's sample confirmed the estimate while the rail held no work, and the scheduler gives a
rail unconfirmed for `SchedulerConfig.bandwidth_stale_s` one slice of the next elephant or the next
mouse (slice_scheduler.py): a rail that was only unlucky is measured again and rejoins the spray,
one that really is slow costs one slice per stale time and keeps its low estimate. Letting the
estimate itself climb back toward the prior instead was tried, and it makes the estimate up: a
1 MB/s rail (tc-shaped, tests/test_telemetry_completions.py) idle for 4 s while its
sibling drained was back at the 10 Gbit/s prior, where the next elephant's water-filling would
have given it nearly all its bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from .abi import STAT_FIELDS, StatField
from .config import SchedulerConfig

# Field indices in a native stats row (plain ints: read on every health tick).
INFLIGHT_BYTES = int(StatField.INFLIGHT_BYTES)
INFLIGHT_SLICES = int(StatField.INFLIGHT_SLICES)
BYTES_DONE = int(StatField.BYTES_DONE)
SLICES_DONE = int(StatField.SLICES_DONE)
ERRORS = int(StatField.ERRORS)
LATENCY_NS_SUM = int(StatField.LATENCY_NS_SUM)
LAST_COMPLETE_NS = int(StatField.LAST_COMPLETE_NS)
SERVING = int(StatField.SERVING)
PROGRESS_NS = int(StatField.PROGRESS_NS)
BYTES_MOVED = int(StatField.BYTES_MOVED)
CONGESTION = int(StatField.CONGESTION)
ROW_FIELDS = STAT_FIELDS
# progress stamps kept per rail for `RailTelemetry.moving_since`: at the health tick (10 ms) these
# reach back over 0.6 s of steady movement, past `RailHealthConfig.stall_cut_s`
PROGRESS_HISTORY = 64

_NS = 1e-9


class Delta(NamedTuple):
    """What changed on a rail between two observations (the engine feeds errors to RailMonitor)."""

    bytes_done: int
    slices_done: int
    errors: int
    congestion: int = 0  # congestion events the executor reported (soft: the slices went on)


class RailTelemetry:
    """Live model of one rail (one local/remote NIC pair of one transport).

    `slot` is the rail's index in the native stats array; `nominal_bps` is its nominal rate in
    *bits* per second as links are quoted (0 = unknown); `penalty` the topology penalty (>= 1,
    e.g. `SchedulerConfig.tier_penalty(tier)`). Bandwidth is kept in bytes per second.
    """

    __slots__ = (
        "slot",
        "name",
        "nominal_bps",
        "penalty",
        "bandwidth_Bps",
        "latency_s",
        "inflight_bytes",
        "inflight_slices",
        "pending_bytes",
        "external_bytes",
        "bytes_done",
        "slices_done",
        "errors",
        "last_complete_ns",
        "serving",
        "progress_ns",
        "_progress_seen",
        "bytes_moved",
        "service_rate_Bps",
        "service_rate_ns",
        "_prev_service",
        "_reports_service",
        "_b0",
        "_b1",
        "_alpha",
        "_window_ns",
        "_lo",
        "_hi",
        "_pending_ttl_ns",
        "_pending_ns",
        "_prev",
        "_prev_ns",
        "_window_start_ns",
        "_peak",
        "_peak_little",
        "_busy_bytes",
        "_busy_ns",
        "_held_from",
        "_holding",
        "_held_bytes",
        "_held_ns",
        "_nominal_Bps",
        "_measured",
        "_confirmed_ns",
        "_span_need",
        "_busy_slices",
        "_anchor",
        "_span_end",
        "_kept",
    )

    def __init__(
        self,
        slot: int,
        nominal_bps: float = 0.0,
        penalty: float = 1.0,
        config: SchedulerConfig | None = None,
        name: str = "",
    ) -> None:
        cfg = config or SchedulerConfig()
        self.slot = slot
        self.name = name or f"rail{slot}"
        self.nominal_bps = float(nominal_bps)
        self.penalty = float(penalty) if penalty > 0 else 1.0
        self._nominal_Bps = self.nominal_bps / 8.0 if self.nominal_bps > 0 else 0.0
        self._b0 = cfg.b0_s
        self._b1 = cfg.b1
        self._alpha = cfg.ewma_alpha
        self._window_ns = int(cfg.bandwidth_window_s * 1e9)
        self._pending_ttl_ns = int(cfg.pending_ttl_s * 1e9)
        if self._nominal_Bps > 0:
            self._lo = self._nominal_Bps * cfg.bandwidth_floor_fraction
            self._hi = self._nominal_Bps * cfg.bandwidth_cap_fraction
        else:
            self._lo = cfg.unknown_bandwidth_floor_Bps
            self._hi = float("inf")
        self.bandwidth_Bps = self._nominal_Bps or cfg.default_bandwidth_Bps
        # when a window's sample (or work held) last confirmed the estimate; -1: not observed yet
        self._confirmed_ns = -1
        self.latency_s = 0.0
        self.inflight_bytes = 0
        self.inflight_slices = 0
        self.pending_bytes = 0
        self.external_bytes = 0
        self.bytes_done = 0
        self.slices_done = 0
        self.errors = 0
        self.last_complete_ns = 0
        self.serving = 0
        self.progress_ns = 0
        # the distinct progress stamps observe() saw, newest last: whether this rail kept moving
        # tick after tick or only resumed after a gap (see `moving_since`)
        self._progress_seen: deque[int] = deque(maxlen=PROGRESS_HISTORY)
        self.bytes_moved = 0
        self.service_rate_Bps = 0.0  # rate of the last busy window (0: none yet)
        self.service_rate_ns = 0  # when it was measured
        self._prev_service = (0.0, 0)  # the busy window before that: (rate, ns)
        self._reports_service = False  # the executor reports host->note (service telemetry)
        self._pending_ns = 0
        self._prev: tuple[int, ...] | None = None
        self._prev_ns = 0
        self._window_start_ns = 0
        self._peak = 0.0
        self._peak_little = 0.0  # the Little's-law part of _peak
        self._busy_bytes = 0
        self._busy_ns = 0
        # goodput while holding work: (ns, bytes_done) of the last snapshot at which the rail held
        # nothing, whether it held work at a snapshot since, and this window's closed periods
        self._held_from: tuple[int, int] | None = None
        self._holding = False
        self._held_bytes = 0
        self._held_ns = 0
        self._measured = False  # a window measured a rate over bytes and time (the prior is gone)
        # completion spans (executors without service telemetry): (ns, bytes_done, slices_done) of
        # the completion that opened the current busy span, and of the latest one in it
        self._span_need = cfg.rate_span_completions
        self._busy_slices = 0  # completions in the spans folded into this window
        self._anchor: tuple[int, int, int] | None = None
        self._span_end: tuple[int, int, int] | None = None
        # snapshots observe_lazily keeps for the next fold: (row, ns), oldest first
        self._kept: list[tuple[tuple[int, ...], int]] = []

    @classmethod
    def from_rail_info(
        cls, info: object, slot: int | None = None, config: SchedulerConfig | None = None
    ) -> RailTelemetry:
        """Build from a `types.RailInfo` (nominal_gbps is Gbit/s; its index is the stats slot)."""
        gbps = float(getattr(info, "nominal_gbps", 0.0) or 0.0)
        return cls(
            slot=int(getattr(info, "index", 0) if slot is None else slot),
            nominal_bps=gbps * 1e9,
            penalty=float(getattr(info, "penalty", 1.0) or 1.0),
            config=config,
            name=str(getattr(info, "name", "")),
        )

    # ---- inputs ---------------------------------------------------------------------------------

    def observe(self, row: Sequence[int], now_ns: int) -> Delta:
        """Fold one snapshot of the rail's native stats row (taken at `now_ns`) into the model, after
        the snapshots `observe_lazily` kept (in order: the model is the same as folded one by one).

        Returns what completed / failed since the previous snapshot.
        """
        if self._kept:
            kept, self._kept = self._kept, []
            for r, ns in kept:
                self._fold(r, ns)
        return self._fold(row, now_ns)

    def observe_lazily(self, row: tuple[int, ...], now_ns: int, every: int) -> Delta:
        """`observe`, for a rail whose model no decision reads between two health ticks (the one rail
        of a single-rail route: the planner gives it every slice whatever its estimate). A snapshot
        that shows nothing but traffic since the previous one (no error, no congestion report) is
        kept and folded later, with the others kept, in order, at the `every`-th call (or at the
        next `observe`): the model comes out as folded tick by tick, since it is a function of the
        snapshots and their times (only bytes a plan assigned meanwhile, `add_pending`, are matched
        against the executor's count a little later), while a cold health tick skips its most
        expensive part (docs/benchmarks.md, the health tick). The counters (in flight, serving, done) are
        taken at once either way. `row`: a tuple of ints (`RailTable.snapshot`). Returns what
        changed since the previous snapshot, as `observe` does."""
        kept = self._kept
        last = kept[-1][0] if kept else self._prev
        if (
            last is None
            or len(kept) + 1 >= every
            or len(row) != ROW_FIELDS
            or row[ERRORS] != last[ERRORS]
            or row[CONGESTION] != last[CONGESTION]
        ):
            return self.observe(row, now_ns)
        kept.append((row, now_ns))
        # what _fold sets first from the row, before it reads anything of its own (progress_ns is
        # compared there, so it waits for the fold)
        self.inflight_bytes = row[INFLIGHT_BYTES]
        self.inflight_slices = row[INFLIGHT_SLICES]
        self.bytes_done = row[BYTES_DONE]
        self.slices_done = row[SLICES_DONE]
        self.errors = row[ERRORS]
        self.last_complete_ns = row[LAST_COMPLETE_NS]
        self.serving = row[SERVING]
        self.bytes_moved = row[BYTES_MOVED]
        # tuple.__new__: a NamedTuple's own __new__ is Python code, one more to run cold
        return tuple.__new__(Delta, (row[BYTES_DONE] - last[BYTES_DONE], row[SLICES_DONE] - last[SLICES_DONE], 0, 0))

    @property
    def kept(self) -> int:
        """Snapshots `observe_lazily` keeps for the next fold."""
        return len(self._kept)

    def _fold(self, row: Sequence[int], now_ns: int) -> Delta:
        if type(row) is tuple and len(row) == ROW_FIELDS:
            cur = row  # RailTable.snapshot: plain ints already
        else:
            cur = tuple(int(x) for x in row[:ROW_FIELDS])
            if len(cur) < ROW_FIELDS:  # a row from before the service fields (synthetic in tests)
                cur += (0,) * (ROW_FIELDS - len(cur))
        infl_b = cur[INFLIGHT_BYTES]
        prev = self._prev
        self.inflight_bytes = infl_b
        self.inflight_slices = cur[INFLIGHT_SLICES]
        self.bytes_done = cur[BYTES_DONE]
        self.slices_done = cur[SLICES_DONE]
        self.errors = cur[ERRORS]
        self.last_complete_ns = cur[LAST_COMPLETE_NS]
        self.serving = cur[SERVING]
        if cur[PROGRESS_NS] and cur[PROGRESS_NS] != self.progress_ns:
            self._progress_seen.append(cur[PROGRESS_NS])
        self.progress_ns = cur[PROGRESS_NS]
        self.bytes_moved = cur[BYTES_MOVED]
        if cur[PROGRESS_NS] and not self._reports_service:
            self._reports_service = True  # from now on busy time is service time: drop the spans
            self._anchor = self._span_end = None
            self._busy_bytes = self._busy_ns = self._busy_slices = 0
        self._follow_holding(cur, now_ns)
        if prev is None:
            self._prev = cur
            self._prev_ns = now_ns
            self._window_start_ns = now_ns
            self._follow_confirmation(now_ns, False)
            return Delta(0, 0, 0)

        d_bytes = cur[BYTES_DONE] - prev[BYTES_DONE]
        d_slices = cur[SLICES_DONE] - prev[SLICES_DONE]
        d_errors = cur[ERRORS] - prev[ERRORS]
        d_congestion = cur[CONGESTION] - prev[CONGESTION]
        d_lat = cur[LATENCY_NS_SUM] - prev[LATENCY_NS_SUM]
        prev_infl = prev[INFLIGHT_BYTES]

        # Reconcile the scheduler's own not-yet-seen assignments with what the executor accounted.
        if self.pending_bytes:
            seen = (infl_b + cur[BYTES_DONE]) - (prev_infl + prev[BYTES_DONE])
            if seen > 0:
                self.pending_bytes = max(0, self.pending_bytes - seen)
            if now_ns - self._pending_ns > self._pending_ttl_ns:
                self.pending_bytes = 0

        if d_slices > 0 and d_bytes > 0 and d_lat > 0:
            mean_lat_s = d_lat * _NS / d_slices
            a = self._alpha
            self.latency_s = mean_lat_s if self.latency_s <= 0 else (1 - a) * self.latency_s + a * mean_lat_s
            sample = (d_bytes / d_slices) / mean_lat_s  # one slice at a time
            # Little's law only without service telemetry, which measures a queued rail directly.
            # The guard below cannot tell a draining burst from one with a new request on top: the
            # burst's first slices complete after short waits while the new request's bytes count
            # as queued, and inflight / latency claimed 2x a half-rate rail's rate (capped at its
            # nominal 1 Gbit/s) in every other window of the open loop, so the spray gave it the
            # share of a fast rail and the request ended 100 ms after the others.
            if infl_b >= prev_infl and not self._reports_service:
                little = min(prev_infl, infl_b) / mean_lat_s
                if little > self._peak_little:
                    self._peak_little = little
                if little > sample:
                    sample = little
            if sample > self._peak:
                self._peak = sample
        # While the rail stays busy the whole interval, what it delivered is its capacity: this is
        # the estimate that holds under deep queues, where queue-inclusive latencies mislead. With
        # service telemetry, "busy" means serving and bytes count as they move, so a slow rail shows
        # its rate within one window even when its slices take longer than that.
        dt = now_ns - self._prev_ns
        if self._reports_service:
            if prev[SERVING] > 0 and cur[SERVING] > 0 and dt > 0:
                self._busy_bytes += cur[BYTES_MOVED] - prev[BYTES_MOVED]
                self._busy_ns += dt
        else:
            self._follow_completions(prev, cur, prev_infl, infl_b)

        if now_ns - self._window_start_ns >= self._window_ns:
            self._roll_window(now_ns)
        self._follow_confirmation(now_ns, d_slices > 0)
        self._prev = cur
        self._prev_ns = now_ns
        return Delta(d_bytes, d_slices, d_errors, d_congestion)

    def _follow_confirmation(self, now_ns: int, completed: bool) -> None:
        """A completion (its sample waits in the open window) or work held confirms the estimate as
        a window's sample does: the rail is not left out, and a rail that holds work and completes
        nothing is a stall, priced by its queue."""
        if (
            completed
            or self._confirmed_ns < 0
            or self.inflight_slices > 0
            or self.inflight_bytes > 0
            or self.serving > 0
            or self.pending_bytes > 0
        ):
            self._confirmed_ns = now_ns

    def _follow_holding(self, cur: tuple[int, ...], now_ns: int) -> None:
        """Periods from a snapshot at which the rail held nothing to the next one, with work held at
        a snapshot in between: what completed in one was all submitted within it."""
        if cur[INFLIGHT_SLICES] > 0 or cur[INFLIGHT_BYTES] > 0:
            self._holding = self._held_from is not None
            return
        if self._holding and self._held_from is not None:
            start_ns, start_done = self._held_from
            last = cur[LAST_COMPLETE_NS]
            end = last if start_ns < last <= now_ns else now_ns
            done = cur[BYTES_DONE] - start_done
            if done > 0 and end > start_ns:
                self._held_bytes += done
                self._held_ns += end - start_ns
        self._held_from = (now_ns, cur[BYTES_DONE])
        self._holding = False

    def _follow_completions(self, prev: tuple[int, ...], cur: tuple[int, ...], prev_infl: int, infl_b: int) -> None:
        """Completion spans: open one at a completion after which the rail still holds work, extend
        it at each later completion while it keeps holding work, close it when the rail drains."""
        event = (cur[LAST_COMPLETE_NS], cur[BYTES_DONE], cur[SLICES_DONE])
        completed = cur[SLICES_DONE] > prev[SLICES_DONE] and event[0] > 0
        if prev_infl <= 0:
            self._close_span()  # idle in between: the time since the anchor was not all service
        elif completed and self._anchor is not None and event[0] > self._anchor[0]:
            self._span_end = event
        if infl_b <= 0:
            self._close_span()
        elif completed and self._anchor is None:
            self._anchor = event

    def _close_span(self) -> None:
        """Fold the span measured so far into this window's busy totals; the next starts afresh."""
        a, e = self._anchor, self._span_end
        if a is not None and e is not None:
            self._busy_bytes += e[1] - a[1]
            self._busy_ns += e[0] - a[0]
            self._busy_slices += e[2] - a[2]
        self._anchor = self._span_end = None

    def _roll_window(self, now_ns: int) -> None:
        peak = self._peak
        busy_rate = 0.0
        # the window's best sample is a rate over bytes and time (either goodput), not
        # slices' queue-inclusive latencies alone; an executor without service telemetry has only
        # completions, so its samples all count as such
        rated = not self._reports_service
        if not self._reports_service:
            # completions only: the busy spans so far, the open one up to its latest completion
            # (which anchors the rest of it); spans too short to tell a rate carry over
            a, e = self._anchor, self._span_end
            if a is not None and e is not None:
                self._busy_bytes += e[1] - a[1]
                self._busy_ns += e[0] - a[0]
                self._busy_slices += e[2] - a[2]
                self._anchor, self._span_end = e, None
            if self._busy_slices >= self._span_need and self._busy_ns >= self._window_ns:
                busy_rate = self._busy_bytes / (self._busy_ns * _NS)
                self._busy_bytes = self._busy_ns = self._busy_slices = 0
            elif self._busy_slices or self._anchor is not None:
                # slices queued behind each other, so one slice's latency understates the rate:
                # only Little's law counts until the spans hold enough completions
                peak = self._peak_little
        elif self._busy_ns * 2 >= self._window_ns:
            busy_rate = self._busy_bytes / (self._busy_ns * _NS)
            self._busy_bytes = self._busy_ns = 0
        elif self._busy_ns > 0 or self.service_rate_ns:
            # Served for less than half a window (a request's first or last slices, or a short
            # request): too little to tell a rate, so the busy time carries over to the next
            # window. The per-slice samples are left out once the rail has shown a busy rate:
            # their latency runs from submit, so slices submitted in a burst queue behind each
            # other, and a rail serving k slices at once shows 1/k of its rate per slice. Folded
            # in, they read a 1 Gbit/s rail (two connections) anywhere from 0.45 to 0.95 Gbit/s at
            # each request's start, after whichever window the previous request ended in, and the
            # spray followed those estimates (docs/benchmarks.md, open loop).
            peak = 0.0
        elif self._held_ns > 0:
            # No busy rate yet and no busy interval: the per-slice samples (queue included) would
            # count alone, and for a fresh rail whose nominal rate is unknown they replace the prior
            # outright. The goodput while holding work is a lower bound too, and far closer when a
            # burst's slices queued behind each other (module docstring).
            held_rate = self._held_bytes / (self._held_ns * _NS)
            if held_rate >= peak:
                peak = held_rate
                rated = True
        if busy_rate > 0:
            self._prev_service = (self.service_rate_Bps, self.service_rate_ns)
            self.service_rate_Bps = busy_rate
            self.service_rate_ns = now_ns
            if busy_rate >= peak:
                peak = busy_rate
                rated = True
        if peak > 0:
            peak = min(max(peak, self._lo), self._hi)
            if not self._measured and not self._nominal_Bps and rated:
                self.bandwidth_Bps = peak  # the prior was made up: nothing to average with
            else:
                # Per-slice samples alone move a made-up prior only part of the way: the tail of a
                # burst that waited behind the rest (and for its connection) read 0.02 GB/s on a
                # fresh loopback rail while the window's bytes told nothing, and replacing the
                # prior with it left that rail out of the next request's spray.
                a = self._alpha
                self.bandwidth_Bps = (1 - a) * self.bandwidth_Bps + a * peak
            if rated:
                self._measured = True
            self._confirmed_ns = now_ns
        self._peak = self._peak_little = 0.0
        self._held_bytes = self._held_ns = 0
        self._window_start_ns = now_ns

    def add_pending(self, nbytes: int, now_ns: int = 0) -> None:
        """Account bytes a plan just assigned here, until observe() sees the executor take them."""
        self.pending_bytes += nbytes
        if now_ns:
            self._pending_ns = now_ns

    def set_external(self, nbytes: int) -> None:
        """Bytes other processes have queued on the same NIC (from `qos.SharedRailLoad.others`)."""
        self.external_bytes = max(0, int(nbytes))

    def reset_bandwidth(self) -> None:
        """Forget the estimate (paper: a re-admitted rail's cost is reset) and start from nominal."""
        if self._nominal_Bps > 0:
            self.bandwidth_Bps = self._nominal_Bps
        self._peak = 0.0
        self.pending_bytes = 0

    # ---- outputs --------------------------------------------------------------------------------

    @property
    def queued_bytes(self) -> int:
        """A in the cost model: in flight + just assigned + other processes' load."""
        return self.inflight_bytes + self.pending_bytes + self.external_bytes

    @property
    def pending_ns(self) -> int:
        """When a plan last assigned bytes to this rail (0: never)."""
        return self._pending_ns

    @property
    def confirmed_ns(self) -> int:
        """When a sample (or work held) last confirmed the bandwidth estimate (-1: not observed yet)."""
        return self._confirmed_ns

    @property
    def busy(self) -> bool:
        """Holds work: slices in flight or an executor serving."""
        return self.inflight_slices > 0 or self.inflight_bytes > 0 or self.serving > 0

    def predicted_cost(self, extra_bytes: int = 0) -> float:
        """Predicted seconds to finish `extra_bytes` more on this rail, times its penalty."""
        a = self.inflight_bytes + self.pending_bytes + self.external_bytes
        return (self._b0 + self._b1 * (a + extra_bytes) / self.bandwidth_Bps) * self.penalty

    def stall_s(self, now_ns: int) -> float:
        """Seconds this rail has been serving work without moving a byte (0 when it serves nothing).

        Time slices spend queued is not counted: only an executor's service telemetry (host->note)
        says a rail is serving. For an executor that does not report it, 0: its own progress
        timeout is what fails a dead rail's slices."""
        if self.serving <= 0 or not self.progress_ns:
            return 0.0
        return max(0.0, (now_ns - self.progress_ns) * _NS)

    def moving_since(self, gap_ns: float) -> int:
        """Start of this rail's current run of progress: the earliest stamp reached from the latest
        through observed stamps at most `gap_ns` apart (the oldest one kept, when the run reaches
        back past `PROGRESS_HISTORY` of them). 0 when no progress was seen."""
        seen = self._progress_seen
        if not seen:
            return 0
        start = seen[-1]
        for stamp in reversed(seen):
            if start - stamp > gap_ns:
                break
            start = stamp
        return start

    def unconfirmed_s(self, now_ns: int) -> float:
        """Seconds since a sample last confirmed this rail's estimate, while it held no work (0
        while it holds or was just given some, or before it was first observed)."""
        if self._confirmed_ns < 0 or self.busy:
            return 0.0
        last = self._confirmed_ns
        if self.pending_bytes > 0 and self._pending_ns > last:
            last = self._pending_ns
        return max(0.0, (now_ns - last) * _NS)

    def is_stalled(self, now_ns: int, min_s: float) -> bool:
        """True if the rail looks dead: serving and silent for longer than `min_s`."""
        return self.stall_s(now_ns) > min_s

    def normalized_rate(self, now_ns: int, max_age_ns: int) -> float | None:
        """The rail's recent service rate as a fraction of its nominal rate (bytes/s when the nominal
        is unknown), or None when it was not busy within `max_age_ns`: nothing fresh to judge by.
        The better of its last two busy windows counts, so one window in which its threads were
        not scheduled does not make a healthy rail look slow."""
        if not self.service_rate_ns or now_ns - self.service_rate_ns > max_age_ns:
            return None
        rate = self.service_rate_Bps
        prev_rate, prev_ns = self._prev_service
        if prev_ns and now_ns - prev_ns <= max_age_ns:
            rate = max(rate, prev_rate)
        return rate / self._nominal_Bps if self._nominal_Bps else rate

    def __repr__(self) -> str:
        return (
            f"RailTelemetry({self.name!r}, slot={self.slot}, B={self.bandwidth_Bps * 8 / 1e9:.3f}Gbit/s, "
            f"A={self.queued_bytes}, lat={self.latency_s * 1e3:.2f}ms, P={self.penalty})"
        )


def stalled(rails: Sequence[RailTelemetry], now_ns: int, stall_s: float) -> list[int]:
    """Positions of the rails (siblings: one peer, one transport) that serve work but moved no byte
    for `stall_s` while some sibling kept moving bytes through that silence: moving within the last
    `stall_s`, and tick after tick (no gap of its own as long as `stall_s`) for more than `stall_s`
    of the silent rail's silence. When every rail went silent (the peer, or our own CPU, is the
    suspect, not a rail) nothing is returned, the executors' progress timeouts and the peer's
    liveness checks take over; rails rarely fall silent at the same instant (a whole peer stops,
    and one rail's sender runs a scheduling delay later than its sibling's), and only a sibling
    still moving `stall_s` after the silence began tells a broken rail from a stopped peer. Nor do
    they resume at the same instant: when the whole process stood still for 150 ms (SIGSTOP in the
    reproduction; a loaded two-core host deschedules it so), the rail whose thread got a core first
    looked "moving" beside a sibling whose thread had not yet run, and that sibling was paused now
    and then; a sibling's progress counts only from where its own last gap ended."""
    limit_ns = stall_s * 1e9
    silent = [i for i, r in enumerate(rails) if r.serving > 0 and r.progress_ns and now_ns - r.progress_ns > limit_ns]
    if not silent:
        return silent
    moving = [
        (r.progress_ns, r.moving_since(limit_ns))
        for i, r in enumerate(rails)
        if i not in silent and r.progress_ns and now_ns - r.progress_ns <= limit_ns
    ]
    if not moving:
        return []
    return [i for i in silent if any(p - max(since, rails[i].progress_ns) > limit_ns for p, since in moving)]


def slowness(rails: Sequence[RailTelemetry], now_ns: int, window_s: float) -> dict[int, float]:
    """For `RailMonitor.check_outliers`: position -> 1 / (recent service rate as a fraction of the
    nominal rate), for the rails measured within `window_s`; a rail that moved nothing while serving
    is infinitely slow."""
    out: dict[int, float] = {}
    for i, r in enumerate(rails):
        rate = r.normalized_rate(now_ns, int(window_s * 1e9))
        if rate is not None:
            out[i] = 1.0 / rate if rate > 0 else float("inf")
    return out


__all__ = ["ROW_FIELDS", "Delta", "RailTelemetry", "slowness", "stalled"]
