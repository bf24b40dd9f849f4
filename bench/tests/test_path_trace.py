"""`tent_bench.path_trace`: the staged pipeline's per-request phases (a pure function over the
`tent_core.staged.TRACE` events) and one small real run of the tool (a file here, tcp to a target
process, the file mapped as memory too)."""

from __future__ import annotations

import pytest
from tent_bench.path_trace import _phases, run

MS = 1_000_000  # ns


def test_phases_split_a_request_into_fill_overlap_drain_and_idle():
    ev = [("begin", -1, 0), ("stage1_submit", 0, 1), ("stage1_submit", 1, 1), ("stage1_done", 0, 2 * MS),
          ("stage2_submit", 0, 2 * MS), ("stage1_done", 1, 5 * MS), ("stage2_submit", 1, 5 * MS),
          ("stage2_done", 0, 6 * MS), ("stage2_done", 1, 9 * MS), ("end", -1, 10 * MS)]  # fmt: skip
    p = _phases(ev)
    assert p["stage1"] == pytest.approx(0.002, abs=1e-8)  # until chunk 0's file leg is done
    assert p["both"] == pytest.approx(0.003)  # 2 -> 5 ms: chunk 1's file leg beside chunk 0's tcp leg
    assert p["stage2"] == pytest.approx(0.004)  # 5 -> 9 ms
    assert p["neither"] == pytest.approx(0.001, abs=1e-8)  # 9 -> 10 ms, and the first ns
    assert p["total"] == pytest.approx(0.010)
    assert sum(p[k] for k in ("stage1", "both", "stage2", "neither")) == pytest.approx(p["total"])


def test_path_trace_runs_every_case_and_traces_every_chunk(tmp_path):
    rep = run(8 << 20, 3, {"staging_chunk_bytes": 2 << 20, "staging_min_chunk_bytes": 1 << 20}, str(tmp_path), mapped=True)
    assert [r["case"] for r in rep["runs"]] == ["file->memory", "memory->remote", "staged", "file mapped->remote"]
    for r in rep["runs"]:
        assert r["seconds"] > 0 and r["initiator"] and r["target"]
    chunks = {k.split(":")[0] for k in rep["chunks"]}
    assert len(chunks) >= 4  # 8 MiB in chunks of at most 2 MiB
    for i in chunks:
        t = {name: rep["chunks"][f"{i}:{name}"] for name in ("stage1_submit", "stage1_done", "stage2_submit", "stage2_done")}
        assert t["stage1_submit"] <= t["stage1_done"] <= t["stage2_submit"] <= t["stage2_done"]
    ph = rep["phases_ms"]
    assert ph["total"] > 0 and ph["app_total"] >= ph["total"]
