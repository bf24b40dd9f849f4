"""Pure policy code: config, telemetry/cost model, slice scheduler, rail monitor, QoS."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tent_core.config import EngineConfig, QosConfig, RailHealthConfig, SchedulerConfig, load_config
from tent_core.qos import PrioritySlots, SharedRailLoad
from tent_core.rail_monitor import RailMonitor, RailState
from tent_core.recovery import shared_load_key
from tent_core.slice_scheduler import NoRailError, SliceScheduler, spray_shares
from tent_core.telemetry import RailTelemetry, slowness, stalled
from tent_core.types import Priority

KiB = 1024
MiB = 1024 * KiB
GBIT = 1e9
MS = 1_000_000  # ns


def row(inflight_b=0, inflight_s=0, done_b=0, done_s=0, errors=0, lat_sum=0, last_lat=0, last_done=0,
        serving=0, progress=0, moved=0, congestion=0):
    return [inflight_b, inflight_s, done_b, done_s, errors, lat_sum, last_lat, last_done,
            serving, progress, moved, congestion]


def rails_at(*gbits: float, cfg: SchedulerConfig | None = None) -> list[RailTelemetry]:
    return [RailTelemetry(i, g * GBIT, config=cfg) for i, g in enumerate(gbits)]


def check_cover(plan, length):
    pos = 0
    for _, off, ln in sorted(plan, key=lambda t: t[1]):
        assert off == pos and ln > 0
        pos += ln
    assert pos == length


# ---- config ---------------------------------------------------------------------------------------


def test_config_defaults_match_design():
    c = EngineConfig()
    assert c.scheduler.min_slice_bytes == 64 * KiB and c.scheduler.max_slices_per_request == 64
    assert c.scheduler.gamma == 0.1 and c.scheduler.probe_every == 100
    assert c.scheduler.tier_penalties == (1.0, 5.0, 10.0) and c.scheduler.policy == "spray"
    assert c.qos.rotation_interval_us == 200 and c.qos.active_window_us == 1_000_000
    assert c.health.error_threshold == 3 and c.health.congestion_multiplier == 2 and c.health.error_window_s == 10
    assert c.health.degraded_weight == 0.5
    assert c.request_deadline_s == 30 and c.max_retries_per_slice == 8 and c.max_transport_failovers == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.request_deadline_s = 1  # type: ignore[misc]
    assert c.scheduler.tier_penalty(0) == 1.0 and c.scheduler.tier_penalty(7) == 10.0


def test_load_config_dict_toml_env(tmp_path):
    c = load_config({"scheduler": {"gamma": 0.3, "policy": "stripe"}, "max_retries_per_slice": 2}, env={})
    assert c.scheduler.gamma == 0.3 and c.scheduler.policy == "stripe" and c.max_retries_per_slice == 2
    c = load_config({"transports": {"tcp": {"conns_per_rail": 2}}, "control_timeout_s": 1}, env={})
    assert c.transports == {"tcp": {"conns_per_rail": 2}} and c.control_timeout_s == 1.0
    assert EngineConfig().transports == {}
    p = tmp_path / "tent.toml"
    p.write_text("request_deadline_s = 5\n[health]\ncooldown_base_s = 0.3\n[scheduler]\ntier_penalties = [1, 2]\n")
    env = {"TENT_SCHEDULER_GAMMA": "0.25", "TENT_HEALTH_ERROR_THRESHOLD": "5", "TENT_SLICE_TIMEOUT_S": "1.5",
           "TENT_QOS_ACTIVE_WINDOW_US": "0", "TENT_SCHEDULER_TIER_PENALTIES": "1,3,9", "TENT_UNRELATED": "x"}  # fmt: skip
    c = load_config(p, env=env)
    assert c.request_deadline_s == 5.0 and c.health.cooldown_base_s == 0.3
    assert c.scheduler.gamma == 0.25 and c.health.error_threshold == 5 and c.slice_timeout_s == 1.5
    assert c.qos.active_window_us == 0 and c.scheduler.tier_penalties == (1.0, 3.0, 9.0)
    assert load_config(None, env={"TENT_CONFIG": str(p)}).request_deadline_s == 5.0
    with pytest.raises(KeyError):
        load_config({"scheduler": {"gamaa": 1}}, env={})
    with pytest.raises(ValueError):
        load_config({"scheduler": {"policy": "bogus"}}, env={})


# ---- telemetry -----------------------------------------------------------------------------------


def test_cost_model_formula():
    cfg = SchedulerConfig(b0_s=1e-5, b1=2.0)
    r = RailTelemetry(0, 8e9, penalty=5.0, config=cfg)  # 1 GB/s
    assert r.bandwidth_Bps == 1e9
    assert r.predicted_cost(1_000_000) == pytest.approx((1e-5 + 2.0 * 1e6 / 1e9) * 5.0)
    r.observe(row(inflight_b=3_000_000, inflight_s=3), 0)
    r.add_pending(1_000_000, 1)
    r.set_external(500_000)
    assert r.queued_bytes == 4_500_000
    assert r.predicted_cost(500_000) == pytest.approx((1e-5 + 2.0 * 5e6 / 1e9) * 5.0)


def test_bandwidth_peak_picking_and_ewma():
    cfg = SchedulerConfig(ewma_alpha=0.5, bandwidth_window_s=0.05)
    r = RailTelemetry(0, 10 * GBIT, config=cfg)  # nominal 1.25 GB/s
    t = 0
    r.observe(row(), t)
    done = lat = 0
    # One 1 MiB slice at a time; the rail now carries only 100 MB/s (10 ms per slice), except one
    # noisy slow sample in the window (peak picking must ignore it).
    for k in range(5):
        t += 10 * MS
        done += MiB
        lat += 10 * MS if k != 2 else 40 * MS
        r.observe(row(done_b=done, done_s=k + 1, lat_sum=lat, last_done=t), t)
    t += 10 * MS
    done += MiB
    lat += 10 * MS
    r.observe(row(done_b=done, done_s=6, lat_sum=lat, last_done=t), t)  # closes the 50 ms window
    true_bw = MiB / 0.010
    assert r.bandwidth_Bps == pytest.approx(0.5 * 1.25e9 + 0.5 * true_bw, rel=0.02)
    for _ in range(12):  # more windows at the same rate: the EWMA converges on the peak
        for _ in range(5):
            t += 10 * MS
            done += MiB
            lat += 10 * MS
            r.observe(row(done_b=done, done_s=done // MiB, lat_sum=lat, last_done=t), t)
    assert r.bandwidth_Bps == pytest.approx(true_bw, rel=0.01)
    assert r.latency_s == pytest.approx(0.010, rel=0.01)


def test_bandwidth_littles_law_with_queued_slices_and_clamp():
    r = RailTelemetry(0, 1 * GBIT, config=SchedulerConfig(bandwidth_window_s=0.01, ewma_alpha=1.0))  # 125 MB/s
    r.observe(row(inflight_b=8 * MiB, inflight_s=8), 0)
    # 8 MiB always queued, slices take 80 ms each (queueing) -> Little: 8 MiB / 80 ms = 104.9 MB/s
    r.observe(row(inflight_b=8 * MiB, inflight_s=8, done_b=MiB, done_s=1, lat_sum=80 * MS, last_done=10 * MS), 10 * MS)
    assert r.bandwidth_Bps == pytest.approx(8 * MiB / 0.08, rel=0.01)
    # Samples above nominal are clamped to it (paper eq. 2: min with the hardware rate).
    r.observe(
        row(inflight_b=80 * MiB, inflight_s=8, done_b=2 * MiB, done_s=2, lat_sum=90 * MS, last_done=20 * MS), 20 * MS
    )
    assert r.bandwidth_Bps == pytest.approx(125e6)


def test_telemetry_pending_reconcile_errors_and_stall():
    r = RailTelemetry(0, 1 * GBIT, config=SchedulerConfig(pending_ttl_s=1.0))
    r.observe(row(), 0)
    r.add_pending(3 * MiB, 1)
    d = r.observe(row(inflight_b=2 * MiB, inflight_s=2), 2 * MS)
    assert r.pending_bytes == 1 * MiB and d.errors == 0
    d = r.observe(row(inflight_b=2 * MiB, inflight_s=2, errors=2), 3 * MS)
    assert d.errors == 2
    # queued work that no executor serves yet is load, never a stall, however long it waits
    assert r.stall_s(10_000 * MS) == 0.0 and not r.is_stalled(10_000 * MS, min_s=0.05)
    # pending forgotten after its TTL even if never reconciled
    r.observe(row(inflight_b=2 * MiB, inflight_s=2, errors=2), 2 * 1_000 * MS)
    assert r.pending_bytes == 0


def test_stall_is_time_without_progress_while_served():
    r = RailTelemetry(0, 1 * GBIT)
    t0 = 1_000 * MS
    r.observe(row(inflight_b=8 * MiB, inflight_s=8), t0)
    # two pieces in service since t0; bytes keep moving: never stalled, however long the slices take
    for k in range(1, 40):
        t = t0 + k * 10 * MS
        r.observe(row(inflight_b=8 * MiB, inflight_s=8, serving=2, progress=t - MS, moved=k * 100_000), t)
        assert not r.is_stalled(t, min_s=0.05)
    # then nothing moves: stalled once the silence exceeds the limit, counted from the last byte
    last = t0 + 39 * 10 * MS - MS
    r.observe(row(inflight_b=8 * MiB, inflight_s=8, serving=2, progress=last, moved=39 * 100_000), last + 40 * MS)
    assert not r.is_stalled(last + 40 * MS, min_s=0.05)
    assert r.is_stalled(last + 60 * MS, min_s=0.05)
    assert r.stall_s(last + 60 * MS) == pytest.approx(0.060)
    # nothing in service (all queued or idle): not stalled
    r.observe(row(inflight_b=8 * MiB, inflight_s=8, serving=0, progress=last, moved=39 * 100_000), last + 70 * MS)
    assert not r.is_stalled(last + 500 * MS, min_s=0.05)


def _serving(tel: RailTelemetry, t: int, progress: int, moved: int = 0, serving: int = 2) -> None:
    tel.observe(row(inflight_b=4 * MiB, inflight_s=4, serving=serving, progress=progress, moved=moved), t)


def test_stalled_needs_a_sibling_that_moves():
    rails = rails_at(1, 1, 1)
    t = 10_000 * MS
    for r in rails:
        _serving(r, t - 500 * MS, t - 500 * MS)
    _serving(rails[0], t, t - 150 * MS)  # silent 150 ms
    _serving(rails[1], t, t - 2 * MS)  # moving
    _serving(rails[2], t, t - 30 * MS)  # a short gap is not a stall
    assert stalled(rails, t, 0.1) == [0]
    # every rail silent: the peer (or our CPU) is suspect, not a rail
    _serving(rails[1], t, t - 150 * MS)
    _serving(rails[2], t, t - 150 * MS)
    assert stalled(rails, t, 0.1) == []
    # a rail with nothing in service is never stalled (queued work is load)
    _serving(rails[0], t, t - 900 * MS, serving=0)
    _serving(rails[1], t, t - 1 * MS)
    _serving(rails[2], t, t - 1 * MS)
    assert stalled(rails, t, 0.1) == []


def test_stalled_ignores_a_sibling_that_stopped_a_little_later():
    """A whole peer stops: its rails fall silent a scheduling delay apart (60 ms here). The later
    one's last bytes are recent, but it stopped too: no rail is stalled, whatever the cut window."""
    rails = rails_at(1, 1)
    t = 10_000 * MS
    for r in rails:
        _serving(r, t - 500 * MS, t - 500 * MS)
    _serving(rails[0], t, t - 320 * MS)  # silent past the cut window
    _serving(rails[1], t, t - 260 * MS)  # stopped 60 ms later
    assert stalled(rails, t, 0.1) == []
    assert stalled(rails, t, 0.3) == []
    # a sibling still moving long after the silence began: that rail is broken, not the peer
    _serving(rails[1], t, t - 5 * MS)
    assert stalled(rails, t, 0.1) == [0] and stalled(rails, t, 0.3) == [0]


