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
        # each per-round ratio is some round's facade over the same round's native: within the rates' extremes
        assert r["facade_spread"][0] / r["native_spread"][1] <= rlo * 1.001
        assert rhi <= r["facade_spread"][1] / r["native_spread"][0] * 1.001
