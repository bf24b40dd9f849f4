"""Baselines for `tent bench`: tiny sweeps, row shape, positive bandwidth."""

from __future__ import annotations

import math
import multiprocessing as mp

import pytest
from tent_bench.baselines import (
    BASELINES,
    BaselineSweep,
    BaselineUnavailable,
    _Slots,
    available_baselines,
    run_baseline,
)

BLOCKS = [64 << 10, 1 << 20]
BATCHES = [1, 4]
OPS = ["READ", "WRITE"]
KEYS = {"engine", "transport", "op", "block_size", "batch_size", "gbps", "avg_us", "p99_us"}
TRANSPORT = {"socket": "tcp", "cma": "cma", "memcpy": "memcpy", "mooncake": "tcp"}


def _tiny() -> BaselineSweep:
    return BaselineSweep(block_sizes=BLOCKS, batch_sizes=BATCHES, ops=OPS, iters=3, warmup=1, time_budget_s=2.0)


def _check_rows(name: str, rows: list[dict]) -> None:
    assert len(rows) == len(BLOCKS) * len(BATCHES) * len(OPS)
    seen = set()
    for r in rows:
        assert set(r) == KEYS, r
        assert r["engine"] == name
        assert r["transport"] == TRANSPORT[name]
        assert r["op"] in OPS
        assert r["block_size"] in BLOCKS and r["batch_size"] in BATCHES
        for k in ("gbps", "avg_us", "p99_us"):
            assert isinstance(r[k], float) and math.isfinite(r[k]) and r[k] > 0, (k, r)
        assert r["p99_us"] >= r["avg_us"] * 0.5
        seen.add((r["op"], r["block_size"], r["batch_size"]))
    assert len(seen) == len(rows)


def _no_leftover_children() -> None:
    assert [p for p in mp.active_children() if p.name.startswith("tent-baseline")] == []


def test_registry_and_availability():
    assert set(BASELINES) == {"socket", "cma", "memcpy", "mooncake", "fio"}
    av = available_baselines()
    assert set(av) == set(BASELINES)
    assert av["socket"] is None and av["memcpy"] is None
    assert all(v is None or (isinstance(v, str) and v) for v in av.values())


@pytest.mark.parametrize("name", ["socket", "cma", "memcpy", "mooncake"])
def test_baseline_tiny_sweep(name):
    reason = available_baselines()[name]
    if reason is not None:
        with pytest.raises(BaselineUnavailable):
            BASELINES[name](_tiny())
        pytest.skip(f"{name} baseline unavailable: {reason}")
    rows = BASELINES[name](_tiny())
    _check_rows(name, rows)
    _no_leftover_children()


def test_time_budget_limits_iterations():
    sweep = BaselineSweep(
        block_sizes=[64 << 10], batch_sizes=[1], ops=["WRITE"], iters=10**9, warmup=10**9, time_budget_s=0.05
    )
    rows = run_baseline("memcpy", sweep)
    assert len(rows) == 1 and rows[0]["gbps"] > 0


def test_invalid_sweep_and_unknown_name():
    with pytest.raises(ValueError):
        run_baseline("memcpy", BaselineSweep(block_sizes=[4096], batch_sizes=[1], ops=["COPY"], iters=1, warmup=0))
    with pytest.raises(ValueError):
        run_baseline("nope", _tiny())


def test_slots_walk_and_fixed():
    walk = _Slots(4 * 4096, 4096, walk=True)
    assert walk.batch(3) == [0, 4096, 8192]
    assert walk.batch(3) == [12288, 0, 4096]
    fixed = _Slots(4 * 4096, 4096, walk=False)
    assert fixed.batch(2) == [0, 4096]
    assert fixed.batch(2) == [0, 4096]


def test_child_failure_is_reported_and_cleaned_up():
    from tent_bench.baselines import BaselineError

    sweep = BaselineSweep(block_sizes=[4096], batch_sizes=[1], ops=["READ"], iters=1, warmup=0, host="256.0.0.1")
    with pytest.raises(BaselineError, match="socket"):
        run_baseline("socket", sweep)
    _no_leftover_children()


def test_mooncake_unavailable_raises(monkeypatch):
    from tent_bench import baselines

    monkeypatch.setattr(baselines, "_mooncake_unavailable_reason", lambda refresh=False: "not installed (test)")
    with pytest.raises(BaselineUnavailable, match="not installed"):
        baselines.mooncake_baseline(_tiny())
    assert baselines.available_baselines()["mooncake"] == "not installed (test)"
