"""The pull A/B probe (tent_bench.refhub.pull_ab): real publisher and reader processes over loopback tcp."""

from __future__ import annotations

import pytest
from tent_bench.refhub import pull_ab


def test_pull_ab_runs_every_series() -> None:
    out = pull_ab.run({"default": {}, "small_batches": {"BATCH": 2 << 20}, "unverified": {"verify": False},
                       "raw_copy": {"raw": "one"}}, rounds=2, size_mb=32, tensors=20, transport="tcp")
    s = out["series"]
    assert set(s) == {"raw_one", "raw_windowed", "default", "small_batches", "unverified", "raw_copy"}
    for name, row in s.items():
        assert len(row["x_raw_best_per_round"]) == 2, name
        assert row["GBps_median"] > 0 and row["cores_busy"] > 0
    for name in ("raw_one", "raw_windowed"):  # each round's better raw form is the reference
        assert all(x <= 1.0 for x in s[name]["x_raw_best_per_round"])
    # the replicate variants are split into control requests and the pull, and compared with the first one
    assert s["small_batches"]["pull_s_median_ms"] > 0 and s["small_batches"]["ctl_s_median_ms"] > 0
    assert len(s["small_batches"]["x_default_per_round"]) == 2 and "x_default_per_round" not in s["default"]
    # the knob reached the pull: no batch over 2 MiB, so at least 32 MiB / 2 MiB of them
    assert s["small_batches"]["batches_median"] >= 16
    assert out["order"] == "rotating" and 0 <= out["raw_one_won_rounds"] <= 2


def test_pull_ab_rejects_unknown_knobs_and_incomplete_orders() -> None:
    with pytest.raises(SystemExit, match="no knob"):
        pull_ab.main(["--variants", '{"x": {"NOT_A_KNOB": 1}}'])
    with pytest.raises(SystemExit, match="--order"):
        pull_ab.main(["--variants", '{"default": {}}', "--order", "raw_one,default"])
