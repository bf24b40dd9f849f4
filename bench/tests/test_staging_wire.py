"""The staged-path benchmarks over a real wire, small and not timed: `tent bench-staging --wire` and
`tent bench --path file:tcp --wire` end to end, two network namespaces joined by a tc-shaped veth
pair (skipped without root). Both benchmarks check every path's bytes before they time it (patterns
that never repeat) and raise on a mismatch; here we also check that the bytes crossed the shaped
wire (no path runs faster than the shaper lets it) and that nothing is left behind."""

from __future__ import annotations

import pytest

pytest.importorskip("tent_core.engine")

from tent_bench import runner, staging  # noqa: E402
from tent_bench.testbed import Fabric, fabric  # noqa: E402

pytestmark = pytest.mark.netns

RATE_GBIT = 0.5  # 62.5 MB/s at layer 2: loopback or shm would be ~50x faster
CEILING_GBPS = RATE_GBIT / 8 * 1.1  # GB/s no transfer over the shaped veth can beat (TBF burst included)


@pytest.fixture(autouse=True)
def _fabric() -> None:
    ok, why = Fabric.available()
    if not ok:
        pytest.skip(f"fabric unavailable: {why}")


def _namespaces() -> set[str]:
    """This process's fabric namespaces (default_prefix: "t<base36 pid>-..."): another run's, made
    while this test runs, are not its leftovers."""
    mine = fabric.default_prefix().rsplit("-", 1)[0] + "-"
    return {n for n in fabric.list_namespaces() if n.startswith(mine)}


def test_bench_staging_over_a_shaped_wire_end_to_end() -> None:
    before = _namespaces()
    rep = staging.run_wire(8 << 20, rounds=2, rate="500mbit", chunk=1 << 20, depth=4)
    assert rep["wire"]["rate_gbit"] == RATE_GBIT and rep["wire"]["target"].startswith("198.18."), rep["wire"]
    assert rep["paths"]["staged_write"] == "target-staged", rep["paths"]
    for op in ("WRITE", "READ"):
        e = rep["ops"][op]
        # the wire and the staged path crossed the shaper (an upper bound: load only slows them);
        # the target's local copy is measured too (how fast is not asserted: the machine is shared)
        assert 0 < e["wire"]["max"] <= CEILING_GBPS, (op, e)
        assert 0 < e["staged"]["max"] <= CEILING_GBPS, (op, e)
        assert e["copy"]["median_GBps"] > 0 and e["slower_stage"] in ("wire", "copy"), (op, e)
        r = e["ratio_staged_vs_slower_stage"]
        assert 0 < r["min"] <= r["median"] <= r["max"], (op, r)
        # each path's cores busy, and the staged path's shortfall from its limit, from the same rounds
        assert set(e["cores_busy"]) == {"staged", "wire", "copy"} and all(v > 0 for v in e["cores_busy"].values()), e
        sf = e["limit_shortfall"]
        assert 0 < sf["cpu"]["min"] <= sf["cpu"]["max"] and 0 < sf["cores_busy"]["min"] <= sf["cores_busy"]["max"], sf
    assert rep["cores"] >= 1
    assert _namespaces() <= before  # the fabric is gone


def test_path_bench_over_a_shaped_wire_end_to_end(tmp_path) -> None:
    before = _namespaces()
    spec = runner.BenchSpec(block_sizes=[4 << 20], iters=2, warmup=1, time_budget_s=5.0, file_dir=str(tmp_path),
                            wire="500mbit")
    rows = runner.run_staged_path(spec, "file:tcp", str(tmp_path))  # raises if the target's bytes differ
    by_stage = {r["stage"]: r for r in rows}
    # the path the engine planned (mapped: tcp from a mapping of the file), named by the row
    assert set(by_stage) == {"file->memory", "memory->remote", "file->remote (mapped)"}, rows
    assert all(r["wire_gbit"] == RATE_GBIT for r in rows), rows
    assert 0 < by_stage["memory->remote"]["gbps"] <= CEILING_GBPS, rows
    staged = by_stage["file->remote (mapped)"]
    assert 0 < staged["gbps"] <= CEILING_GBPS and staged["x_slower_stage"] > 0, rows
    # the staged pipeline's CPU-bound limit is no bound on the mapped path (no staging copy): not given
    assert all(r["cpu_s_per_GiB"] > 0 for r in rows) and "cpu_bound_limit" not in staged, rows
    assert _namespaces() <= before
    assert not list(tmp_path.iterdir())  # the benchmark's file is removed too


def test_wire_mode_refuses_a_bad_rate() -> None:
    with pytest.raises(ValueError):
        staging.run_wire(1 << 20, rounds=1, rate="fast")
