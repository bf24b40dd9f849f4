"""The shaped-link benchmarks end to end, small: burst (pipeline vs not, gloo) and failure masking,
each node a network namespace of a tent_core Fabric (skipped without root)."""

from __future__ import annotations

import pytest

pytest.importorskip("tent_core.engine")

from tent_bench.refhub.net import burst, failover  # noqa: E402
from tent_bench.testbed import Fabric  # noqa: E402

pytestmark = pytest.mark.netns


@pytest.fixture(autouse=True)
def _fabric() -> None:
    ok, why = Fabric.available()
    if not ok:
        pytest.skip(f"fabric unavailable: {why}")


def test_burst_pipeline_beats_fan_out_over_shaped_links() -> None:
    peers: tuple[str, ...] = ()
    try:
        import torch  # noqa: F401

        peers = ("gloo",)
    except ImportError:
        pass
    res = burst([1, 3], size_mb=16, tensors=8, rate="300mbit", peers=peers, rounds=2)
    assert "star" in res["links"], res
    assert res["rounds"] == 2 and res["systems_interleaved"][:2] == ["pipeline", "no_pipeline"], res
    one, three = res["rows"]
    assert one["n"] == 1 and three["n"] == 3
    assert three["pipeline_from_publisher"] == 1  # the others read from partial copies
    # the chain: every receiver but the first read a partial copy of another receiver
    firsts = [r["sources"][0] for r in three["pipeline_receivers"]]
    assert sorted(p for _, p in firsts) == [False, True, True], firsts
    # without pipeline the publisher's uplink is shared 3 ways: the total stall grows ~quadratically
    assert three["no_pipeline_s"] > 1.4 * three["pipeline_s"], res
    assert three["pipeline_per_receiver_s"] < 2.0 * one["pipeline_per_receiver_s"], res
    if peers:  # both gloo forms ran (their bytes verified), the row reports the better one
        forms = [three["gloo_chain_s"], three["gloo_async_s"]]
        assert None not in forms and three["gloo_s"] == min(forms), res
    else:  # torch is an optional benchmark dependency: gloo was not asked for
        assert res["notes"].get("gloo") == "not requested", res["notes"]
    assert res["notes"].get("ray") == "not requested"


def test_failover_masks_a_failed_pipeline_source_loud_or_silent() -> None:
    # 0.5 s per transfer: B is scheduled on A's partial copy even when this machine is slow
    res = failover(size_mb=24, tensors=16, rate="400mbit", kill_at=0.5, lead_s=0.08)
    assert set(res["failures"]) == {"kill", "stop", "cut"}, res
    assert res["no_failure"]["B_data_ok"] and res["no_failure"]["B_started_on_A"], res["no_failure"]
    for how, row in res["failures"].items():
        assert row["B_data_ok"], (how, row)
        # B was reading A's partial copy and finished from the publisher
        assert row["B_started_on_A"] and ["publisher", False] in row["B_sources"][1:], (how, row)
        # no hang: recovery is bounded by the failure detection, not by a time budget (how long it
        # takes is a benchmark figure, docs/benchmarks.md, not a test). A silent A in particular is
        # given up on its silence (REFHUB_SOURCE_SILENCE_S, after the engine cut the stalled slices:
        # ~1-2 s), never by waiting out a pull batch's 10 s engine deadline, which once happened
        assert res["extra_s"][how] < 8.0, res
