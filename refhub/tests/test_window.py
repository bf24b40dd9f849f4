"""The request delay a replicating reader's window must cover (refhub.window), on plain numbers."""

from __future__ import annotations

from refhub.window import RequestDelay, full_read_in_order

MB = 1 << 20
RATE = 60 * MB  # bytes/s, about a 500 Mbit/s link


def test_no_delay_when_a_batch_takes_just_its_queue_at_the_rate() -> None:
    d = RequestDelay()
    for _ in range(20):  # 3 MB queued (its own and the batches ahead): 50 ms at 60 MB/s
        assert d.observe(0.05, 3 * MB, RATE) == 0.0
    assert d.mean_s == 0.0 and d.max_s == 0.0 and d.samples == 20


def test_request_delay_is_what_the_round_trip_adds_to_the_queue() -> None:
    d = RequestDelay()
    for _ in range(10):  # every request waits 40 ms behind a downstream reader's bytes
        d.observe(0.05 + 0.04, 3 * MB, RATE)
    d.observe(0.05 + 0.10, 3 * MB, RATE)  # one waits 100 ms
    assert abs(d.mean_s - (10 * 0.04 + 0.10) / 11) < 1e-9
    assert abs(d.max_s - 0.10) < 1e-9


def test_a_batch_faster_than_its_queue_counts_as_no_delay() -> None:
    d = RequestDelay()  # the batches ahead had mostly left already: no negative delay
    assert d.observe(0.01, 3 * MB, RATE) == 0.0


def test_ignores_samples_without_a_rate() -> None:
    d = RequestDelay()
    assert d.observe(0.5, MB, 0.0) is None
    assert d.observe(-1.0, MB, RATE) is None
    assert d.samples == 0 and d.mean_s == 0.0


def test_in_order_on_a_slow_link_where_the_spread_would_lag_the_prefix() -> None:
    # 4 MiB spread over the connections at 60 MB/s: the prefix lags ~70 ms, well over a 20 ms budget
    assert full_read_in_order(RATE, 4 * MB, 0.02, True)


def test_spread_on_a_fast_path_where_the_lag_is_small() -> None:
    # loopback tcp, ~3.5 GB/s: 4 MiB is ~1.2 ms
    assert not full_read_in_order(3500 * MB, 4 * MB, 0.02, True)


def test_the_budget_sets_the_rate_where_it_turns() -> None:
    # 4 MiB within 20 ms: the turn is at 200 MiB/s
    assert full_read_in_order(199 * MB, 4 * MB, 0.02, True)
    assert not full_read_in_order(201 * MB, 4 * MB, 0.02, True)
    assert not full_read_in_order(RATE, 4 * MB, 0.1, True)  # ~70 ms is inside a 100 ms budget


def test_no_rate_or_nothing_spread_keeps_the_spread_form() -> None:
    assert not full_read_in_order(0.0, 4 * MB, 0.02, True)
    assert not full_read_in_order(RATE, 0, 0.02, True)


def test_a_copy_no_reader_waits_on_keeps_the_spread_form_at_any_rate() -> None:
    # a lone reader: nobody waits on its progress word, so order buys nothing (and a loaded host can
    # make a fast path look slow for a while)
    assert not full_read_in_order(RATE, 4 * MB, 0.02, False)
    assert not full_read_in_order(1 * MB, 4 * MB, 0.02, False)
