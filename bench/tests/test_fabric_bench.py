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


def test_peer_death_on_the_fabric_is_an_error_within_the_deadline():
    """The target dies mid-transfer: every rail goes silent; the application gets an error, not a hang."""
    import json
    import signal
    import subprocess
    import sys
    import time

    _require_fabric()
    with Fabric(nodes=2, rails=2, rate="200mbit") as fab:
        target_cfg = {"transports": {"tcp": {"rails": fab.addrs(1), "slice_timeout_ms": 100}}}
        target = fab.popen(1, [sys.executable, "-m", "tent_bench.target", "--size", str(32 * MiB), "--host",
                               fab.addrs(1)[0], "--config", json.dumps(target_cfg)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            seg = json.loads(target.stdout.readline())["segment"]
            code = (
                "import sys, time\n"
                "from tent_core import Engine, Request, READ\n"
                "from tent_core.errors import TentError\n"
                f"cfg = {{'transports': {{'tcp': {{'rails': {fab.addrs(0)!r}, 'slice_timeout_ms': 100, 'connect_timeout_ms': 100}}}}}}\n"
                "with Engine(cfg, transports=['tcp']) as eng:\n"
                "    buf = eng.allocate(32 << 20)\n"
                f"    eng.read(buf, {seg!r}, 1 << 20)\n"
                "    print('ready', flush=True)\n"
                "    t0 = time.monotonic()\n"
                "    try:\n"
                "        for _ in range(20):\n"
                f"            eng.submit([Request(READ, buf, 0, {seg!r}, 0, 32 << 20)], deadline=4.0).wait()\n"
                "        print('no error', flush=True)\n"
                "    except TentError as exc:\n"
                "        print('error', type(exc).__name__, round(time.monotonic() - t0, 2), flush=True)\n"
            )
            init = fab.popen(0, [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            assert init.stdout.readline().strip() == "ready"
            time.sleep(0.3)
            target.send_signal(signal.SIGKILL)
            out, _ = init.communicate(timeout=30)
            words = out.split()
            assert words[0] == "error", out
            assert words[1] in ("PeerUnreachableError", "DeadlineExceededError", "PeerSilentError"), out
            assert float(words[2]) < 4.5, out  # within the request deadline (+ scheduling slack)
        finally:
            target.kill()
            target.wait(10)


def test_offered_load_reports_the_realized_load_over_several_seeds():
    """Open loop, 2 arrival processes: both policies see the same arrivals (same realized load per
    seed), and the P99 ratio is the median of the per-seed ratios."""
    _require_fabric()
    import statistics

    spec = fb.FabricBenchSpec(fabric="2x200mbit", degrade=[(1, 0.5)], policies=["spray", "round_robin"],
                              block_sizes=[1 * MiB], threads=2, offered_loads=[0.1], seeds=2, open_requests=12,
                              budget_s=0.5)  # fmt: skip
    rows = fb.run_fabric_bench(spec)
    perf = {r["policy"]: r for r in rows if r.get("engine") == "tent"}
    assert set(perf) == {"spray", "round_robin"}
    s, rr = perf["spray"], perf["round_robin"]
    assert s["rounds"] == rr["rounds"] == 2 and s["offered_gbit"] == 0.1
    assert s["realized_gbit_rounds"] == rr["realized_gbit_rounds"]  # the same arrival processes
    assert all(0.02 < x < 0.5 for x in s["realized_gbit_rounds"])  # Poisson around 0.1 Gbit/s
    ratios = [a / b for a, b in zip(s["p99_us_rounds"], rr["p99_us_rounds"], strict=True)]
    assert s["p99_vs_round_robin"] == pytest.approx(statistics.median(ratios), rel=1e-3, abs=1e-3)
    assert s["requests"] == 12


def _mixed(label: str, r: int, p50: float, p99: float, el: float, low: float, count: int = 400) -> dict:
    return {"kind": "mixed_round", "policy": "spray", "label": label, "round": r, "mice_count": count,
            "mice_p50_us": p50, "mice_p99_us": p99, "mice_idle_p50_us": 200.0, "mice_idle_p99_us": 300.0,
            "elephant_gbit": el, "lone_low_gbit": low, "lone_mid_gbit": 3.5, "elephant_errors": []}  # fmt: skip


def test_summarize_mixed_medians_spread_and_per_round_ratios_to_qos_off():
    """Per variant the median and min-max over the rounds; ratios to qos=off within each round,
    then their median (not the ratio of the medians: 0.5/2 and 0.25 here differ)."""
    rows = [_mixed("spray qos=off", 0, 400e3, 800e3, 3.6, 3.5), _mixed("spray qos=on", 0, 500.0, 400e3, 3.0, 3.4),
            _mixed("spray qos=on", 1, 600.0, 100e3, 3.3, 3.6), _mixed("spray qos=off", 1, 420e3, 200e3, 3.5, 3.6),
            _mixed("spray qos=off", 2, 450e3, 500e3, 3.4, 3.3), _mixed("spray qos=on", 2, 700.0, 300e3, 3.1, 3.5, 390)]  # fmt: skip
    out = {r["label"]: r for r in fb.summarize_mixed(rows)}
    assert list(out) == ["spray qos=off", "spray qos=on"]
    on, off = out["spray qos=on"], out["spray qos=off"]
    assert on["kind"] == "mixed" and on["rounds"] == off["rounds"] == 3
    assert on["mice_p50_us"] == 600.0 and on["mice_p50_us_min"] == 500.0 and on["mice_p50_us_max"] == 700.0
    assert on["mice_count"] == 400 and on["mice_count_min"] == 390 and on["mice_p50_us_rounds"] == [500.0, 600.0, 700.0]
    # per round: 400/800, 100/200, 300/500 -> 0.5, 0.5, 0.6
    assert on["mice_p99_us_vs_off"] == pytest.approx(0.5) and on["mice_p99_us_vs_off_max"] == pytest.approx(0.6)
    assert on["elephant_gbit_vs_off"] == pytest.approx(3.1 / 3.4, abs=1e-4)  # 0.833, 0.943, 0.912: the middle one
    assert on["elephant_gbit_vs_off_min"] == pytest.approx(3.0 / 3.6, abs=1e-4)
    assert "mice_p99_us_vs_off" not in off
    table = fb.qos_markdown(fb.summarize_mixed(rows))
    assert "| spray qos=on | 400 (390-400) | 0.6 (0.5-0.7) |" in table and "Median (min-max) of 3 rounds" in table


def test_mixed_runs_every_qos_variant_once_per_round_and_summarizes_them():
    """`--mixed` over 2 rounds on a real fabric: one row per variant and round, the order rotating,
    and summary rows whose medians and ratios are those of the per-round rows."""
    _require_fabric()
    import statistics

    spec = fb.FabricBenchSpec(fabric="2x200mbit", policies=["spray"], mixed=True, rounds=2, verify_block=4 * MiB,
                              threads=2, mixed_duration_s=1.0, lone_s=0.3)  # fmt: skip
    rows = fb.run_fabric_bench(spec)
    per = [r for r in rows if r.get("kind") == "mixed_round"]
    summ = {r["label"]: r for r in rows if r.get("kind") == "mixed"}
    labels = list(summ)
    assert len(labels) >= 2 and labels[0].endswith("qos=off")
    assert [r["label"] for r in per] == labels + labels[1:] + labels[:1]  # round 1 rotated by one
    for label, s in summ.items():
        mine = [r for r in per if r["label"] == label]
        assert s["rounds"] == 2 and [r["round"] for r in mine] == [0, 1]
        assert s["mice_count"] == statistics.median(r["mice_count"] for r in mine) and s["mice_count_min"] >= 1
        assert s["mice_p50_us_min"] <= s["mice_p50_us"] <= s["mice_p50_us_max"]
        assert s["elephant_errors"] == [] and s["lone_low_gbit_rounds"] == [r["lone_low_gbit"] for r in mine]
        if not label.endswith("qos=off"):
            off = [r for r in per if r["label"] == labels[0]]
            ratios = [a["mice_p99_us"] / b["mice_p99_us"] for a, b in zip(mine, off, strict=True)]
            assert s["mice_p99_us_vs_off"] == pytest.approx(statistics.median(ratios), rel=1e-3)
