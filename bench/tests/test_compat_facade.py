"""The facade-vs-native benchmark runs end to end (numbers are docs/benchmarks.md's business)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_facade_bench_smoke() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tent_bench.compat_facade", "--rounds", "2", "--duration", "0.05", "--points", "65536:4,4096:1", "--ops", "READ,WRITE", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    rows = json.loads(out.stdout)
    assert {(r["op"], r["block"], r["batch"]) for r in rows} == {(op, b, n) for op in ("READ", "WRITE")
                                                                  for b, n in ((65536, 4), (4096, 1))}
    for r in rows:
        assert r["rounds"] == 2
        # every rate is the median of its rounds, inside their min-max
        for api in ("facade", "native"):
            lo, hi = r[f"{api}_spread"]
            assert 0 < lo <= r[f"{api}_gbps"] <= hi, (api, r)
        # the ratio is the median of the per-round ratios, not a ratio of the medians; its spread brackets it
        rlo, rhi = r["facade_x_native_spread"]
        assert 0 < rlo <= r["facade_x_native"] <= rhi, r
        # the spreads are rounded to 3 digits (~0.2% each at 0.5 GB/s): their ratio bounds the rounds only that closely
        # each per-round ratio is some round's facade over the same round's native: within the rates' extremes
        assert r["facade_spread"][0] / r["native_spread"][1] <= rlo * 1.005
        assert rhi <= r["facade_spread"][1] / r["native_spread"][0] * 1.005


def test_best_setting_is_the_highest_score_and_failures_never_win() -> None:
    import pytest
    from tent_bench.baselines import knob_score
    from tent_bench.compat_facade import best_setting

    settings = [{"mooncake_env": {}, "score_gbps": 1.2}, {"mooncake_env": {"MC_TCP_LANES_PER_PEER": "4"}, "score_gbps": 1.9},
                {"mooncake_env": {"MC_TCP_LANES_PER_PEER": "8"}, "error": "did not answer"}]  # fmt: skip
    assert best_setting(settings) == {"MC_TCP_LANES_PER_PEER": "4"}
    with pytest.raises(RuntimeError, match="no knob setting ran: did not answer"):
        best_setting(settings[2:])
    assert knob_score([1.0, 4.0]) == pytest.approx(2.0)  # geometric mean: a small block counts as much as a large one
    assert knob_score([0.1, 10.0]) == pytest.approx(1.0)


def test_mooncake_runs_at_the_best_setting_of_its_knob_sweep() -> None:
    import pytest

    try:
        import mooncake.engine  # noqa: F401
    except ImportError:
        pytest.skip("mooncake not installed (make bench-deps)")
    out = subprocess.run(
        [sys.executable, "-m", "tent_bench.compat_facade", "--rounds", "1", "--duration", "0.05", "--points", "65536:4",
         "--ops", "READ", "--force-tcp", "--mooncake", "--tune-duration", "0.05", "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    data = json.loads(out.stdout)
    tuning = next(r for r in data if r.get("kind") == "mooncake_tuning")
    from tent_bench.baselines import MOONCAKE_KNOBS

    assert [s["mooncake_env"] for s in tuning["settings"]] == MOONCAKE_KNOBS  # every setting tried, in order
    ran = [s for s in tuning["settings"] if "score_gbps" in s]
    assert ran and tuning["chosen"] == max(ran, key=lambda s: s["score_gbps"])["mooncake_env"]
    for s in ran:
        assert list(s["points_gbps"]) == ["READ 65536x4"] and len(s["points_gbps"]["READ 65536x4"]) == tuning["passes"]
    (row,) = [r for r in data if "facade_gbps" in r]
    assert row["mooncake_env"] == tuning["chosen"] and len(row["facade_x_mooncake_spread"]) == 2
