"""Phase 2: cut a request into slices and bind each slice to a rail (paper 4.2, Algorithm 1).

`SliceScheduler.plan(length, rails, priority, weights)` returns `(rail position, offset, length)`
triples that cover `[0, length)` exactly. Offsets are absolute within the request, so slices may
complete in any order and a retried slice rewrites exactly its own bytes.

Slicing (as the C++ `submitTransferTasks`, minus its 64 KiB round-up, which could leave a stray
short tail): `n = clamp(length // min_slice_bytes, 1, max_slices_per_request)` slices of
`s = align_down(length / n)` bytes, the last one taking the remainder. Every slice is therefore at
least `min_slice_bytes` (only a request shorter than that is a single short slice), large requests
get fewer, bigger slices, and boundaries are `slice_align_bytes` aligned. This applies to what is
spread over rails (elephants) and to the baseline policies; under "spray" a mouse is not sliced
(step 3 below).

Rail choice, policy "spray" (TENT):

1. QoS filter: rails with weight 0 (PAUSED) are out; if a `PrioritySlots` is attached, rails whose
   current slot refuses `priority` are out too, unless that leaves none.
2. Cost: `RailTelemetry.predicted_cost(length)` per rail, t = (b0 + b1 (A + L) / B) P.
3. Mice (`length < small_request_threshold`): one slice, the whole request, on one rail, chosen
   round robin among the rails within (1 + gamma) of the best cost *divided by their health
   weight* (a DEGRADED rail looks twice as expensive); the only admitted rail when there is one.
   Latency matters, one rail avoids cross-rail skew, and cutting a request bound for one rail into
   `min_slice_bytes` pieces only turns it into several messages on that rail (a 256 KiB request
   was four 64 KiB ones). The submitter cuts a one-slice plan by the transport's `split_bytes`
   exactly as it cuts a request on a single-rail route, so a mouse is planned alike on one rail
   or many (over tcp, whose split is 1 MiB = the default threshold, it stays one slice). The
   choice (with step 1 and the stale rule of step 5) is `pick_mouse`, a pure function over plain
   per-rail numbers (`MouseView`): the engine's native fast path runs its C twin per request on
   a route of several rails (tent_core/dispatch.py, "the plan cache").
4. Elephants: water-filling in bytes (Algorithm 1's greedy form, continuous): each rail gets the
   bytes that make it finish at one common predicted time, counting what it already holds, so the
   rails end a request together instead of one slice apart (`spray_shares`). A rail's share is cut
   into slices of about the request's slice size (so they differ by rail, by less than one
   alignment unit within one), dealt in a smooth interleaved order so every rail works along the
   whole buffer. Every `probe_every`-th elephant is sprayed evenly instead (whole slices), so idle
   rails get fresh samples.
5. Stale rails: a rail whose estimate no sample confirmed for `bandwidth_stale_s` while it held no
   work (`RailTelemetry.unconfirmed_s`) gets the next mouse, or one slice (of the request's slice
   size) of the next elephant that water-filling left it out of, taken from the largest share: a
   64 KiB slice alone read 0.1 GB/s for a ~2 GB/s loopback rail (its latency is mostly overhead),
   a 512 KiB one is closer, and one sample moves the estimate half way (EWMA). Without it
   a rail read low in a bad moment is never given anything, so never measured again, whenever
   probes are off or only mice come (telemetry.py); the slice given marks it confirmed until its
   sample is folded, so one probe per stale time (plus a window), whatever the request rate.

Baselines for benchmarks: "round_robin" (slices dealt in turn, starting rail rotating per request),
"single" (everything on the first admitted rail), "stripe" (n equal contiguous parts, one per rail).

After planning, each rail's `pending_bytes` grows by what it was given, so back-to-back plans see
the load they just created before the executor accounts it (observe() reconciles).

Cost: pure Python over a handful of rails, a few microseconds per small request; no numpy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from typing import NamedTuple

from .config import SchedulerConfig
from .qos import PrioritySlots
from .rail_monitor import RailState
from .telemetry import RailTelemetry
from .types import Priority

log = logging.getLogger(__name__)

Plan = list[tuple[int, int, int]]


class NoRailError(RuntimeError):
    """No rail can take the request (all excluded): the caller fails over or defers."""


class SliceScheduler:
    """Stateful (round-robin cursors, probe counter) but otherwise pure; one per transport/peer."""

    def __init__(self, config: SchedulerConfig | None = None, qos: PrioritySlots | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.qos = qos
        self._min = self.config.min_slice_bytes
        self._max_n = self.config.max_slices_per_request
        self._align = self.config.slice_align_bytes
        self._theta = self.config.small_request_threshold
        self._tol = 1.0 + self.config.gamma
        self._policy = self.config.policy
        self._rr = 0  # mice / round_robin / stripe cursor
        self._elephants = 0  # probe counter
        self.probes = 0
        self.stale_probes = 0  # slices or mice given to stale rails
        self._stale_s = self.config.bandwidth_stale_s

    # ---- slicing --------------------------------------------------------------------------------

    def slice_sizes(self, length: int) -> tuple[int, int]:
        """(number of slices, size of every slice but the last) for a request of `length` bytes."""
        n = length // self._min
        if n <= 1:
            return 1, length
        if n > self._max_n:
            n = self._max_n
        size = (length // n) // self._align * self._align
        return n, size

    # ---- planning ------------------------------------------------------------------------------

    def _admitted(
        self, rails: Sequence[RailTelemetry], priority: int, weights: Sequence[float] | None, now_ns: int | None
    ) -> list[int]:
        n = len(rails)
        if weights is None:
            cand = list(range(n))
        else:
            if len(weights) != n:
                raise ValueError(f"{len(weights)} weights for {n} rails")
            cand = [i for i in range(n) if weights[i] > 0]
        if not cand:
            raise NoRailError("no usable rail (all paused or excluded)")
        if self.qos is not None and len(cand) > 1:
            t = time.monotonic_ns() if now_ns is None else now_ns
            self.qos.note(priority, t)
            if priority > 0:
                cand = self.qos.admitted(n, priority, t, cand)
        return cand

    def plan(
        self,
        length: int,
        rails: Sequence[RailTelemetry],
        priority: Priority | int = Priority.HIGH,
        weights: Sequence[float] | None = None,
        *,
        now_ns: int | None = None,
    ) -> Plan:
        """Slices `(index into rails, offset, length)` covering `[0, length)`; see module docstring.

        `weights` are health weights per rail (RailMonitor.weight: 1.0 / 0.5 / 0.0 = excluded).
        Raises NoRailError when every rail is excluded, ValueError on a bad length.
        """
        if length <= 0:
            if length == 0:
                return []
            raise ValueError(f"negative length {length}")
        policy = self._policy
        stamp = time.monotonic_ns() if now_ns is None else now_ns
        if policy == "spray" and length < self._theta:
            # a mouse: whole, on one rail. Cut into min_slice_bytes pieces it would only become
            # several messages on the same rail (issue 17); the caller cuts it by the transport's
            # split size, as it does every request on a single-rail route.
            if weights is not None and len(weights) != len(rails):
                raise ValueError(f"{len(weights)} weights for {len(rails)} rails")
            views = [mouse_view(t, 1.0 if weights is None else weights[i]) for i, t in enumerate(rails)]
            r, flags = pick_mouse(views, length, self._rr + 1, self.config, stamp, int(priority), self.qos)
            if r < 0:
                raise NoRailError("no usable rail (all paused or excluded)")
            if flags & MOUSE_RR:
                self._rr += 1
            if flags & MOUSE_STALE:
                self.stale_probes += 1
            rails[r].add_pending(length, stamp)
            return [(r, 0, length)]
        cand = self._admitted(rails, int(priority), weights, stamp)
        n, size = self.slice_sizes(length)
        if len(cand) == 1 or policy == "single":
            r = cand[0]
            out = self._uniform(r, n, size, length)
            rails[r].add_pending(length, stamp)
            return out
        if policy == "spray":
            stale = stale_rails(rails, cand, stamp, self._stale_s) if self._stale_s else []
            self._elephants += 1
            pe = self.config.probe_every
            if pe and self._elephants % pe == 0:
                self.probes += 1
                order = self._interleave(cand, self._even_counts(n, len(cand)))
            else:
                shares = spray_shares(length, self._rates(rails, cand, weights), self._min, self._align)
                if stale:
                    self.stale_probes += give_stale_slices(shares, [cand.index(r) for r in stale], size)
                out = self._cut(cand, shares, n, length)
                for r, b in zip(cand, shares, strict=True):
                    if b:
                        rails[r].add_pending(b, stamp)
                return out
        elif policy == "round_robin":
            start = self._rr
            self._rr += 1
            k = len(cand)
            order = [cand[(start + j) % k] for j in range(n)]
        elif policy == "stripe":
            # n equal contiguous parts, one per rail (uniform striping, as Mooncake TE / UCCL).
            k = len(cand)
            if n < k:
                start = self._rr
                self._rr += 1
                order = [cand[(start + j) % k] for j in range(n)]
            else:
                counts = self._even_counts(n, k)
                order = [r for r, c in zip(cand, counts, strict=True) for _ in range(c)]
        else:  # pragma: no cover - config validates
            raise ValueError(f"unknown policy {policy!r}")

        out: Plan = []
        off = 0
        last = n - 1
        given: dict[int, int] = {}
        for j, r in enumerate(order):
            ln = size if j < last else length - off
            out.append((r, off, ln))
            given[r] = given.get(r, 0) + ln
            off += ln
        for r, b in given.items():
            rails[r].add_pending(b, stamp)
        return out

    @staticmethod
    def _uniform(r: int, n: int, size: int, length: int) -> Plan:
        if n == 1:
            return [(r, 0, length)]
        out = [(r, j * size, size) for j in range(n - 1)]
        out.append((r, (n - 1) * size, length - (n - 1) * size))
        return out

    @staticmethod
    def _even_counts(n: int, k: int) -> list[int]:
        q, rem = divmod(n, k)
        return [q + (1 if j < rem else 0) for j in range(k)]

    @staticmethod
    def _rates(
        rails: Sequence[RailTelemetry], cand: list[int], weights: Sequence[float] | None
    ) -> list[tuple[float, float]]:
        """(predicted seconds until the rail is free, bytes per second) per candidate: health and
        topology shrink the rate, and a rail's queue counts at its own rate."""
        out: list[tuple[float, float]] = []
        for i in cand:
            r = rails[i]
            w = 1.0 if weights is None else weights[i]
            if w <= 0:
                out.append((float("inf"), 0.0))
                continue
            out.append((r.predicted_cost(0) / w, max(r.bandwidth_Bps * w, 1.0) / r.penalty))
        return out

    def _cut(self, cand: list[int], shares: list[int], n: int, length: int) -> Plan:
        """Slices for per-rail byte shares: rail j's share in floor(share * n / length) slices (at
        least one), so no slice is shorter than the request's slice size (or than the share when
        that is smaller), dealt interleaved; the request's unaligned tail joins the last slice."""
        al = self._align
        counts = [max(1, b * n // length) if b else 0 for b in shares]
        while sum(counts) > self._max_n:  # rails with a share under one slice each took a whole one
            j = max(range(len(counts)), key=counts.__getitem__)
            if counts[j] <= 1:
                break
            counts[j] -= 1
        pieces: dict[int, list[int]] = {}
        for r, b, k in zip(cand, shares, counts, strict=True):
            if not k:
                continue
            base = (b // k) // al * al
            pieces[r] = [base] * (k - 1) + [b - base * (k - 1)]
        order = self._interleave(cand, counts)
        out: Plan = []
        off = 0
        used = dict.fromkeys(pieces, 0)
        for r in order:
            ln = pieces[r][used[r]]
            used[r] += 1
            out.append((r, off, ln))
            off += ln
        if off != length:  # the sub-alignment remainder: only the last slice may end unaligned
            r, o, ln = out[-1]
            out[-1] = (r, o, ln + length - off)
        return out

    @staticmethod
    def _interleave(cand: list[int], counts: list[int]) -> list[int]:
        """Rail j appears counts[j] times, evenly spaced over the order (each of its slices sits at
        virtual time (k + 0.5) / counts[j]; sorting by it interleaves all rails smoothly)."""
        live = [(r, c) for r, c in zip(cand, counts, strict=True) if c > 0]
        if len(live) == 1:
            return [live[0][0]] * live[0][1]
        keyed = [((k + 0.5) / c, r) for r, c in live for k in range(c)]
        keyed.sort()
        return [r for _, r in keyed]

    # ---- retries -------------------------------------------------------------------------------

    @staticmethod
    def pick_retry_rail(
        rails: Sequence[RailTelemetry],
        failed_index: int,
        health_states: Sequence[RailState],
        tried: Collection[int] = (),
    ) -> int | None:
        """Rail for retrying a slice that failed on `failed_index` (paper 4.3, two-pass rotation).

        First pass: HEALTHY rails; second: DEGRADED ones. Within a pass, rails with the lowest
        topology penalty (affinity-matched) come first, then rotation order starting after the failed
        rail, so successive retries spread instead of hammering one neighbour. PAUSED rails and rails
        in `tried` are skipped; the failed rail itself is the last candidate of its pass (add it to
        `tried` to rule it out). None: no rail left, the caller fails over to another transport.
        """
        n = len(rails)
        if n == 0:
            return None
        start = failed_index + 1
        for want in (RailState.HEALTHY, RailState.DEGRADED):
            best: int | None = None
            best_key: tuple[float, float, int] = (0.0, 0.0, 0)
            for d in range(n):
                i = (start + d) % n
                if i in tried or health_states[i] != want:
                    continue
                # affinity first, then the rail that would finish soonest (the caller adds the
                # retried bytes to its pending count, so a burst of retries spreads out)
                key = (rails[i].penalty, rails[i].predicted_cost(0) if i != failed_index else float("inf"), d)
                if best is None or key < best_key:
                    best, best_key = i, key
            if best is not None:
                return best
        return None


class MouseView(NamedTuple):
    """What the mouse policy reads of one rail: plain numbers, as the native fast path keeps them
    per rail (`_native.FastPath.rail_publish`), so that both decide alike (`pick_mouse`)."""

    queued_bytes: int  # A of the cost model: in flight + assigned + other processes' load
    bandwidth_Bps: float
    penalty: float
    weight: float  # health weight (RailMonitor.weight); 0: excluded
    confirmed_ns: int  # when a sample last confirmed the estimate (-1: never observed)
    busy: bool  # held work at the last observation (in flight or serving)
    pending_bytes: int  # assigned by plans, not yet seen by the executor
    pending_ns: int  # when a plan last assigned some


MOUSE_RR = 1  # pick_mouse flags: the round-robin cursor was used (several near-best rails were looked at)
MOUSE_STALE = 2  # the mouse went to a stale rail to re-measure it


def mouse_view(tel: RailTelemetry, weight: float) -> MouseView:
    """A rail's telemetry as the mouse policy reads it."""
    return MouseView(
        tel.queued_bytes, tel.bandwidth_Bps, tel.penalty, weight, tel.confirmed_ns, tel.busy, tel.pending_bytes,
        tel.pending_ns,
    )


def pick_mouse(views: Sequence[MouseView], length: int, rr: int, config: SchedulerConfig, now_ns: int,
               priority: int = 0, slots: PrioritySlots | None = None) -> tuple[int, int]:
    """The rail (position in `views`) of a mouse of `length` bytes, and MOUSE_* flags; -1 when every
    rail is excluded (weight 0). Pure but for the QoS `slots`, noted as the planner notes them; the
    native fast path (`_native.mouse_pick`) computes the same from the same numbers, float operation
    for float operation, and notes the same slots (tests/test_mouse_policy.py).

    The admitted rails: weight > 0, then, with QoS slots and more than one left, those whose slot
    takes `priority` now (`PrioritySlots.admitted`). Among them: round robin (`rr`, the cursor after the caller's
    increment) among those whose predicted cost (b0 + b1 (A + L) / B) P, divided by the health
    weight, is within (1 + gamma) of the best; then, when `bandwidth_stale_s` is set and more than
    one rail is admitted, a rail unconfirmed for longer than that (`RailTelemetry.unconfirmed_s`)
    takes the mouse instead, the longest unconfirmed first, unless the pick is stale itself."""
    cand = [j for j, v in enumerate(views) if v.weight > 0]
    if not cand:
        return -1, 0
    if slots is not None and len(cand) > 1:
        slots.note(priority, now_ns)
        if priority > 0:
            cand = slots.admitted(len(views), priority, now_ns, cand)
    if len(cand) == 1:
        return cand[0], 0
    b0, b1 = config.b0_s, config.b1
    costs = [(b0 + b1 * (views[j].queued_bytes + length) / views[j].bandwidth_Bps) * views[j].penalty / views[j].weight
             for j in cand]
    limit = min(costs) * (1.0 + config.gamma)
    near = [j for j, c in zip(cand, costs, strict=True) if c <= limit]
    r = near[rr % len(near)]
    flags = MOUSE_RR
    stale_s = config.bandwidth_stale_s
    if stale_s:
        best_age, best = 0.0, -1
        r_stale = False
        for j in cand:
            v = views[j]
            if v.confirmed_ns < 0 or v.busy:
                continue
            last = v.confirmed_ns
            if v.pending_bytes > 0 and v.pending_ns > last:
                last = v.pending_ns
            age = max(0.0, (now_ns - last) * 1e-9)
            if age > stale_s:
                if j == r:
                    r_stale = True
                if age > best_age:
                    best_age, best = age, j
        if best >= 0 and not r_stale:  # one mouse re-measures a rail nothing else reaches
            r = best
            flags |= MOUSE_STALE
    return r, flags


def stale_rails(rails: Sequence[RailTelemetry], cand: Sequence[int], now_ns: int, stale_s: float) -> list[int]:
    """The candidates whose estimate no sample confirmed for more than `stale_s` while they held
    no work, longest unconfirmed first."""
    ages = [(rails[i].unconfirmed_s(now_ns), i) for i in cand]
    return [i for age, i in sorted(ages, key=lambda a: -a[0]) if age > stale_s]


def give_stale_slices(shares: list[int], stale: Sequence[int], slice_bytes: int) -> int:
    """Give each position in `stale` whose share is 0 `slice_bytes`, taken from the largest share
    while that keeps at least as much (in place; the total is unchanged). Returns how many got one."""
    given = 0
    for j in stale:
        if shares[j]:
            continue
        top = max(range(len(shares)), key=shares.__getitem__)
        if shares[top] < 2 * slice_bytes:
            break
        shares[top] -= slice_bytes
        shares[j] = slice_bytes
        given += 1
    return given


def spray_shares(length: int, rails: Sequence[tuple[float, float]], min_bytes: int, align: int) -> list[int]:
    """Bytes per rail for one request of `length` bytes: continuous water-filling.

    `rails` are (predicted seconds until the rail is free, bytes per second). Each rail gets what it
    can move between when it is free and a common level T, `(T - free_i) * rate_i`, with T chosen
    so that the shares add up to `length`: every rail given anything is predicted to finish at T,
    the request's earliest possible end. Whole slices (the older form) leave the rails up to one
    slice apart, and the request ends when the last one does: 64 MiB over 1, 1, 1 and 0.5 Gbit/s
    rails as 19, 18, 18 and 9 slices of 1 MiB ends 6 ms after 64 MiB over the rate sum, on every
    request. A rail whose share would fall below `min_bytes` is left out (its slice would cost
    more in overhead than it saves) and the level is found again without it. Shares are multiples
    of `align` (largest remainder) and sum to `length` rounded down to `align`; the caller adds
    the sub-alignment rest to its last slice. Pure arithmetic.
    """
    units = length // align
    k = len(rails)
    live = [j for j in range(k) if rails[j][1] > 0 and rails[j][0] != float("inf")]
    if not live:
        live = list(range(k))  # nothing usable by the model: an even split is the honest guess
        rails = [(0.0, 1.0)] * k
    while True:
        ideal = _level(length, [rails[j] for j in live])
        least = min(range(len(live)), key=ideal.__getitem__)
        if ideal[least] >= min_bytes or len(live) == 1:
            break
        del live[least]  # one at a time: each removal raises the level for the others
    want = [x / align for x in ideal]
    got = [int(u) for u in want]
    rest = units - sum(got)
    for i in sorted(range(len(live)), key=lambda i: got[i] - want[i])[: max(rest, 0)]:
        got[i] += 1
    out = [0] * k
    for j, u in zip(live, got, strict=True):
        out[j] = u * align
    return out


def _level(length: int, rails: Sequence[tuple[float, float]]) -> list[float]:
    """Bytes per rail (not rounded) that fill `length` to a common finish time."""
    order = sorted(range(len(rails)), key=lambda j: rails[j][0])
    # raise the level rail by rail: with the first m rails (earliest free) filling, T solves
    # sum (T - free_i) rate_i = length; it is valid while T <= the next rail's free time
    rate_sum = 0.0
    weighted = 0.0  # sum free_i * rate_i
    level = 0.0
    for m, j in enumerate(order):
        free, rate = rails[j]
        rate_sum += rate
        weighted += free * rate
        level = (length + weighted) / rate_sum
        nxt = rails[order[m + 1]][0] if m + 1 < len(order) else float("inf")
        if level <= nxt:
            break
    return [max(0.0, (level - free) * rate) for free, rate in rails]


__all__ = ["MOUSE_RR", "MOUSE_STALE", "MouseView", "NoRailError", "Plan", "SliceScheduler", "mouse_view", "pick_mouse", "spray_shares"]
