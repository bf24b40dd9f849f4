"""Rail telemetry for executors that report only completions (the RDMA executor, among others):
slow rails whose slices take longer than a measurement window, bursts submitted at once, rails
without a nominal rate. Plain data: synthetic stats rows, no sockets, no clocks."""

from __future__ import annotations

import pytest

from tent_core.config import SchedulerConfig
from tent_core.slice_scheduler import SliceScheduler
from tent_core.telemetry import RailTelemetry

KiB = 1024
MiB = 1024 * KiB
MS = 1_000_000  # ns
TICK = 10 * MS  # the engine's health tick


class BurstRail:
    """A rail that serves `qps` slices at a time at `rate` bytes/s, FIFO, and reports each
    completion (bytes, count, latency from submit, time of the last completion) the way the native
    stats row does; no service telemetry."""

    def __init__(self, rate: float, qps: int = 1) -> None:
        self.rate, self.qps = rate, qps
        self.queue: list[tuple[int, int]] = []  # (bytes, submit ns)
        self.serving: list[tuple[int, int, int]] = []  # (done at ns, bytes, submit ns)
        self.done_b = self.done_s = self.lat = self.last = 0

    def submit(self, n: int, size: int, now: int) -> None:
        self.queue += [(size, now)] * n
        self._start(now)

    def _start(self, now: int) -> None:
        while self.queue and len(self.serving) < self.qps:
            size, sub = self.queue.pop(0)
            # qps slices share the rate
            self.serving.append((now + int(size * self.qps / self.rate * 1e9), size, sub))

    def advance(self, now: int) -> None:
        while self.serving:
            self.serving.sort()
            t, size, sub = self.serving[0]
            if t > now:
                break
            self.serving.pop(0)
            self.done_b += size
            self.done_s += 1
            self.lat += t - sub
            self.last = t
            self._start(t)

    def row(self) -> list[int]:
        infl = [s for s, _ in self.queue] + [s for _, s, _ in self.serving]
        return [sum(infl), len(infl), self.done_b, self.done_s, 0, self.lat, 0, self.last, 0, 0, 0, 0]

    @property
    def idle(self) -> bool:
        return not self.queue and not self.serving


def run_bursts(rails: list[BurstRail], tels: list[RailTelemetry], bursts: int, n: int, size: int, t: int = 0) -> int:
    """Each burst: n slices of size submitted at once on every rail, ticks until all drained."""
    for tel, r in zip(tels, rails, strict=True):
        tel.observe(r.row(), t)
    for _ in range(bursts):
        for r in rails:
            r.submit(n, size, t)
        for _ in range(100_000):
            t += TICK
            for tel, r in zip(tels, rails, strict=True):
                r.advance(t)
                tel.observe(r.row(), t)
            if all(r.idle for r in rails):
                break
        t += 300 * MS  # the application between rounds
        for tel, r in zip(tels, rails, strict=True):
            tel.observe(r.row(), t)
    return t


@pytest.mark.parametrize("qps", [1, 2])
def test_slow_rails_with_slices_longer_than_a_window_are_measured_at_their_rates(qps):
    """1 MB/s and 0.5 MB/s rails (tc-shaped NICs), 128 KiB slices (131 and 262 ms each: longer than
    the 50 ms window), 32 submitted at once per burst, no nominal rate. Counting bytes per window
    read both as "one slice per window"; completion spans give each its rate."""
    rails = [BurstRail(1e6, qps), BurstRail(0.5e6, qps)]
    tels = [RailTelemetry(i) for i in range(2)]  # nominal unknown: prior 10 Gbit/s
    run_bursts(rails, tels, bursts=1, n=32, size=128 * KiB)
    assert tels[0].bandwidth_Bps == pytest.approx(1e6, rel=0.1)
    assert tels[1].bandwidth_Bps == pytest.approx(0.5e6, rel=0.1)
    run_bursts(rails, tels, bursts=2, n=32, size=128 * KiB, t=100_000 * MS)
    assert tels[0].bandwidth_Bps == pytest.approx(1e6, rel=0.1)
    assert tels[1].bandwidth_Bps == pytest.approx(0.5e6, rel=0.1)
    # the spray then gives the slow rail a third of an elephant, as its rate says
    plan = SliceScheduler(SchedulerConfig(probe_every=0)).plan(8 * MiB, tels)
    slow = sum(ln for r, _, ln in plan if r == 1)
    assert slow / (8 * MiB) == pytest.approx(1 / 3, abs=0.05)


