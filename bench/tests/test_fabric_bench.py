"""`tent bench --fabric`: real bytes through the engine over a shaped netns fabric (root only)."""

from __future__ import annotations

import pytest
from tent_bench import fabric_bench as fb
from tent_bench.testbed import Fabric

pytestmark = pytest.mark.netns

MiB = 1 << 20


def _require_fabric() -> None:
    ok, why = Fabric.available()
    if not ok:
        pytest.skip(f"fabric unavailable: {why}")


def test_fault_and_degrade_parsing_without_root():
    plan = fb.parse_fault("down 0 at 1s; up 0 at 3000ms; degrade 2:0.5 at 1.5; restore 2 at 2s", 5)
    assert [(e.t, e.action, e.rail) for e in plan.events] == [
        (1.0, "down", 0), (1.5, "degrade", 2), (2.0, "restore", 2), (3.0, "up", 0)
    ]
    assert plan.events[1].factor == 0.5
    flap = fb.parse_fault("flap 1 every 300ms", 4)
    assert flap.flap == (1, 0.3, 1.0, 3.0)
    assert [e.action for e in flap.events][:2] == ["down", "up"] and flap.events[-1].action == "up"
    assert fb.parse_degrade("3:0.5,1:0.25") == [(3, 0.5), (1, 0.25)]
    for bad in ("explode 0 at 1s", "down 0 at 9s", "degrade 0:2 at 1s"):
        with pytest.raises(ValueError):
            fb.parse_fault(bad, 5)
    with pytest.raises(ValueError):
        fb.parse_degrade("3")


def test_spray_moves_verified_bytes_in_proportion_to_rail_rates():
    """2 rails, one at half rate: every byte checked, the slow rail carries ~1/3 of the bytes."""
    _require_fabric()
    spec = fb.FabricBenchSpec(fabric="2x200mbit", degrade=[(1, 0.5)], policies=["spray"], duration_s=4.0,
                              verify_block=8 * MiB, threads=2)  # fmt: skip
    rows = fb.run_fabric_bench(spec)
    perf = next(r for r in rows if r.get("engine") == "tent")
    summ = next(r for r in rows if r.get("kind") == "fault_summary")
    assert summ["app_errors"] == 0 and summ["corrupt"] == 0
    assert summ["bytes_verified"] == summ["bytes_requested"] > 0
    share = perf["rail_share"]
    assert abs(share[1] - 1 / 3) < 0.1, share
    # both rails busy: the verified goodput is well above what the fast rail alone could carry
    assert summ["verified_gbit"] > 0.2, summ["verified_gbit"]


def test_fault_mode_rail_down_and_up_no_app_errors_and_rail_returns():
    """`tent bench --fabric ... --fault` (the wire-rate timelines of scripts/bench-fabric.sh); the
    scenarios themselves are measured from verified completions in test_resilience_fabric.py."""
    _require_fabric()
    spec = fb.FabricBenchSpec(fabric="2x200mbit", policies=["spray"], duration_s=4.0, verify_block=8 * MiB,
                              threads=2, fault="down 0 at 0.8s; up 0 at 1.5s")  # fmt: skip
    rows = fb.run_fabric_bench(spec)
    summ = next(r for r in rows if r.get("kind") == "fault_summary")
    assert summ["fault_errors"] == []
    assert summ["app_errors"] == 0 and summ["corrupt"] == 0, summ["errors"]
    assert summ["all_verified"] and summ["bytes_verified"] == summ["bytes_requested"] > 0
    assert summ["after_last_event_rail_gbit"][0] > 0, summ  # the downed rail carried traffic again
