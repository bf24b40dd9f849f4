"""`python -m tent_bench.fabric_lone`: lone requests on a shaped fabric, each rail's part timed."""

from __future__ import annotations

import pytest
from tent_bench import fabric_lone as fl
from tent_bench.testbed import Fabric

pytestmark = pytest.mark.netns

MiB = 1 << 20


def test_analyze_times_each_rails_part_of_a_request():
    # two rails; rail 1 carries its part later and finishes 30 ms after rail 0
    raw = {
        "reqs": [{"t0": 10.0, "t1": 10.1, "est_gbit": [1.0, 0.5], "state": ["H", "H"]}],
        "samples": [(9.9, [0, 0]), (10.0, [0, 0]), (10.01, [MiB, 0]), (10.03, [2 * MiB, MiB]), (10.07, [3 * MiB, MiB]),
                    (10.1, [3 * MiB, 2 * MiB]), (10.2, [3 * MiB, 2 * MiB])],
    }
    (r,) = fl.analyze(raw)
    assert r["ms"] == pytest.approx(100.0)
    assert r["mib"] == [3.0, 2.0]
    assert r["first_ms"] == [pytest.approx(10.0), pytest.approx(30.0)]
    assert r["last_ms"] == [pytest.approx(70.0), pytest.approx(100.0)]
    assert r["skew_ms"] == pytest.approx(30.0)
    s = fl.summary([r, r], slow=1)
    assert s["requests"] == 1 and s["median_slow_share"] == pytest.approx(0.4)


def test_lone_requests_on_a_degraded_fabric():
    ok, why = Fabric.available()
    if not ok:
        pytest.skip(f"fabric unavailable: {why}")
    res = fl.run("2x200mbit", "1:0.5", requests=3, gap=0.2, block=4 * MiB)
    assert res["tcp_slow_start_after_idle"] in (["0"], ["1"])
    assert len(res["rows"]) == 3
    for r in res["rows"]:
        assert sum(r["mib"]) == pytest.approx(4.0)  # every byte of each request on some rail
        assert r["ms"] > 0 and all(x is not None for x in r["last_ms"] if x)
    assert res["summary"]["requests"] == 2