def test_a_draining_burst_is_not_read_as_a_faster_rail():
    """All slices submitted at once: the first complete after short waits with the whole burst
    still queued. inflight / latency (Little's law) then claimed many times the rate; it only counts
    while the queue holds or grows."""
    rail, tel = BurstRail(2e6), RailTelemetry(0, 8 * 100e6)  # nominal 100 Mbit/s = 12.5 MB/s
    run_bursts([rail], [tel], bursts=3, n=64, size=64 * KiB)
    assert tel.bandwidth_Bps == pytest.approx(2e6, rel=0.1)  # was pinned at the 12.5 MB/s cap


def test_steady_queue_still_uses_littles_law():
    """Slices kept queued (a new one submitted per completion): the estimate is the rail's rate."""
    rail, tel = BurstRail(40e6, qps=2), RailTelemetry(0)
    t = 0
    tel.observe(rail.row(), t)
    rail.submit(16, 256 * KiB, t)
    for _ in range(300):
        t += TICK
        before = rail.done_s
        rail.advance(t)
        rail.submit(rail.done_s - before, 256 * KiB, t)
        tel.observe(rail.row(), t)
    assert tel.bandwidth_Bps == pytest.approx(40e6, rel=0.1)


def test_unknown_nominal_floor_and_prior():
    """Without a nominal rate the floor is absolute and small (a fraction of the made-up 10 Gbit/s
    prior pinned every rail under 10 Mbit/s at 1.25 MB/s), and the first measurement replaces the
    prior instead of being averaged with it."""
    cfg = SchedulerConfig()
    rail, tel = BurstRail(200e3), RailTelemetry(0, config=cfg)  # 1.6 Mbit/s
    assert tel.bandwidth_Bps == cfg.default_bandwidth_Bps
    run_bursts([rail], [tel], bursts=1, n=8, size=64 * KiB)
    assert tel.bandwidth_Bps == pytest.approx(200e3, rel=0.1)
    # a known nominal is a real prior: the EWMA moves from it, one window only part of the way
    known = RailTelemetry(0, 8 * 1e6, config=SchedulerConfig(bandwidth_window_s=1.0))  # 1 MB/s nominal
    run_bursts([BurstRail(0.25e6)], [known], bursts=1, n=8, size=64 * KiB)
    assert known.bandwidth_Bps == pytest.approx(0.5 * 1e6 + 0.5 * 0.25e6, rel=0.05)
    with pytest.raises(ValueError):
        SchedulerConfig(unknown_bandwidth_floor_Bps=0)
    with pytest.raises(ValueError):
        SchedulerConfig(rate_span_completions=0)


def _makespan(policy: str, rounds: int = 3) -> float:
    """Seconds to move one 8 MiB request over a 1 MB/s and a 0.5 MB/s rail (2 QPs each, completion
    telemetry only), the scheduler planning each request from what the rails showed so far."""
    rails = [BurstRail(1e6, qps=2), BurstRail(0.5e6, qps=2)]
    tels = [RailTelemetry(i) for i in range(2)]
    sched = SliceScheduler(SchedulerConfig(policy=policy, probe_every=0))
    t = 0
    for tel, r in zip(tels, rails, strict=True):
        tel.observe(r.row(), t)
    took = 0.0
    for _ in range(rounds):
        start = t
        for pos, _off, ln in sched.plan(8 * MiB, tels):
            rails[pos].submit(1, ln, t)
        while not all(r.idle for r in rails):
            t += TICK
            for tel, r in zip(tels, rails, strict=True):
                r.advance(t)
                tel.observe(r.row(), t)
        took = (max(r.last for r in rails) - start) / 1e9
        t += 300 * MS
        for tel, r in zip(tels, rails, strict=True):
            tel.observe(r.row(), t)
    return took  # the last round: after the first, spray has measured both rails


def test_spray_beats_round_robin_on_a_half_rate_completion_only_rail():
    """The two-VM RDMA bench's case: with the rails measured at their rates, spray finishes in
    the time of the rates' sum (12 Mbit/s of 12) and 1.5x faster than round robin, whose half on the
    slow rail decides."""
    spray, rr = _makespan("spray"), _makespan("round_robin")
    ideal = 8 * MiB / 1.5e6
    assert spray == pytest.approx(ideal, rel=0.08)
    assert rr / spray >= 1.4
