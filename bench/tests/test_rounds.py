"""tent_bench.rounds: rotating order, skipped contenders, medians and per-round ratios."""

from __future__ import annotations

import pytest
from tent_bench.rounds import ContenderSkipped, round_order, run_rounds, summarize


def test_order_rotates_so_no_contender_always_goes_first():
    assert [round_order(["a", "b"], r) for r in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert [round_order(["a", "b", "c"], r)[0] for r in range(3)] == ["a", "b", "c"]


def test_rounds_interleave_and_a_skipped_contender_is_dropped():
    calls: list[tuple[str, int]] = []

    def make(name: str):
        def run(r: int):
            calls.append((name, r))
            if name == "peer":
                raise ContenderSkipped("not installed")
            return [{"engine": name, "op": "READ", "block_size": 1, "batch_size": 1, "gbps": 1.0}]

        return run

    skipped: list[tuple[str, str]] = []
    rows = run_rounds([("tent", make("tent")), ("peer", make("peer")), ("base", make("base"))], 3,
                      skipped=lambda n, why: skipped.append((n, why)))  # fmt: skip
    assert calls == [("tent", 0), ("peer", 0), ("base", 0), ("base", 1), ("tent", 1), ("tent", 2), ("base", 2)]
    assert skipped == [("peer", "not installed")]
    assert [r["round"] for r in rows] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError):
        run_rounds([("a", make("a"))], 0)


def test_ratios_are_per_round_then_median():
    def row(engine: str, r: int, gbps: float, p99: float) -> dict:
        return {"engine": engine, "transport": "tcp", "op": "WRITE", "block_size": 4, "batch_size": 1, "gbps": gbps,
                "p99_us": p99, "round": r}  # fmt: skip

    # the machine slows down in round 1: both sides do; the per-round ratio stays 2
    rows = [row("tent", 0, 8.0, 100), row("base", 0, 4.0, 200), row("base", 1, 1.0, 800), row("tent", 1, 2.0, 400),
            row("tent", 2, 6.0, 150), row("base", 2, 2.0, 300)]  # fmt: skip
    out = {r["engine"]: r for r in summarize(rows)}
    t, b = out["tent"], out["base"]
    assert t["gbps"] == 6.0 and (t["gbps_min"], t["gbps_max"]) == (2.0, 8.0) and t["rounds"] == 3
    assert b["gbps"] == 2.0
    assert t["x_base"] == 2.0 and (t["x_base_min"], t["x_base_max"]) == (2.0, 3.0)  # not 6.0 / 2.0 of the medians' luck
    assert t["p99_vs_base"] == 0.5
    assert "x_tent" not in b


def test_same_transport_matches_two_settings_of_one_engine_per_transport():
    rows = []
    for r in range(2):
        for t, tok, none in (("tcp", 1.0, 2.0), ("shm", 10.0, 5.0)):
            rows += [{"engine": "token", "transport": t, "op": "READ", "block_size": 4, "batch_size": 1, "gbps": tok, "round": r},
                     {"engine": "none", "transport": t, "op": "READ", "block_size": 4, "batch_size": 1, "gbps": none, "round": r}]  # fmt: skip
    out = {(a["engine"], a["transport"]): a for a in summarize(rows, ours="token", same_transport=True)}
    assert out[("token", "tcp")]["x_none"] == 0.5 and out[("token", "shm")]["x_none"] == 2.0
