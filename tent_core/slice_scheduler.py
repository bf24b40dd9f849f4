"""Phase 2: cut a request into slices and bind each slice to a rail (paper 4.2, Algorithm 1).

`SliceScheduler.plan(length, rails, priority, weights)` returns `(rail position, offset, length)`
triples that cover `[0, length)` exactly. Offsets are absolute within the request, so slices may
complete in any order and a retried slice rewrites exactly its own bytes.

Slicing (as the C++ `submitTransferTasks`, minus its 64 KiB round-up, which could leave a stray
short tail): `n = clamp(length // min_slice_bytes, 1, max_slices_per_request)` slices of
`s = align_down(length / n)` bytes, the last one taking the remainder. Every slice is therefore at
least `min_slice_bytes` (only a request shorter than that is a single short slice), large requests
get fewer, bigger slices, and boundaries are `slice_align_bytes` aligned.

Rail choice, policy "spray" (TENT):

1. QoS filter: rails with weight 0 (PAUSED) are out; if a `PrioritySlots` is attached, rails whose
   current slot refuses `priority` are out too, unless that leaves none.
2. Cost: `RailTelemetry.predicted_cost(length)` per rail, t = (b0 + b1 (A + L) / B) P.
3. Mice (`length < small_request_threshold`): all slices on one rail, chosen round robin among the
   rails within (1 + gamma) of the best cost *divided by their health weight* (a DEGRADED rail
   looks twice as expensive). Latency matters, one rail avoids cross-rail skew.
4. Elephants: weighted proportional spray, weight_i = health_i / cost_i; slice counts by largest
   remainder, dealt in a smooth interleaved order so every rail works along the whole buffer.
   Every `probe_every`-th elephant is sprayed evenly instead, so idle rails get fresh samples.

Baselines for benchmarks: "round_robin" (slices dealt in turn, starting rail rotating per request),
"single" (everything on the first admitted rail), "stripe" (n equal contiguous parts, one per rail).

After planning, each rail's `pending_bytes` grows by what it was given, so back-to-back plans see
the load they just created before the executor accounts it (observe() reconciles).

Cost: pure Python over a handful of rails, a few microseconds per small request; no numpy.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Collection, Sequence

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
        cand = self._admitted(rails, int(priority), weights, now_ns)
        policy = self._policy
        stamp = time.monotonic_ns() if now_ns is None else now_ns

        n, size = self.slice_sizes(length)
        if len(cand) == 1 or policy == "single":
            r = cand[0]
            out = self._uniform(r, n, size, length)
            rails[r].add_pending(length, stamp)
            return out
        if policy == "spray":
            if length < self._theta:
                r = self._pick_near_best(length, rails, cand, weights)
                out = self._uniform(r, n, size, length)
                rails[r].add_pending(length, stamp)
                return out
            self._elephants += 1
            pe = self.config.probe_every
            if pe and self._elephants % pe == 0:
                self.probes += 1
                counts = self._even_counts(n, len(cand))
            else:
                counts = self._spray_counts(n, length, rails, cand, weights)
            order = self._interleave(cand, counts)
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

    def _pick_near_best(
        self, length: int, rails: Sequence[RailTelemetry], cand: list[int], weights: Sequence[float] | None
    ) -> int:
        """Round robin among rails whose (health-weighted) cost is within (1+gamma) of the best."""
        if weights is None:
            costs = [rails[i].predicted_cost(length) for i in cand]
        else:
            costs = [rails[i].predicted_cost(length) / weights[i] for i in cand]
        limit = min(costs) * self._tol
        near = [i for i, c in zip(cand, costs, strict=True) if c <= limit]
        self._rr += 1
        return near[self._rr % len(near)]

    @staticmethod
    def _even_counts(n: int, k: int) -> list[int]:
        q, rem = divmod(n, k)
        return [q + (1 if j < rem else 0) for j in range(k)]

    @staticmethod
    def _spray_counts(
        n: int, length: int, rails: Sequence[RailTelemetry], cand: list[int], weights: Sequence[float] | None
    ) -> list[int]:
        """Water-filling (Algorithm 1's greedy form): give each slice to the rail that would finish it
        first, counting what this plan already gave it. In steady state the shares follow the rails'
        rates; a plain 1/cost split would hand equal shares to rails whose queues are equal in time.
        """
        size = length / n
        finish: list[float] = []
        step: list[float] = []
        for i in cand:
            r = rails[i]
            w = 1.0 if weights is None else weights[i]
            rate = max(r.bandwidth_Bps * w, 1.0) / r.penalty  # health and topology shrink the rate
            finish.append(r.predicted_cost(0) / w if w > 0 else float("inf"))
            step.append(size / rate)
        counts = [0] * len(cand)
        heap = [(finish[j] + step[j], j) for j in range(len(cand))]
        heapq.heapify(heap)
        for _ in range(n):
            t, j = heap[0]
            counts[j] += 1
            heapq.heapreplace(heap, (t + step[j], j))
        return counts

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


__all__ = ["NoRailError", "Plan", "SliceScheduler"]