def test_slowness_from_fresh_service_rates_only():
    cfg = SchedulerConfig(bandwidth_window_s=0.05, ewma_alpha=1.0)
    rails = rails_at(1, 1, 2, 1, cfg=cfg)
    rates = [125e6, 120e6, 250e6, 6e6]  # rail 2 is a 2 Gbit/s rail at full rate; rail 3 is at ~5%
    for r in rails:
        _serving(r, 0, 1)
    for k in range(1, 11):
        t = k * 10 * MS
        for r, rate in zip(rails[:3], rates[:3], strict=True):
            _serving(r, t, t, moved=int(rate * t / 1e9))
        if k <= 5:
            _serving(rails[3], t, t, moved=int(rates[3] * t / 1e9))
    slow = slowness(rails, 100 * MS, 1.0)
    assert slow[0] == pytest.approx(1.0, rel=0.05) and slow[2] == pytest.approx(1.0, rel=0.05)
    assert slow[3] == pytest.approx(125 / 6, rel=0.05)
    m = RailMonitor(RailHealthConfig(outlier_ratio=4.0))
    assert m.check_outliers(slow, 0.1) == [3]
    assert slowness(rails, 5_000 * MS, 1.0) == {}  # nothing measured within the last second


def test_one_slow_window_is_not_an_outlier():
    """A healthy rail whose threads were not scheduled for one window keeps its rate; a rail slow
    for two windows in a row is slow."""
    cfg = SchedulerConfig(bandwidth_window_s=0.05, ewma_alpha=1.0)
    r = RailTelemetry(0, 1 * GBIT, config=cfg)
    moved, t = 0, 0
    _serving(r, t, 1)
    for rate in (125e6, 125e6, 3e6):  # two 50 ms windows at full rate, then one nearly idle
        for _ in range(5):
            t += 10 * MS
            moved += int(rate * 0.01)
            _serving(r, t, t, moved=moved)
    assert r.normalized_rate(t, 1_000 * MS) == pytest.approx(1.0, rel=0.05)
    for _ in range(5):  # slow again: now it is slow
        t += 10 * MS
        moved += int(3e6 * 0.01)
        _serving(r, t, t, moved=moved)
    assert r.normalized_rate(t, 1_000 * MS) == pytest.approx(0.024, rel=0.1)


