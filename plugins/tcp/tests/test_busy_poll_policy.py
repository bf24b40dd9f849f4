"""The adaptive busy-poll policy (tent/busy_poll.h), as compiled into the tcp executor, over
traces of outcomes: no sockets, no timing, deterministic. What each wait polled is decided by
what the previous waits saw, so a trace is a (when the bytes came, whether a poll lost its core)
pair per wait."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tent_tcp.native import busy_poll_replay

CAP = 50  # us, the transport's default busy_poll_us


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
    """Answers come in 10-14 us on a core nobody else wants: every wait polls, and the budget
    settles well below the cap but with room over the waits (a late answer is still caught)."""
    arrive = [10.0 + (i % 5) for i in range(2000)]
    budgets, state = busy_poll_replay(CAP, arrive)
    assert _polled(budgets) == len(arrive)
    assert all(b >= a for a, b in zip(arrive, budgets, strict=True)), "a poll that is too short to catch a steady answer"
    assert 2 * 14 <= budgets[-1] <= CAP
    assert state["score"] >= 1000


def test_a_late_answer_grows_the_budget_up_to_the_cap() -> None:
    """After fast answers shrank the budget, answers within the cap but after the budget (on an
    uncontended core) grow it again instead of giving up polling."""
    fast, slow = [3.0] * 400, [40.0] * 50
    budgets, _ = busy_poll_replay(CAP, fast + slow)
    assert budgets[399] < 40
    assert budgets[-1] == CAP
    assert _polled(budgets[400:]) == 50


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
    """A busy stretch (every poll loses its core) drives the probe gap to its maximum; once polls
    hit again, the first probe that hits brings polling back within one probe gap."""
    busy = 3000
    arrive = [10.0] * (busy + 600)
    lost = [True] * busy + [False] * 600
    budgets, _ = busy_poll_replay(CAP, arrive, lost)
    assert _polled(budgets[busy - 1000 : busy]) <= 1000 // 256 + 1
    back = next(i for i in range(busy, len(budgets)) if budgets[i] > 0)
    assert back - busy <= 256
    assert all(b > 0 for b in budgets[back:])


def test_mixed_outcomes_settle_on_the_side_of_the_majority() -> None:
    """Three hits in four keep a waiter polling; one in four puts it to sleep."""
    mostly_hits = [10.0 if i % 4 else 500.0 for i in range(2000)]
    mostly_misses = [500.0 if i % 4 else 10.0 for i in range(2000)]
    assert _polled(busy_poll_replay(CAP, mostly_hits)[0][500:]) == 1500
    assert _polled(busy_poll_replay(CAP, mostly_misses)[0][500:]) < 1500 // 8


@settings(max_examples=200, deadline=None)
@given(
    cap=st.integers(0, 10_000),
    trace=st.lists(st.tuples(st.floats(0, 20_000), st.booleans()), max_size=600),
)
def test_the_budget_stays_within_its_bounds(cap: int, trace: list[tuple[float, bool]]) -> None:
    """Whatever happens, a wait polls 0 or between the floor (4 us, or the cap if lower) and the
    cap, and a run of misses beyond the cap never polls more than a few waits in a row."""
    budgets, _ = busy_poll_replay(cap, [a for a, _ in trace], [lost for _, lost in trace])
    for b in budgets:
        assert b == 0 or min(4.0, cap) <= b <= cap
    misses, run = 0, 0
    for (a, _), b in zip(trace, budgets, strict=True):
        if b > 0 and a > cap:
            run += 1
            misses = max(misses, run)
        elif b > 0:
            run = 0
    assert misses <= 8 + 2  # from a full score: six misses, then a probe's grace of two
