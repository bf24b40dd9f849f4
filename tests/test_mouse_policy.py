"""The mouse policy of a route of several rails, in Python (slice_scheduler.pick_mouse, what the
planner runs) and in C (_native.mouse_pick, what the fast path runs per request): the same choice
and flags from the same rail states, on random states (hypothesis), including ties, excluded and
degraded rails, stale and busy rails."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tent_core import _native
from tent_core.config import QosConfig, SchedulerConfig
from tent_core.qos import PrioritySlots
from tent_core.slice_scheduler import MOUSE_RR, MOUSE_STALE, MouseView, SliceScheduler, mouse_view, pick_mouse
from tent_core.telemetry import RailTelemetry

NOW = 10**15  # ns: any monotonic clock reading far from 0

# values from small sets as well as wide ranges, so that ties (equal costs, equal ages) happen often
_bytes = st.one_of(st.sampled_from([0, 1, 4096, 65536, 1 << 20]), st.integers(0, 1 << 40))
_bw = st.one_of(st.sampled_from([1e4, 1.25e8, 1.25e9, 2.5e9]), st.floats(1.0, 1e12, allow_nan=False))
_weight = st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0])
_ns = st.one_of(st.sampled_from([-1, 0, NOW - 3 * 10**9, NOW - 2 * 10**9, NOW]), st.integers(-1, NOW + 10**9))

views_st = st.lists(
    st.builds(MouseView, _bytes, _bw, st.sampled_from([1.0, 5.0, 10.0, 1.5]), _weight, _ns, st.booleans(), _bytes, _ns),
    min_size=1, max_size=8,
)
config_st = st.builds(
    SchedulerConfig,
    gamma=st.sampled_from([0.0, 0.1, 0.5, 2.0]),
    b0_s=st.sampled_from([0.0, 20e-6, 1e-3]),
    b1=st.sampled_from([1.0, 0.5, 2.0]),
    bandwidth_stale_s=st.sampled_from([0.0, 0.5, 2.0]),
)


def _c_pick(views: list[MouseView], length: int, rr: int, cfg: SchedulerConfig, prio: int = 0,
            slots: PrioritySlots | None = None) -> tuple[int, int]:
    pol = (cfg.b0_s, cfg.b1, cfg.gamma, cfg.bandwidth_stale_s)
    qos = None if slots is None else slots.native_view()
    return tuple(_native.mouse_pick([tuple(v) for v in views], length, rr, pol, NOW, prio, qos))  # type: ignore[return-value]


# when each priority was last planned (None: never), around NOW and the active window
_seen = st.lists(st.one_of(st.none(), st.sampled_from([NOW, NOW - 10**6, NOW - 10**9, NOW - 2 * 10**9]),
                           st.integers(0, NOW)), min_size=3, max_size=3)
qos_st = st.one_of(st.none(), st.tuples(st.sampled_from([0, 100, 200, 10**6]), st.sampled_from([0, 1000, 10**6]), _seen))


def _slots(q: tuple[int, int, list[int | None]] | None) -> PrioritySlots | None:
    if q is None:
        return None
    slots = PrioritySlots(QosConfig(rotation_interval_us=q[0], active_window_us=q[1]))
    slots._seen[:] = q[2]
    return slots


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(views=views_st, length=st.integers(1, (1 << 20) - 1), rr=st.integers(0, 1 << 40), cfg=config_st,
       prio=st.sampled_from([0, 1, 2]), qos=qos_st)
def test_c_choice_is_the_python_choice(views, length, rr, cfg, prio, qos):
    py_slots, c_slots = _slots(qos), _slots(qos)
    assert _c_pick(views, length, rr, cfg, prio, c_slots) == pick_mouse(views, length, rr, cfg, NOW, prio, py_slots)
    if qos is not None:  # both noted the request's priority alike
        assert c_slots._seen == py_slots._seen


def test_qos_slots_hold_a_mouse_off_the_high_rail_while_high_priority_is_active():
    cfg = SchedulerConfig(gamma=0.1, bandwidth_stale_s=0.0)
    fresh = MouseView(0, 1e9, 1.0, 1.0, NOW, False, 0, 0)
    slots = PrioritySlots(QosConfig(rotation_interval_us=200, active_window_us=10**6))
    slots.note(0, NOW)  # a HIGH request just now
    e = NOW // slots._interval_ns
    for prio in (1, 2):
        for rr in range(4):
            r, _ = pick_mouse([fresh, fresh], 65536, rr, cfg, NOW, prio, slots)
            assert (r + e) % 2 >= prio or all((i + e) % 2 < prio for i in range(2))
            assert _c_pick([fresh, fresh], 65536, rr, cfg, prio, slots)[0] == r


def test_choice_follows_cost_health_and_staleness():
    """The cases the equivalence rests on, spelled out (so a policy both sides got wrong alike shows)."""
    cfg = SchedulerConfig(gamma=0.1, bandwidth_stale_s=2.0)
    fresh = MouseView(0, 1e9, 1.0, 1.0, NOW, False, 0, 0)
    loaded = fresh._replace(queued_bytes=64 << 20)
    # the cheaper rail, whatever the cursor
    for rr in range(4):
        assert pick_mouse([loaded, fresh], 65536, rr, cfg, NOW) == (1, MOUSE_RR)
    # equal rails: the cursor alternates
    assert [pick_mouse([fresh, fresh], 65536, rr, cfg, NOW)[0] for rr in range(4)] == [0, 1, 0, 1]
    # an excluded rail never; none admitted: -1 (the planner decides)
    assert pick_mouse([fresh._replace(weight=0.0), loaded], 65536, 0, cfg, NOW) == (1, 0)
    assert pick_mouse([fresh._replace(weight=0.0)] * 2, 65536, 0, cfg, NOW) == (-1, 0)
    # a degraded rail looks twice as expensive: its equal sibling takes every mouse
    assert {pick_mouse([fresh._replace(weight=0.5), fresh], 65536, rr, cfg, NOW)[0] for rr in range(4)} == {1}
    # a rail unconfirmed for longer than the stale time takes the next mouse, then (given it) not again
    stale = loaded._replace(queued_bytes=0, confirmed_ns=NOW - 3 * 10**9)
    assert pick_mouse([fresh, stale], 65536, 0, cfg, NOW) == (1, MOUSE_RR | MOUSE_STALE)
    given_it = stale._replace(pending_bytes=65536, pending_ns=NOW)
    assert pick_mouse([fresh, given_it], 65536, 0, cfg, NOW)[1] == MOUSE_RR
    # a busy rail is never stale
    assert pick_mouse([fresh, stale._replace(busy=True)], 65536, 0, cfg, NOW)[1] == MOUSE_RR


def test_the_scheduler_places_mice_by_the_pure_policy():
    """SliceScheduler.plan (the planner) takes the rail pick_mouse gives for the telemetry's views."""
    cfg = SchedulerConfig(gamma=0.1, bandwidth_stale_s=0.0)
    tels = [RailTelemetry(i, 10e9, 1.0, cfg) for i in range(3)]
    for t, b in zip(tels, (1 << 20, 0, 8 << 20), strict=True):
        t.pending_bytes = b
    sched = SliceScheduler(cfg)
    for _ in range(6):
        views = [mouse_view(t, 1.0) for t in tels]
        want, _ = pick_mouse(views, 65536, sched._rr + 1, cfg, NOW)
        assert sched.plan(65536, tels, now_ns=NOW) == [(want, 0, 65536)]
