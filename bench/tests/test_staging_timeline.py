"""`python -m tent_bench.staging_timeline` end to end, small and not timed: a real target process and
an initiator engine here, both halves' chunk events merged into one timeline per transfer."""

from __future__ import annotations

import pytest

pytest.importorskip("tent_core.engine")

from tent_bench import staging_timeline  # noqa: E402

MiB = 1 << 20


def test_every_chunk_of_every_transfer_is_on_the_timeline_in_pipeline_order() -> None:
    rep = staging_timeline.run(8 * MiB, 2, ["WRITE", "READ"], 2 * MiB, 2)
    assert [t["op"] for t in rep["transfers"]] == ["WRITE", "WRITE", "READ", "READ"]
    for t in rep["transfers"]:
        # 8 MiB in slot-sized 2 MiB chunks, half a slot first and last (1 + 3 x 2 + 1 MiB), each
        # copied once at the target
        assert t["chunks"] == 5
        assert set(t["chunk_events"]) == {0, 1 * MiB, 3 * MiB, 5 * MiB, 7 * MiB}
        for ev in t["chunk_events"].values():
            assert len(ev["wire"]) == 2 and len(ev["copy"]) == 3
            assert ev["copy"] == sorted(ev["copy"])  # arrive, start, finish
            # WRITE: the wire leg lands before the copy request arrives; READ: the copy finishes first
            if t["op"] == "WRITE":
                assert ev["wire"][1] <= ev["copy"][0]
            else:
                assert ev["copy"][2] <= ev["wire"][0]
        for name, step in t["steps"].items():
            assert step is not None and step["min_ms"] >= 0, name
        assert 0 < t["wire_busy_ms"] <= t["ms"] and 0 < t["copy_busy_ms"] <= t["ms"]
        assert t["both_busy_ms"] <= min(t["wire_busy_ms"], t["copy_busy_ms"])
        # the transfer splits into wire only, copy only, both and neither
        parts = t["wire_only_ms"] + t["copy_only_ms"] + t["both_busy_ms"] + t["neither_ms"]
        assert parts == pytest.approx(t["ms"], abs=1e-6)
        # a session's copies run one at a time: WRITE's last copy runs after the last leg landed, READ's
        # first before the first leg starts, so each op has some time with the copy alone
        assert t["copy_only_ms"] > 0 and t["wire_only_ms"] >= 0
