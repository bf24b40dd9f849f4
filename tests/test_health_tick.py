"""The health tick's cheap common case (docs/benchmarks.md, the health tick): the one rail of a
single-rail route has its snapshots kept and folded every `health.single_rail_fold_ticks` ticks,
the rail monitor is asked nothing per rail while every rail is HEALTHY (`RailMonitor.calm`), the
host-wide load goes through `SharedRailLoad.exchange`. What that must not change: the model comes
out as folded tick by tick, a congestion report is heard in the tick that reads it, a rail paused
between two ticks gets its heartbeat and comes back. Pure parts without sockets; the rest with a
real engine and a real peer process over loopback tcp, counted in ticks, never timed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from peers import Peer, until

from tent_core import Engine
from tent_core.abi import StatField
from tent_core.config import RailHealthConfig
from tent_core.qos import SharedRailLoad
from tent_core.rail_monitor import RailMonitor, RailState
from tent_core.rails import RAILS
from tent_core.telemetry import ROW_FIELDS, RailTelemetry

GBIT = 1e9
MS = 1_000_000
SIZE = 1 << 20
CONGESTION = int(StatField.CONGESTION)
ERRORS = int(StatField.ERRORS)


def _row(inflight_b: int = 0, inflight_s: int = 0, done_b: int = 0, done_s: int = 0, errors: int = 0, lat_sum: int = 0,
         last_done: int = 0, serving: int = 0, progress: int = 0, moved: int = 0, congestion: int = 0) -> tuple[int, ...]:  # fmt: skip
    r = [inflight_b, inflight_s, done_b, done_s, errors, lat_sum, 0, last_done, serving, progress, moved, congestion]
    return tuple(r + [0] * (ROW_FIELDS - len(r)))


def _model(tel: RailTelemetry) -> dict[str, Any]:
    return {k: getattr(tel, k) for k in RailTelemetry.__slots__ if k != "_kept"}


# one tick's change of a rail's counters: completions, bytes, latency, in flight, serving
_STEP = st.tuples(
    st.integers(0, 4),  # slices completed
    st.integers(1, 1 << 20),  # bytes per slice
    st.integers(0, 5 * MS),  # latency per slice
    st.integers(0, 8),  # slices in flight after
    st.integers(0, 2),  # serving after
    st.integers(1, 30 * MS),  # time since the last snapshot
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=80), st.integers(1, 9), st.booleans())
def test_a_lazily_folded_model_is_the_one_folded_tick_by_tick(steps, every, service):
    eager, lazy = RailTelemetry(0, 10 * GBIT), RailTelemetry(0, 10 * GBIT)
    done_b = done_s = lat = moved = last_done = progress = 0
    t = 1_000 * MS
    for n, size, latency, inflight, serving, dt in steps:
        t += dt
        done_s, done_b, lat = done_s + n, done_b + n * size, lat + n * latency
        moved += n * size
        if n:
            last_done = t
        if service and (n or serving):
            progress = t
        row = _row(inflight * size, inflight, done_b, done_s, 0, lat, last_done, serving if service else 0,
                   progress, moved if service else 0)  # fmt: skip
        d_eager = eager.observe(row, t)
        d_lazy = lazy.observe_lazily(row, t, every)
        assert d_lazy == d_eager  # what the tick acts on is there at once
        assert (lazy.inflight_bytes, lazy.inflight_slices, lazy.serving, lazy.slices_done) == (
            eager.inflight_bytes, eager.inflight_slices, eager.serving, eager.slices_done)  # fmt: skip
        assert lazy.kept < every
        if lazy.kept == 0:
            assert _model(lazy) == _model(eager)
    t += 10 * MS
    last = _row(0, 0, done_b, done_s, 0, lat, last_done, 0, progress, moved if service else 0)
    assert lazy.observe(last, t) == eager.observe(last, t)  # observe folds what was kept first
    assert lazy.kept == 0 and _model(lazy) == _model(eager)


def test_a_snapshot_with_an_error_or_a_congestion_report_is_folded_at_once():
    tel = RailTelemetry(0, 10 * GBIT)
    tel.observe_lazily(_row(), 0, 8)  # the first snapshot: folded (nothing to compare with)
    assert tel.kept == 0
    for k in range(1, 4):  # completions only: kept
        d = tel.observe_lazily(_row(done_b=k << 20, done_s=k, lat_sum=k * MS, last_done=k * 10 * MS), k * 10 * MS, 8)
        assert d.slices_done == 1 and tel.kept == k
    d = tel.observe_lazily(_row(done_b=3 << 20, done_s=3, lat_sum=3 * MS, congestion=1), 40 * MS, 8)
    assert d.congestion == 1 and tel.kept == 0
    tel.observe_lazily(_row(done_b=4 << 20, done_s=4, lat_sum=4 * MS, congestion=1), 50 * MS, 8)
    assert tel.kept == 1
    d = tel.observe_lazily(_row(done_b=4 << 20, done_s=4, lat_sum=4 * MS, errors=1, congestion=1), 60 * MS, 8)
    assert d.errors == 1 and tel.kept == 0
    for k in range(1, 20):  # never more than every - 1 kept; every = 1: none
        tel.observe_lazily(_row(done_b=(4 + k) << 20, done_s=4 + k, errors=1, congestion=1), (60 + k) * MS, 8)
        assert tel.kept < 8
    tel.observe_lazily(_row(done_b=30 << 20, done_s=30, errors=1, congestion=1), 90 * MS, 1)
    assert tel.kept == 0


def test_the_monitor_is_calm_only_while_every_rail_is_healthy():
    cfg = RailHealthConfig(cooldown_jitter=0.0)
    m = RailMonitor(cfg)
    assert m.calm
    m.on_success(1, 0.0)
    assert m.calm and m.settled(0.0)
    m.on_error(1, 1.0)  # DEGRADED
    assert not m.calm
    assert not m.settled(1.0) and not m.calm
    assert m.settled(1.0 + cfg.quiet_period_s) and m.calm  # HEALTHY again after its quiet period
    m.pause(2, 2.0)
    assert not m.calm and not m.settled(2.0)
    assert m.due_probe(2, 2.0 + cfg.cooldown_base_s)
    m.on_success(2, 2.0 + cfg.cooldown_base_s)  # the heartbeat made it: re-admitted gradually
    assert not m.settled(2.0 + cfg.cooldown_base_s) and not m.calm
    assert m.settled(10.0) and m.calm
    assert m.check_outliers({1: 1.0, 2: 1.0, 3: 100.0}, 11.0) == [3]  # a cost outlier is DEGRADED too
    assert not m.calm


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 7), st.one_of(st.floats(0.01, 1000.0), st.just(float("inf"))), max_size=8),
       st.sets(st.integers(0, 7)))  # fmt: skip
def test_the_outlier_pre_check_never_skips_a_rail_check_outliers_would_mark(slow, paused):
    m = RailMonitor(RailHealthConfig(cooldown_jitter=0.0))
    for k in paused:
        m.pause(k, 0.0)
    possible = m.outlier_possible(slow.values())
    marked = m.check_outliers(slow, 0.01)
    assert possible or not marked, (slow, paused, marked)


def test_single_rail_fold_ticks_is_validated():
    with pytest.raises(ValueError, match="single_rail_fold_ticks"):
        RailHealthConfig(single_rail_fold_ticks=0)
    with pytest.raises(ValueError, match="single_rail_fold_ticks"):
        RailHealthConfig(single_rail_fold_ticks=65)


def test_exchange_publishes_this_process_load_and_returns_the_others():
    name = f"tick-{uuid.uuid4().hex[:12]}"
    a = SharedRailLoad(name)
    b = SharedRailLoad(name)  # a second column: another process, as far as the table knows
    try:
        a.set("tcp:0:10.0.0.1->10.0.0.2", 5 << 20)
        assert b.exchange("tcp:0:10.0.0.1->10.0.0.2", 7 << 20) == 5 << 20
        assert b.own("tcp:0:10.0.0.1->10.0.0.2") == 7 << 20
        assert a.others("tcp:0:10.0.0.1->10.0.0.2") == 7 << 20
        assert a.exchange("tcp:0:10.0.0.1->10.0.0.2", 0) == 7 << 20
        assert b.exchange("tcp:0:10.0.0.3->10.0.0.4", 1) == 0
    finally:
        b.close()
        a.close()  # the last one out removes the table: its views must let the mapping go


# ---- a real engine -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=SIZE, transports=["tcp"])
    yield p
    p.close()


def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    until(cond, timeout, what, step=0.005)


def _engine() -> Engine:
    # at the cadence all along (no idle sleep), no host-wide table: other tests' loopback load stays out
    cfg = {"progress_idle_s": 0.0, "qos": {"shared_load": False}, "health": {"cooldown_jitter": 0.0}}
    return Engine(cfg, transports=["tcp"])


def _the_rail(eng: Engine) -> Any:
    routes = [rt for p in eng.peers.peers() for rt in p.routes.values()]
    assert len(routes) == 1 and len(routes[0].rails) == 1, routes
    return routes[0].rails[0]


def test_congestion_on_a_single_rail_is_heard_in_the_tick_that_reads_it_while_its_snapshots_wait(peer):
    with _engine() as eng:
        eng.read(eng.allocate(SIZE), peer.seg("ro"), SIZE)
        rail = _the_rail(eng)
        tel = rail.telemetry
        _until(lambda: tel.kept > 0, 10, "the tick keeps the one rail's snapshots for a later fold")
        calls = [0]
        poked: list[tuple[int, int]] = []  # (tick, snapshots kept then)
        heard: list[tuple[int, bool, int, int, RailState]] = []
        tick, on_error = eng._health_tick, eng.monitor.on_error

        def ticking(now: float) -> bool:
            calls[0] += 1
            if not poked and tel.kept > 0:
                # between two ticks, while snapshots wait for their fold, what the executor's
                # congestion report does to the rail's row (nothing in flight now, so no completion
                # races this write)
                poked.append((calls[0], tel.kept))
                RAILS.stats[rail.slot, CONGESTION] += 1
            return tick(now)

        def spy(slot: int, now: float, congestion: bool = False) -> RailState:  # does what it does, and records it
            state = on_error(slot, now, congestion=congestion)
            heard.append((slot, congestion, calls[0], tel.kept, state))
            return state

        eng.monitor.on_error = spy  # type: ignore[method-assign]
        eng._health_tick = ticking  # type: ignore[method-assign]
        _until(lambda: bool(heard), 10, "the monitor heard of the congestion")
        slot, congestion, at, kept, state = heard[0]
        assert (slot, congestion, state) == (rail.slot, True, RailState.DEGRADED)
        assert poked[0][1] > 0, "snapshots were being kept when the congestion came"
        assert at == poked[0][0], "heard in the first tick whose snapshot shows it"
        assert kept == 0, "the kept snapshots are folded before the congestion is acted on"


def test_a_single_rail_paused_between_two_ticks_gets_its_heartbeat_and_comes_back(peer):
    with _engine() as eng:
        local = eng.allocate(SIZE)
        eng.read(local, peer.seg("ro"), SIZE)
        rail = _the_rail(eng)
        _until(lambda: rail.telemetry.kept > 0, 10, "the tick keeps the one rail's snapshots for a later fold")
        rec = eng._recovery
        sent: list[int] = []
        send = rec._send_probe

        def spy(*args: Any) -> None:
            sent.append(args[2].slot)
            send(*args)

        rec._send_probe = spy  # type: ignore[method-assign]
        eng.monitor.pause(rail.slot, time.monotonic())  # from this thread, as nothing in the tick does
        assert not eng.monitor.calm
        _until(lambda: eng.monitor.state(rail.slot, time.monotonic()) != RailState.PAUSED, 10,
               "the paused rail was re-admitted after its heartbeat")  # fmt: skip
        assert sent == [rail.slot]
        _until(lambda: eng.monitor.calm, 10, "calm again once the rail is HEALTHY")
        eng.read(local, peer.seg("ro"), SIZE)  # and it carries data again