def test_service_rate_counts_bytes_as_they_move():
    """A slow rail shows its rate within one window even though none of its slices completes."""
    cfg = SchedulerConfig(bandwidth_window_s=0.05, ewma_alpha=1.0)
    r = RailTelemetry(0, 1 * GBIT, config=cfg)  # nominal 125 MB/s
    r.observe(row(inflight_b=8 * MiB, inflight_s=8, serving=4, progress=1), 0)
    rate = 6.25e6  # the rail runs at 5%
    for k in range(1, 11):
        t = k * 10 * MS
        r.observe(row(inflight_b=8 * MiB, inflight_s=8, serving=4, progress=t, moved=int(rate * t / 1e9)), t)
    assert r.service_rate_Bps == pytest.approx(rate, rel=0.02)
    assert r.normalized_rate(100 * MS, 1_000 * MS) == pytest.approx(0.05, rel=0.02)
    assert r.normalized_rate(2_000 * MS, 1_000 * MS) is None  # stale: nothing to judge by
    assert r.bandwidth_Bps == pytest.approx(rate, rel=0.02)


class _Burst:
    """One rail served by the executor's service telemetry, driven tick by tick: `serve` moves bytes
    at a rate while serving, `idle` ticks with nothing served, `complete` finishes slices whose
    latency ran from the burst's submit (queued behind each other)."""

    def __init__(self, tel: RailTelemetry) -> None:
        self.tel, self.t, self.moved, self.done_b, self.done_s, self.lat = tel, 0, 0, 0, 0, 0
        self.tel.observe(row(), 0)

    def _obs(self, serving: int) -> None:
        self.tel.observe(row(inflight_b=8 * MiB if serving else 0, inflight_s=8 if serving else 0,
                             done_b=self.done_b, done_s=self.done_s, lat_sum=self.lat, last_done=self.t,
                             serving=serving, progress=self.t if serving else 1, moved=self.moved), self.t)

    def serve(self, rate: float, ms: int) -> None:
        for _ in range(ms // 10):
            self.t += 10 * MS
            self.moved += int(rate * 0.01)
            self._obs(2)

    def idle(self, ms: int) -> None:
        for _ in range(ms // 10):
            self.t += 10 * MS
            self._obs(0)

    def complete(self, slices: int, latency_ms: int) -> None:
        self.done_b += slices * MiB
        self.done_s += slices
        self.lat += slices * latency_ms * MS


def test_partial_busy_windows_carry_over_and_queued_slices_do_not_drag_the_rate():
    """Open loop, lone requests: each rail serves a burst of slices for part of a window, then idles.
    The busy time of a window too short to tell a rate carries over; the burst's slices, whose
    latencies include their wait behind each other, must not pull a rail's estimate below its rate
    (they read 1 Gbit/s rails anywhere from 0.45 to 0.95 Gbit/s at each request's start)."""
    cfg = SchedulerConfig(bandwidth_window_s=0.05, ewma_alpha=1.0)
    b = _Burst(RailTelemetry(0, 1 * GBIT, config=cfg))  # nominal 125 MB/s
    b.serve(100e6, 60)
    b.idle(40)  # the window rolled while serving: a busy rate
    assert b.tel.bandwidth_Bps == pytest.approx(100e6, rel=0.02)
    b.serve(100e6, 20)  # the tail of a request: 20 ms busy in this window
    b.complete(8, 80)  # 8 slices queued behind each other: 1 MiB / 80 ms = 13 MB/s each
    b.idle(40)
    assert b.tel.bandwidth_Bps == pytest.approx(100e6, rel=0.02)  # the queued slices do not count
    b.serve(60e6, 20)  # the next request: 20 + 20 ms of service at last
    b.idle(40)
    # carried over: (2 MB + 1.2 MB) over 40 ms of service (one tick of each burst is its edge)
    assert b.tel.bandwidth_Bps == pytest.approx((2e6 + 1.2e6) / 0.04, rel=0.15)
    assert b.tel.service_rate_Bps == b.tel.bandwidth_Bps


def test_a_request_landing_on_a_draining_burst_does_not_inflate_a_served_rail():
    """Open loop at 1.2 Gbit/s: a half-rate rail (60 MB/s of a nominal 125) drains one request's
    burst of 1 MiB slices when the next request's slices land on top. The slices completing then
    waited only ~35 ms (the first of their burst) while 16 MiB count as queued: inflight / latency
    read 450 MB/s, clamped to the nominal, and the estimate swung to 0.6-0.8 Gbit/s in every other
    window. With service telemetry only the goodput while busy counts."""
    cfg = SchedulerConfig(bandwidth_window_s=0.05, ewma_alpha=0.5)
    r = RailTelemetry(0, 1 * GBIT, config=cfg)
    rate = 60e6
    r.observe(row(), 0)
    inflight, done_b, done_s, lat, moved = 9 * MiB, 0, 0, 0, 0
    for k in range(1, 61):  # 600 ms of 10 ms ticks, serving all along
        t = k * 10 * MS
        moved += int(rate * 0.01)
        if k % 2 == 0:  # a 1 MiB slice completes every ~17 ms: one per two ticks, ~35 ms after its start
            done_b += MiB
            done_s += 1
            lat += 35 * MS
            inflight -= MiB
        if k % 15 == 0:  # the next request's share lands while the burst drains
            inflight += 9 * MiB
        r.observe(row(inflight_b=inflight, inflight_s=inflight // MiB, done_b=done_b, done_s=done_s, lat_sum=lat,
                      last_done=t, serving=2, progress=t, moved=moved), t)
        if k >= 25:  # the nominal prior has faded (EWMA)
            assert r.bandwidth_Bps == pytest.approx(rate, rel=0.05), (k, r.bandwidth_Bps)


def test_per_slice_samples_still_count_before_any_busy_rate():
    """A rail that never served long enough for a busy rate (small requests only) is still measured
    by its slices, as before."""
    cfg = SchedulerConfig(bandwidth_window_s=0.05, ewma_alpha=1.0)
    b = _Burst(RailTelemetry(0, 1 * GBIT, config=cfg))
    b.complete(4, 20)  # 1 MiB / 20 ms = 52 MB/s
    b.idle(60)
    assert b.tel.service_rate_Bps == 0.0
    assert b.tel.bandwidth_Bps == pytest.approx(MiB / 0.02, rel=0.02)


# ---- slice scheduler -----------------------------------------------------------------------------


def test_slice_sizes():
    s = SliceScheduler(SchedulerConfig())
    assert s.slice_sizes(4 * KiB) == (1, 4 * KiB)
    assert s.slice_sizes(100 * KiB) == (1, 100 * KiB)
    assert s.slice_sizes(1 * MiB) == (16, 64 * KiB)
    n, size = s.slice_sizes(64 * MiB)
    assert n == 64 and size == MiB
    n, size = s.slice_sizes(3 * 64 * KiB + 5)
    assert n == 3 and size == 64 * KiB


def test_plan_covers_and_min_slice():
    s = SliceScheduler(SchedulerConfig())
    rails = rails_at(1, 1, 1, 1)
    for length in (1, 4096, 65536, 65537, 3 * MiB + 17, 64 * MiB, 1000 * MiB + 3):
        plan = s.plan(length, rails, Priority.HIGH)
        check_cover(plan, length)
        if length >= 64 * KiB:
            assert all(ln >= 64 * KiB for _, _, ln in plan)
        assert len(plan) <= 64
    assert s.plan(0, rails) == []


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(min_value=1, max_value=512 * MiB),
    gbits=st.lists(st.floats(min_value=0.1, max_value=100), min_size=1, max_size=8),
    policy=st.sampled_from(["spray", "round_robin", "single", "stripe"]),
    data=st.data(),
)
def test_plan_property_exact_cover(length, gbits, policy, data):
    s = SliceScheduler(SchedulerConfig(policy=policy, probe_every=3))
    rails = rails_at(*gbits)
    weights = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=len(rails), max_size=len(rails)))
    if not any(weights):
        with pytest.raises(NoRailError):
            s.plan(length, rails, Priority.LOW, weights)
        return
    for _ in range(2):
        plan = s.plan(length, rails, Priority.LOW, weights)
        check_cover(plan, length)
        assert all(weights[r] > 0 for r, _, _ in plan)
        short = [ln for _, _, ln in plan if ln < 64 * KiB]
        assert not short or (len(plan) == 1 and length < 64 * KiB)


