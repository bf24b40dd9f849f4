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
    assert len(rows) == 4
    for r in rows:
        assert r["facade_gbps"] > 0 and r["native_gbps"] > 0 and r["facade_x_native"] > 0
        assert len(r["facade_spread"]) == 2
