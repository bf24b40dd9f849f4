"""pipeline_ab's per-depth view of a pipeline round, on plain replies (no namespaces)."""

from __future__ import annotations

from tent_bench.refhub.pipeline_ab import _by_depth, chain


def _reply(src: str, secs: float, t_end: float, rd: float | None = 0.004) -> dict:
    return {"sources": [[src, src != "publisher"]], "secs": secs, "t_end": t_end, "starved_s": 0.01,
            "request_delay_s": [rd, 2 * rd] if rd is not None else None}


def test_chain_orders_receivers_by_depth_with_their_lag() -> None:
    # rollout2 reads the publisher, rollout0 reads rollout2, rollout1 reads rollout0
    out = [_reply("rollout2", 1.30, 101.30), _reply("rollout0", 1.36, 101.36, None), _reply("publisher", 1.20, 101.20)]
    hops = chain(out)
    assert [(h["depth"], h["name"], h["source"]) for h in hops] == [
        (1, "rollout2", "publisher"), (2, "rollout0", "rollout2"), (3, "rollout1", "rollout0")]
    assert hops[0]["lag_s"] is None
    assert abs(hops[1]["lag_s"] - 0.10) < 1e-9 and abs(hops[2]["lag_s"] - 0.06) < 1e-9
    assert hops[0]["request_delay_s"] == 0.004 and hops[2]["request_delay_s"] is None


def test_chain_keeps_fan_out_and_drops_unreachable_readers() -> None:
    out = [_reply("publisher", 1.2, 10.0), _reply("publisher", 1.3, 10.1), _reply("rollout0", 1.4, 10.3),
           _reply("gone", 1.5, 10.4)]  # a source that is no receiver of this round
    hops = chain(out)
    assert [(h["depth"], h["name"]) for h in hops] == [(1, "rollout0"), (1, "rollout1"), (2, "rollout2")]


def test_by_depth_takes_medians_over_rounds() -> None:
    r1 = chain([_reply("publisher", 1.2, 10.0), _reply("rollout0", 1.3, 10.1)])
    r2 = chain([_reply("publisher", 1.4, 20.0), _reply("rollout0", 1.7, 20.3)])
    r3 = chain([_reply("publisher", 1.3, 30.0), _reply("rollout0", 1.5, 30.2)])
    rows = _by_depth([r1, r2, r3])
    assert [r["depth"] for r in rows] == [1, 2]
    assert rows[0]["secs"] == 1.3 and rows[0]["lag_s"] is None and rows[0]["hops"] == 3
    assert rows[1]["secs"] == 1.5 and rows[1]["lag_s"] == 0.2


def test_chain_compares_a_hop_with_its_source_at_the_same_bytes() -> None:
    # the source held each sixteenth 10 ms apart; its reader started 5 ms later, was routed in 2 ms, and
    # held the first sixteenth 30 ms after it (its start delay) and half 50 ms after it (stalls since)
    src = _reply("publisher", 0.2, 100.2)
    src.update({"t_start": 100.0, "routed_s": 0.001, "marks_s": [0.01 * (i + 1) for i in range(16)], "cpu_s": 0.1,
                "nivcsw": 7})
    hop = _reply("rollout0", 0.25, 100.255)
    # its marks are from its own pull's start, 100.007 (the source's from 100.001)
    marks = [0.01 * (i + 1) + (0.03 if i == 0 else 0.05) - 0.006 for i in range(16)]
    hop.update({"t_start": 100.005, "routed_s": 0.002, "marks_s": marks, "submit_s": [0.5, 0.05, 250, 0.04]})
    hops = chain([src, hop])
    assert hops[0]["lag_first16_s"] is None and hops[0]["start_s"] == 0.0 and hops[0]["nivcsw"] == 7
    assert abs(hops[1]["lag_first16_s"] - 0.03) < 1e-9 and abs(hops[1]["lag_half_s"] - 0.05) < 1e-9
    assert abs(hops[1]["start_s"] - 0.005) < 1e-9 and hops[1]["routed_s"] == 0.002 and hops[1]["cpu_s"] is None
    assert abs(hops[1]["submit_ms"] - 2.0) < 1e-9 and abs(hops[1]["submit_cpu_ms"] - 0.2) < 1e-9
    assert abs(hops[1]["submit_max_ms"] - 40.0) < 1e-9 and hops[0]["submit_ms"] is None


def test_chain_without_marks_leaves_the_mark_lags_out() -> None:
    hops = chain([_reply("publisher", 1.2, 10.0), _reply("rollout0", 1.3, 10.1)])
    assert hops[1]["lag_first16_s"] is None and hops[1]["lag_half_s"] is None and hops[1]["start_s"] is None
    assert _by_depth([hops])[1]["lag_half_s"] is None