def test_spray_proportional_to_rates():
    s = SliceScheduler(SchedulerConfig(probe_every=0))
    rails = rails_at(1, 2, 4, 1)  # Gbit/s
    counts = [0, 0, 0, 0]
    for _ in range(50):
        for r, _, ln in s.plan(64 * MiB, rails, Priority.HIGH):
            counts[r] += ln
        for x in rails:
            x.pending_bytes = 0  # as if the executor drained everything between requests
    total = sum(counts)
    for got, want in zip(counts, (1 / 8, 2 / 8, 4 / 8, 1 / 8), strict=True):
        assert got / total == pytest.approx(want, abs=0.02)


def test_spray_health_weights_and_interleave():
    s = SliceScheduler(SchedulerConfig(probe_every=0))
    rails = rails_at(1, 1, 1)
    plan = s.plan(64 * MiB, rails, Priority.HIGH, weights=[1.0, 0.5, 0.0])
    per = {0: 0, 1: 0, 2: 0}
    for r, _, _ in plan:
        per[r] += 1
    assert per[2] == 0 and per[0] == pytest.approx(2 * per[1], abs=2)
    order = [r for r, _, _ in plan]
    assert order[:6].count(1) >= 1  # interleaved, not one contiguous block per rail


def test_back_to_back_plans_do_not_pile_on_one_rail():
    s = SliceScheduler(SchedulerConfig())
    rails = rails_at(1, 1)
    rails[0].bandwidth_Bps *= 1.001  # rail 0 marginally best
    s2 = SliceScheduler(SchedulerConfig(gamma=0.0))
    first = s2.plan(512 * KiB, rails, Priority.HIGH)
    second = s2.plan(512 * KiB, rails, Priority.HIGH)
    assert {first[0][0], second[0][0]} == {0, 1}  # pending bytes of the first made rail 0 costlier
    big = s.plan(64 * MiB, rails, Priority.HIGH)
    assert {r for r, _, _ in big} == {0, 1}


def test_mice_round_robin_among_near_best():
    s = SliceScheduler(SchedulerConfig(gamma=0.1))
    rails = rails_at(1, 1, 1, 0.5)  # the 0.5 Gbit rail is far from best
    picks = []
    for _ in range(30):
        plan = s.plan(64 * KiB, rails, Priority.HIGH)
        assert len(plan) == 1
        picks.append(plan[0][0])
        for x in rails:
            x.pending_bytes = 0
    assert set(picks) == {0, 1, 2}
    assert max(picks.count(i) for i in range(3)) - min(picks.count(i) for i in range(3)) <= 1
    # one mouse of 512 KiB: one slice, the whole request, on one rail (no 64 KiB cutting)
    plan = s.plan(512 * KiB, rails, Priority.HIGH)
    assert len(plan) == 1 and plan[0][1:] == (0, 512 * KiB)


