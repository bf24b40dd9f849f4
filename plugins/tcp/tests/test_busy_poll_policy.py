"""The adaptive busy-poll policy (tent/busy_poll.h), as compiled into the tcp executor, over
traces of outcomes: no sockets, no timing, deterministic. What each wait polled is decided by
what the previous waits saw, so a trace says per wait when its bytes are there if it polls, if
it sleeps (by default 20 us later: the wake-up), and whether a poll during it loses its core."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tent_tcp.native import busy_poll_replay

CAP = 50  # us, the transport's default busy_poll_us
SLEEP_EVERY = 16  # polling, one wait in 16 sleeps (TENT_BUSY_POLL_SLEEP_EVERY)


def _polled(budgets: list[float]) -> int:
    return sum(1 for b in budgets if b > 0)


def test_off_never_polls() -> None:
    budgets, _ = busy_poll_replay(0, [5.0] * 100)
    assert budgets == [0.0] * 100
    budgets, _ = busy_poll_replay(0, [5.0] * 100, adaptive=False)
    assert budgets == [0.0] * 100


def test_fixed_polls_the_cap_every_time_whatever_happens() -> None:
    budgets, _ = busy_poll_replay(CAP, [500.0] * 50 + [5.0] * 50, [True] * 100, adaptive=False)
    assert budgets == [float(CAP)] * 100


def test_quiet_host_keeps_polling_and_fits_the_budget_to_the_waits() -> None:
    """Answers come in 10-14 us on a core nobody else wants, 20 us later to a sleeping thread:
    every wait polls but one in 16 (which sleeps to keep the comparison current), and the budget
    stays above the waits (a late answer is still caught)."""
    arrive = [10.0 + (i % 5) for i in range(2000)]
    budgets, state = busy_poll_replay(CAP, arrive)
    assert _polled(budgets) >= len(arrive) * (SLEEP_EVERY - 1) // SLEEP_EVERY
    assert all(b >= a for a, b in zip(arrive, budgets, strict=True) if b > 0), "a poll too short for a steady answer"
    assert state["score"] >= 1000 and state["poll_ns"] < state["sleep_ns"]


def test_fast_answers_shrink_the_budget_and_late_ones_grow_it_back() -> None:
    """Answers in 3 us shrink the budget (a miss then burns less); answers within the cap but
    after the budget (on an uncontended core) grow it again instead of giving up polling."""
    fast, slow = [3.0] * 400, [40.0] * 100
    budgets, _ = busy_poll_replay(CAP, fast + slow)
    assert 0 < max(budgets[390:400]) < 40
    assert max(budgets[-SLEEP_EVERY:]) == CAP
    assert _polled(budgets[-50:]) >= 50 - 50 // SLEEP_EVERY - 1 - 2


def test_polling_that_slows_the_peer_gives_way_to_sleeping() -> None:
    """The shared-host case: the answers do come within the poll on a core the poller keeps, but
    polling holds a core the peer needs, so a polled wait (40 us) is longer than a slept one
    (25 us, wake-up included). The waiter learns it from its periodic sleeps and sleeps."""
    budgets, state = busy_poll_replay(CAP, [40.0] * 3000, sleep_us=[25.0] * 3000)
    assert _polled(budgets[:SLEEP_EVERY]) == SLEEP_EVERY - 1
    assert _polled(budgets[1000:]) <= 2000 // 256 + 1
    assert state["probe_gap"] == 256


def test_answers_beyond_the_cap_stop_polling_within_a_few_waits_then_probe_sparsely() -> None:
    """The peer thinks for 500 us between requests (an application computing between them): no
    poll can catch that. Polling stops after a few misses; afterwards at most one wait in
    PROBE_MAX polls, so the CPU burnt is a small fraction of a single cap per wait."""
    budgets, state = busy_poll_replay(CAP, [500.0] * 5000)
    first = next(i for i, b in enumerate(budgets) if b == 0)
    assert first <= 8
    late = budgets[1000:]
    assert _polled(late) <= len(late) // 256 + 1
    assert sum(budgets) / len(budgets) < 0.05 * CAP
    assert state["probe_gap"] == 256


def test_a_lost_core_backs_off_faster_than_a_plain_miss() -> None:
    """Polls that find their bytes in time but lose their core (another thread wanted it: the
    shared-host case) count as misses of double weight: polling stops after three waits, where
    plain misses take six."""
    lost_budgets, _ = busy_poll_replay(CAP, [10.0] * 100, [True] * 100)
    assert all(b > 0 for b in lost_budgets[:3]) and all(b == 0 for b in lost_budgets[3:8])
    assert _polled(lost_budgets) <= 3 + 100 // 8
    miss_budgets, _ = busy_poll_replay(CAP, [500.0] * 100)
    assert all(b > 0 for b in miss_budgets[:6]) and miss_budgets[6] == 0


def test_polling_comes_back_when_the_host_quiets_down() -> None:
    """A busy stretch (every poll loses its core, polled waits longer than slept ones) drives the
    probe gap to its maximum; once polls hit and beat sleeping again, probes (each counting half
    against the busy past) bring polling back within two probe gaps, and it stays."""
    busy, quiet = 3000, 800
    poll_us = [40.0] * busy + [10.0] * quiet
    sleep_us = [25.0] * busy + [30.0] * quiet
    lost = [True] * busy + [False] * quiet
    budgets, _ = busy_poll_replay(CAP, poll_us, lost, sleep_us=sleep_us)
    assert _polled(budgets[busy - 1000 : busy]) <= 1000 // 256 + 1
    assert 0 < _polled(budgets[busy : busy + 2 * 256 + 1])
    tail = budgets[busy + 2 * 256 + 1 :]
    assert _polled(tail) >= len(tail) * (SLEEP_EVERY - 1) // SLEEP_EVERY - 1


def test_mixed_outcomes_follow_what_waiting_costs() -> None:
    """Hits in 10 us (30 us to a sleeper) mixed with misses of 500 us at random waits: with seven
    hits in eight, polling saves a third of the waiting and mostly goes on (the averages swing
    with each 500 us miss); with one in four it saves little (the misses cost as much either way)
    and the waiter sleeps."""
    rng = np.random.default_rng(17)
    mostly_hits = [500.0 if x < 1 / 8 else 10.0 for x in rng.random(3000)]
    mostly_misses = [10.0 if x < 1 / 4 else 500.0 for x in rng.random(3000)]
    assert _polled(busy_poll_replay(CAP, mostly_hits)[0][500:]) >= 2500 * 3 // 5
    assert _polled(busy_poll_replay(CAP, mostly_misses)[0][500:]) < 2500 // 8


@settings(max_examples=200, deadline=None)
@given(
    cap=st.integers(0, 10_000),
    trace=st.lists(st.tuples(st.floats(0, 20_000), st.floats(0, 20_000), st.booleans()), max_size=600),
)
def test_the_budget_stays_within_its_bounds(cap: int, trace: list[tuple[float, float, bool]]) -> None:
    """Whatever happens, a wait polls 0 or between the floor (4 us, or the cap if lower) and the
    cap, and a run of misses beyond the cap never polls more than a few waits in a row."""
    budgets, _ = busy_poll_replay(cap, [p for p, _, _ in trace], [lost for _, _, lost in trace],
                                  sleep_us=[s for _, s, _ in trace])  # fmt: skip
    for b in budgets:
        assert b == 0 or min(4.0, cap) <= b <= cap
    longest, run = 0, 0
    for (p, _, _), b in zip(trace, budgets, strict=True):
        if b > 0 and p > cap:
            run += 1
            longest = max(longest, run)
        elif b > 0:
            run = 0
    assert longest <= 6 + 2  # from a full score: six misses, then a probe's grace of two