@pytest.mark.parametrize("length", [64 * KiB, 64 * KiB + 1, 256 * KiB, 1 * MiB - 4096, 1 * MiB - 1])
def test_a_mouse_on_a_multi_rail_route_is_one_slice_on_one_rail(length):
    s = SliceScheduler(SchedulerConfig(probe_every=0))
    rails = rails_at(1, 1)
    used = set()
    for _ in range(4):
        plan = s.plan(length, rails, Priority.HIGH)
        assert len(plan) == 1 and plan[0][1:] == (0, length)
        r = plan[0][0]
        used.add(r)
        # the whole request is accounted on the rail it went to, nothing on the other
        assert rails[r].pending_bytes == length and rails[1 - r].pending_bytes == 0
        for x in rails:
            x.pending_bytes = 0
    assert used == {0, 1}  # still round robin among near-best rails


def test_a_mouse_is_one_slice_whatever_rails_admit_it():
    # health weights leaving one rail, QoS slots, a degraded rail: still one slice, on an admitted rail
    s = SliceScheduler(SchedulerConfig(probe_every=0))
    for weights in ([0.0, 1.0, 0.0], [1.0, 0.5, 0.0], [0.5, 0.5, 0.5]):
        plan = s.plan(256 * KiB, rails_at(1, 1, 1), Priority.HIGH, weights)
        assert len(plan) == 1 and plan[0][1:] == (0, 256 * KiB) and weights[plan[0][0]] > 0
    slots = PrioritySlots(QosConfig(rotation_interval_us=200))
    q = SliceScheduler(SchedulerConfig(probe_every=0), qos=slots)
    t0 = 10_000_000_000
    q.plan(64 * MiB, rails_at(1, 1, 1, 1), Priority.HIGH, now_ns=t0)  # HIGH active: LOW held to its slots
    plan = q.plan(512 * KiB, rails_at(1, 1, 1, 1), Priority.LOW, now_ns=t0 + 1)
    assert len(plan) == 1 and plan[0][0] in slots.admitted(4, Priority.LOW, t0 + 1)


def test_elephants_and_baselines_are_still_sliced():
    # the threshold, not the slice size, decides: an elephant is cut in min_slice_bytes multiples and
    # sprayed; baseline policies keep cutting every request (they model other engines)
    s = SliceScheduler(SchedulerConfig(probe_every=0))
    at = s.plan(1 * MiB, rails_at(1, 1), Priority.HIGH)
    assert len(at) == 16 and {r for r, _, _ in at} == {0, 1} and all(ln == 64 * KiB for _, _, ln in at)
    big = s.plan(64 * MiB, rails_at(1, 1), Priority.HIGH)
    assert len(big) == 64 and {r for r, _, _ in big} == {0, 1}
    one = s.plan(8 * MiB, rails_at(1, 1), Priority.HIGH, [1.0, 0.0])  # one admitted rail: as before
    assert len(one) == 64 and {r for r, _, _ in one} == {0}
    for policy in ("round_robin", "stripe", "single"):
        plan = SliceScheduler(SchedulerConfig(policy=policy)).plan(256 * KiB, rails_at(1, 1), Priority.HIGH)
        assert len(plan) == 4 and all(ln == 64 * KiB for _, _, ln in plan), policy
    smaller = SliceScheduler(SchedulerConfig(small_request_threshold=128 * KiB, probe_every=0))
    plan = smaller.plan(256 * KiB, rails_at(1, 1), Priority.HIGH)
    assert len(plan) == 4 and {r for r, _, _ in plan} == {0, 1}  # 256 KiB is an elephant there


def test_mice_elephant_threshold():
    cfg = SchedulerConfig(small_request_threshold=1 * MiB, probe_every=0)
    s = SliceScheduler(cfg)
    rails = rails_at(1, 1, 1, 1)
    below = s.plan(MiB - 4096, rails, Priority.HIGH)
    assert len({r for r, _, _ in below}) == 1
    for x in rails:
        x.pending_bytes = 0
    at = s.plan(MiB, rails, Priority.HIGH)
    assert len({r for r, _, _ in at}) == 4


def test_probe_every_nth_elephant_sprays_evenly():
    s = SliceScheduler(SchedulerConfig(probe_every=5))
    rails = rails_at(10, 10, 0.1, 0.1)  # slow rails get ~0 slices normally
    for k in range(1, 11):
        plan = s.plan(64 * MiB, rails, Priority.HIGH)
        per = [sum(1 for r, _, _ in plan if r == i) for i in range(4)]
        if k % 5 == 0:
            assert per == [16, 16, 16, 16]
        else:
            assert per[2] + per[3] <= 2
        for x in rails:
            x.pending_bytes = 0
    assert s.probes == 2


def test_baseline_policies():
    rails = rails_at(1, 1, 1, 1)
    plan = SliceScheduler(SchedulerConfig(policy="single")).plan(8 * MiB, rails, Priority.HIGH, [0, 1, 1, 1])
    assert {r for r, _, _ in plan} == {1}
    rr = SliceScheduler(SchedulerConfig(policy="round_robin")).plan(8 * MiB, rails, Priority.HIGH)
    assert [r for r, _, _ in rr][:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    stripe = SliceScheduler(SchedulerConfig(policy="stripe")).plan(8 * MiB, rails, Priority.HIGH)
    assert [r for r, _, _ in stripe] == [0] * 16 + [1] * 16 + [2] * 16 + [3] * 16


def test_qos_filter_in_plan():
    slots = PrioritySlots(QosConfig(rotation_interval_us=200))
    s = SliceScheduler(SchedulerConfig(probe_every=0), qos=slots)
    t0 = 10_000_000_000
    # a lone LOW flow (a checkpoint) uses every rail: nothing of higher priority is active
    used = {r for r, _, _ in s.plan(64 * MiB, rails_at(1, 1, 1, 1), Priority.LOW, now_ns=t0)}
    assert len(used) == 4
    for epoch in range(4):
        now = t0 + epoch * 200_000
        fresh = rails_at(1, 1, 1, 1)  # HIGH on idle rails: every rail admits it
        used = {r for r, _, _ in s.plan(64 * MiB, fresh, Priority.HIGH, now_ns=now)}
        assert len(used) == 4
        rails = rails_at(1, 1, 1, 1)  # while HIGH is active, LOW is held to its slots
        used = {r for r, _, _ in s.plan(64 * MiB, rails, Priority.LOW, now_ns=now + 1)}
        assert len(used) == 2 and used == set(slots.admitted(4, Priority.LOW, now + 1))
    # the active window passes: LOW has every rail again
    later = t0 + 3 * 200_000 + QosConfig().active_window_us * 1000 + 1
    used = {r for r, _, _ in s.plan(64 * MiB, rails_at(1, 1, 1, 1), Priority.LOW, now_ns=later)}
    assert len(used) == 4


def test_pick_retry_rail():
    rails = rails_at(1, 1, 1, 1, 1)
    rails[4].penalty = 5.0
    H, D, P = RailState.HEALTHY, RailState.DEGRADED, RailState.PAUSED
    pick = SliceScheduler.pick_retry_rail
    assert pick(rails, 1, [H, H, H, H, H], {1}) == 2
    assert pick(rails, 3, [H, H, H, H, H], {3}) == 0  # rotation wraps past the lower-penalty order
    assert pick(rails, 1, [H, P, P, H, D], {1}) == 3
    assert pick(rails, 1, [H, P, P, H, D], {1, 3, 0}) == 4  # degraded only after healthy ones
    assert pick(rails, 1, [P, P, D, P, D], {1}) == 2  # affinity (penalty 1) before penalty 5
    assert pick(rails, 1, [P, H, P, P, P], {1}) is None
    assert pick(rails, 1, [P, H, P, P, P], set()) == 1  # failed rail itself is the last resort


# ---- rail monitor --------------------------------------------------------------------------------


def test_monitor_error_threshold_and_congestion():
    m = RailMonitor(RailHealthConfig(cooldown_jitter=0, error_threshold=3))
    assert m.state(0, 0.0) is RailState.HEALTHY and m.weight(0, 0.0) == 1.0
    assert m.on_error(0, 1.0) is RailState.DEGRADED and m.weight(0, 1.0) == 0.5
    m.on_error(0, 1.1)
    assert m.on_error(0, 1.2) is RailState.PAUSED and m.weight(0, 1.2) == 0.0
    # congestion errors need twice as many
    for k in range(5):
        assert m.on_error(1, 1.0 + k * 0.01, congestion=True) is RailState.DEGRADED
    assert m.on_error(1, 1.1, congestion=True) is RailState.PAUSED


def test_monitor_errors_age_out_of_window():
    m = RailMonitor(RailHealthConfig(cooldown_jitter=0, error_threshold=3, error_window_s=10, quiet_period_s=0.5))
    m.on_error(0, 0.0)
    m.on_error(0, 5.0)
    assert m.on_error(0, 12.0) is RailState.DEGRADED  # first error aged out
    m.on_success(0, 12.1)  # successes do not wipe the count ("reset, not decay" fixed)
    assert m.on_error(0, 12.2) is RailState.PAUSED


def test_monitor_degraded_quiet_period():
    m = RailMonitor(RailHealthConfig(cooldown_jitter=0, quiet_period_s=0.5))
    m.mark_degraded(0, 1.0)
    assert m.state(0, 1.4) is RailState.DEGRADED
    m.mark_degraded(0, 1.4)  # a new event restarts the quiet period
    assert m.state(0, 1.8) is RailState.DEGRADED
    assert m.state(0, 1.95) is RailState.HEALTHY and m.weight(0, 1.95) == 1.0


def test_monitor_steady_heartbeats_while_down_then_gradual_readmission():
    cfg = RailHealthConfig(cooldown_jitter=0, cooldown_base_s=0.2, cooldown_cap_s=1.0, probe_timeout_s=0.25,
                           readmit_weights=(0.25,), readmit_step_s=0.1, quiet_period_s=0.5)  # fmt: skip
    m = RailMonitor(cfg)
    m.pause(0, 0.0)
    assert m.state(0, 0.1) is RailState.PAUSED and not m.due_probe(0, 0.1)
    assert m.resume_at(0) == pytest.approx(0.2)
    assert m.due_probe(0, 0.2) and not m.due_probe(0, 0.21)  # one heartbeat outstanding
    m.on_error(0, 0.22)  # heartbeat failed -> probe again after the same cooldown
    assert m.resume_at(0) == pytest.approx(0.22 + 0.2)
    assert not m.due_probe(0, 0.3) and m.due_probe(0, 0.421)
    # unanswered heartbeat (dead veth: no error ever) expires -> still paused, same cadence
    assert m.state(0, 0.8) is RailState.PAUSED
    assert m.resume_at(0) == pytest.approx(0.421 + 0.25 + 0.2)
    assert m.due_probe(0, 0.872)
    m.on_success(0, 0.9)  # heartbeat ok: gradual re-admission
    assert m.state(0, 0.9) is RailState.DEGRADED and m.weight(0, 0.9) == 0.25
    assert m.weight(0, 1.01) == 0.5
    assert m.state(0, 1.45) is RailState.DEGRADED
    assert m.state(0, 1.55) is RailState.HEALTHY and m.weight(0, 1.55) == 1.0


def test_monitor_flapping_rail_cooldown_doubles_to_the_cap():
    cfg = RailHealthConfig(cooldown_jitter=0, cooldown_base_s=0.2, cooldown_cap_s=0.5, readmit_weights=(), quiet_period_s=0.1)
    m = RailMonitor(cfg)
    t = 0.0
    expected = [0.2, 0.4, 0.5, 0.5]
    for cd in expected:
        m.pause(0, t)
        assert m.resume_at(0) == pytest.approx(t + cd)
        t = m.resume_at(0)
        assert m.due_probe(0, t)
        m.on_success(0, t)  # back...
        t += 0.05
        assert m.state(0, t) is not RailState.PAUSED  # ...and flaps again right away


def test_monitor_error_during_readmission_repauses():
    m = RailMonitor(RailHealthConfig(cooldown_jitter=0, cooldown_base_s=0.2, readmit_weights=(0.25,)))
    m.pause(0, 0.0)
    assert m.due_probe(0, 0.3)
    m.on_success(0, 0.31)
    assert m.weight(0, 0.32) == 0.25
    assert m.on_error(0, 0.33) is RailState.PAUSED
    assert m.cooldown_s(0) == pytest.approx(0.4)


def test_monitor_cooldown_resets_after_long_health():
    cfg = RailHealthConfig(cooldown_jitter=0, cooldown_base_s=0.2, cooldown_reset_s=30, readmit_weights=(), quiet_period_s=0.5)
    m = RailMonitor(cfg)
    m.pause(0, 0.0)
    assert m.due_probe(0, 0.2)
    m.on_success(0, 0.2)
    assert m.state(0, 0.8) is RailState.HEALTHY
    assert m.cooldown_s(0) == pytest.approx(0.4)  # next pause would double
    assert m.state(0, 40.0) is RailState.HEALTHY
    assert m.cooldown_s(0) == pytest.approx(0.2)


def test_monitor_outliers():
    cfg = RailHealthConfig(cooldown_jitter=0, outlier_ratio=4.0, quiet_period_s=0.5)
    m = RailMonitor(cfg)
    # slowness = 1 / (service rate as a fraction of nominal): rail 3 runs at 5%
    marked = m.check_outliers([1.0, 1.05, 0.98, 20.0], 0.0)
    assert marked == [3] and m.state(3, 0.0) is RailState.DEGRADED and m.weight(3, 0.0) == 0.5
    assert m.check_outliers([1.0, 1.05, 0.98, 3.5], 0.1) == []  # 3.5x slower: within the ratio
    m2 = RailMonitor(cfg)
    assert m2.check_outliers({"a": 1.0}, 0.0) == []  # no sibling to compare with
    assert m2.check_outliers([1.0, 1.0, 40.0, 40.0], 0.0) == []  # half the rails slow: no clear outlier
    m2.pause(1, 0.0)
    assert m2.check_outliers([1.0, 1e9, 1.1], 0.1) == []  # paused rails are not compared
    # kept DEGRADED while it stays an outlier, HEALTHY a quiet period after it recovered
    m3 = RailMonitor(cfg)
    for k in range(20):
        m3.check_outliers([1.0, 1.0, 1.0, 20.0], k * 0.1)
        assert m3.state(3, k * 0.1) is RailState.DEGRADED
    for k in range(20, 30):
        m3.check_outliers([1.0, 1.0, 1.0, 1.1], k * 0.1)
    assert m3.state(3, 2.0 + cfg.quiet_period_s + 0.01) is RailState.HEALTHY


# ---- QoS -----------------------------------------------------------------------------------------


def test_priority_slot_rotation():
    slots = PrioritySlots(QosConfig(rotation_interval_us=200, active_window_us=0))  # always enforced
    seen_low = set()
    for epoch in range(8):
        now = epoch * 200_000 + 5
        assert slots.admitted(4, Priority.HIGH, now) == [0, 1, 2, 3]
        mid = slots.admitted(4, Priority.MID, now)
        low = slots.admitted(4, Priority.LOW, now)
        assert len(mid) == 3 and len(low) == 2 and set(low) < set(mid)
        seen_low.update(low)
    assert seen_low == {0, 1, 2, 3}  # every rail takes LOW work some of the time
    assert slots.admitted(4, Priority.LOW, 0, candidates=[0]) == [0]  # none admits -> all candidates
    assert slots.admitted(1, Priority.LOW, 0) == [0]


def test_work_conserving_slots():
    slots = PrioritySlots(QosConfig(rotation_interval_us=200, active_window_us=50_000))
    now = 1_000_000_000
    assert slots.admitted(4, Priority.LOW, now) == [0, 1, 2, 3]  # nobody above LOW is active
    slots.note(Priority.MID, now)
    assert len(slots.admitted(4, Priority.LOW, now + 1)) == 2  # MID active: LOW held to its slots
    assert slots.admitted(4, Priority.MID, now + 1) == [0, 1, 2, 3]  # MID yields only to HIGH
    slots.note(Priority.HIGH, now + 2)
    assert len(slots.admitted(4, Priority.MID, now + 3)) == 3
    assert slots.admitted(4, Priority.MID, now + 2 + 50_000_001) == [0, 1, 2, 3]  # HIGH went quiet


def _child_sets_load(name: str, directory: str, ready, done) -> None:
    with SharedRailLoad(name, directory=directory) as load:
        load.set("nic0", 7 * MiB)
        load.add("nic1", 3 * MiB)
        ready.set()
        done.wait(10)


def test_shared_rail_load_two_processes(tmp_path):
    name = f"t{uuid.uuid4().hex[:8]}"
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    ctx = mp.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    me = SharedRailLoad(name, directory=directory)
    try:
        me.set("nic0", 1 * MiB)
        child = ctx.Process(target=_child_sets_load, args=(name, directory, ready, done))
        child.start()
        assert ready.wait(10)
        assert me.total("nic0") == 8 * MiB and me.others("nic0") == 7 * MiB and me.own("nic0") == MiB
        assert me.others("nic1") == 3 * MiB
        assert me.snapshot() == {"nic0": 8 * MiB, "nic1": 3 * MiB}
        done.set()
        child.join(10)
        assert child.exitcode == 0
        assert me.others("nic0") == 0  # the child's close() released its column
    finally:
        done.set()
        me.close()
        me.unlink()


def test_shared_rail_load_reclaims_dead_process(tmp_path):
    name = f"t{uuid.uuid4().hex[:8]}"
    a = SharedRailLoad(name, directory=str(tmp_path))
    try:
        a.set("nic0", 5)
        # Simulate a process that died without close(): a column owned by a pid that is gone.
        col = 1 if a.column == 0 else 0
        a._pids[col] = 2**22 + 12345  # above pid_max default: never alive
        a._load[a._slot("nic0"), col] = 99
        assert a.total("nic0") == 104
        b = SharedRailLoad(name, directory=str(tmp_path))
        assert a.total("nic0") == 5 and b.others("nic0") == 5
        b.close()
    finally:
        a.close()
        a.unlink()


def test_spray_water_fills_by_rate_when_queues_are_level():
    """Equal queues in time must not mean equal shares: new work follows the rates."""
    s = SliceScheduler(SchedulerConfig(probe_every=0))
    rails = rails_at(1, 1, 1, 0.5)
    for r in rails:  # every rail has 10 ms of work queued
        r.inflight_bytes = int(r.bandwidth_Bps * 0.010)
    plan = s.plan(64 * MiB, rails, Priority.MID)
    share = {i: sum(ln for r, _, ln in plan if r == i) / (64 * MiB) for i in range(4)}
    assert abs(share[3] - 0.5 / 3.5) < 0.03, share
    assert all(abs(share[i] - 1 / 3.5) < 0.03 for i in range(3)), share


def _finish_s(rails, plan):
    """Predicted finish time of each rail given a plan (its queue, then its share, at its rate)."""
    given = {}
    for r, _, ln in plan:
        given[r] = given.get(r, 0) + ln
    return {r: (rails[r].inflight_bytes + b) / rails[r].bandwidth_Bps for r, b in given.items()}


def test_spray_rails_finish_a_lone_request_together():
    """64 MiB over 1, 1, 1, 0.5 Gbit/s: byte shares, not whole 1 MiB slices, so no rail ends a
    slice after the others (whole slices went 19/18/18/9: the first rail 8.7 ms behind)."""
    s = SliceScheduler(SchedulerConfig(probe_every=0))
    rails = rails_at(1, 1, 1, 0.5)
    plan = s.plan(64 * MiB, rails, Priority.MID)
    check_cover(plan, 64 * MiB)
    assert len(plan) <= 64 and all(ln >= 64 * KiB for _, _, ln in plan)
    finish = _finish_s(rails, plan)
    assert set(finish) == {0, 1, 2, 3}
    floor = 64 * MiB / sum(r.bandwidth_Bps for r in rails)
    assert max(finish.values()) - floor < 0.0001, finish  # within 4 KiB of the ideal split
    # slices of one rail differ by at most one alignment unit, and the rails stay interleaved
    for r in range(4):
        lens = [ln for q, _, ln in plan if q == r]
        assert max(lens) - min(lens) <= 4 * KiB
    assert [r for r, _, _ in plan][:4] == [0, 1, 2, 3]
    # the plan's bytes are what the rails' pending counts grew by (up to the request's last 4 KiB)
    assert sum(r.pending_bytes for r in rails) == 64 * MiB


def test_spray_fills_queues_to_one_finish_time():
    """A rail with queued work gets less, a rail busy beyond the common finish gets nothing."""
    s = SliceScheduler(SchedulerConfig(probe_every=0))
    rails = rails_at(1, 1, 1, 0.5)
    rails[0].inflight_bytes = int(rails[0].bandwidth_Bps * 0.200)  # 200 ms queued
    rails[1].inflight_bytes = int(rails[1].bandwidth_Bps * 0.030)
    plan = s.plan(32 * MiB, rails, Priority.MID)
    check_cover(plan, 32 * MiB)
    finish = _finish_s(rails, plan)
    assert 0 not in finish  # its queue alone ends after the others finish this request
    assert max(finish.values()) - min(finish.values()) < 0.0002, finish
    assert max(finish.values()) < 0.200


def test_spray_shares_level_min_share_and_rounding():
    al = 4 * KiB
    # equal free times: shares follow the rates and sum to the aligned length
    got = spray_shares(10 * MiB + 123, [(0.0, 2.0), (0.0, 1.0), (0.0, 1.0)], 64 * KiB, al)
    assert sum(got) == (10 * MiB + 123) // al * al and all(g % al == 0 for g in got)
    assert got[0] == pytest.approx(5 * MiB, abs=al) and got[1] == pytest.approx(2.5 * MiB, abs=al)
    # a rail free only at 1 s (others at 0, rate 1 MB/s each, 1 MB to place): level 0.5 s
    got = spray_shares(1_000_000, [(0.0, 1e6), (0.0, 1e6), (1.0, 1e6)], 4096, 4096)
    assert got[2] == 0 and got[0] == pytest.approx(500_000, abs=4096)
    # a share under min_bytes is left out and the rest fills up without it
    got = spray_shares(1 * MiB, [(0.0, 1e9), (0.0, 1e9), (0.0, 1e7)], 64 * KiB, al)
    assert got[2] == 0 and sum(got) == MiB and got[0] == got[1]
    # every share would be small: one rail takes it all
    got = spray_shares(96 * KiB, [(0.0, 1.0), (0.0, 1.0)], 64 * KiB, al)
    assert sorted(got) == [0, 96 * KiB]
    # no usable rate at all: an even split rather than nothing
    got = spray_shares(8 * MiB, [(float("inf"), 0.0), (float("inf"), 0.0)], 64 * KiB, al)
    assert got == [4 * MiB, 4 * MiB]


def test_retries_go_to_the_least_loaded_healthy_rail():
    rails = rails_at(1, 1, 1, 1)
    rails[1].inflight_bytes = 64 * MiB
    rails[2].inflight_bytes = 1 * MiB
    states = [RailState.PAUSED, RailState.HEALTHY, RailState.HEALTHY, RailState.HEALTHY]
    assert SliceScheduler.pick_retry_rail(rails, 0, states) == 3
    rails[3].inflight_bytes = 128 * MiB
    assert SliceScheduler.pick_retry_rail(rails, 0, states) == 2


def test_monitor_jitter_spreads_heartbeats():
    m = RailMonitor(RailHealthConfig(cooldown_base_s=0.2, cooldown_cap_s=0.2, cooldown_jitter=0.5))
    gaps = []
    t = 0.0
    m.pause(0, t)
    for _ in range(50):
        t = m.resume_at(0)
        assert m.due_probe(0, t)
        m.on_error(0, t)  # heartbeat failed
        gaps.append(m.resume_at(0) - t)
    assert all(0.1 - 1e-9 <= g <= 0.3 + 1e-9 for g in gaps)
    assert max(gaps) - min(gaps) > 0.1  # really spread, not one fixed period


def test_shared_load_keys_keep_network_namespaces_apart(tmp_path):
    """Namespaces share /dev/shm and reuse addresses (every benchmark fabric's rail 0 is
    198.18.0.1 -> 198.18.0.2): another namespace's load on the same addresses is not ours."""
    name = f"t{uuid.uuid4().hex[:8]}"
    other, me = SharedRailLoad(name, directory=str(tmp_path)), SharedRailLoad(name, directory=str(tmp_path))
    try:
        rail = "198.18.0.1->198.18.0.2:40123"
        mine = shared_load_key("tcp", rail)
        assert shared_load_key("tcp", "198.18.0.1->198.18.0.2:40777") == mine  # the remote port is not the path
        other.set(shared_load_key("tcp", rail, netns="4026532999"), 64 * MiB)  # a fabric in another namespace
        assert me.others(mine) == 0
        other.set(mine, 3 * MiB)  # a process in this namespace on the same NICs
        assert me.others(mine) == 3 * MiB
    finally:
        other.close()
        me.close()
        other.unlink()


def test_shared_load_recycles_idle_names_when_full(tmp_path):
    cfg = QosConfig(shared_load_max_rails=4, shared_load_max_procs=4)
    t = SharedRailLoad(f"full-{uuid.uuid4().hex[:8]}", config=cfg, directory=str(tmp_path))
    try:
        t.set("busy", 100)
        for k in range(20):  # far more names than slots: idle ones are recycled
            t.set(f"idle-{k}", 0)
        assert t.own("busy") == 100
        for k in range(3):
            t.set(f"loaded-{k}", 5)
        with pytest.raises(RuntimeError, match="carry load"):
            t.set("one-too-many", 1)
    finally:
        t.close()
        t.unlink()
