"""Capability matching and path synthesis as pure functions: every pair of memory kinds."""

from __future__ import annotations

import itertools

import pytest

from tent_core.path_planner import chunk_plan, pipeline_chunk, plan_staged_path, ramped_chunk_plan
from tent_core.routing import explain_no_path, rank_transports
from tent_core.types import CapabilityProfile, MemoryKind, OpCode

H, C, F = MemoryKind.HOST, MemoryKind.CUDA, MemoryKind.FILE

PROFILES = {
    "shm": CapabilityProfile(frozenset({(H, H)}), same_host=True, cross_host=False, rank=10),
    "tcp": CapabilityProfile(frozenset({(H, H)}), same_host=True, cross_host=True, rank=50),
    "gds": CapabilityProfile(frozenset({(H, F)}), same_host=True, cross_host=False, rank=20),
    "nvlink": CapabilityProfile(frozenset({(C, C), (H, C), (C, H)}), same_host=True, cross_host=False, rank=5),
}
ALL = list(PROFILES)


def test_direct_ranking_prefers_same_host_transports():
    assert rank_transports(PROFILES, H, H, True, ALL) == ["shm", "tcp"]
    assert rank_transports(PROFILES, H, H, False, ALL) == ["tcp"]
    assert rank_transports(PROFILES, H, H, True, ["tcp"]) == ["tcp"]  # peer offers only tcp
    assert rank_transports(PROFILES, C, C, True, ALL) == ["nvlink"]
    assert rank_transports(PROFILES, H, F, True, ALL) == ["gds"]
    assert rank_transports(PROFILES, H, H, True, ALL, allowed=["tcp"]) == ["tcp"]


@pytest.mark.parametrize("local,remote,same_host", list(itertools.product([H, C, F], [H, C, F], [True, False])))
def test_every_pair_has_a_direct_path_a_staged_path_or_a_clear_error(local, remote, same_host):
    direct = rank_transports(PROFILES, local, remote, same_host, ALL)
    staged = plan_staged_path(PROFILES, local, remote, same_host, ALL, OpCode.WRITE)
    if direct:
        return
    if staged is not None:
        # the local stage is same-host local<->host staging, the remote stage host staging<->remote
        assert PROFILES[staged.local_stage].serves(H, local, True)
        assert PROFILES[staged.remote_stage].serves(H, remote, same_host)
        return
    msg = explain_no_path(PROFILES, local, remote, same_host, ALL)
    assert local.value in msg and remote.value in msg and ("same host" in msg or "across hosts" in msg)


def test_expected_syntheses():
    # file on this host -> memory on another host: gds to staging, then tcp
    p = plan_staged_path(PROFILES, F, H, False, ALL, OpCode.WRITE)
    assert p is not None and (p.local_stage, p.remote_stage) == ("gds", "tcp")
    assert "staging" in p.describe()
    # GPU memory here -> host memory on another host, no GPUDirect transport: nvlink bounce, then tcp
    p = plan_staged_path(PROFILES, C, H, False, ALL, OpCode.READ)
    assert p is not None and (p.local_stage, p.remote_stage) == ("nvlink", "tcp")
    # remote file on another host: only the initiator side is staged -> no path
    assert plan_staged_path(PROFILES, H, F, False, ALL, OpCode.READ) is None
    # no gds installed: file -> remote memory has no path at all
    no_gds = {k: v for k, v in PROFILES.items() if k != "gds"}
    assert plan_staged_path(no_gds, F, H, False, list(no_gds), OpCode.WRITE) is None
    assert "no transport" in explain_no_path(no_gds, F, H, False, list(no_gds))
    # nothing installed
    assert "no transport is installed" in explain_no_path({}, H, H, True, [])


def test_chunk_plan_covers_exactly():
    for length in (0, 1, 4 << 20, (4 << 20) + 1, 10_000_019):
        chunks = chunk_plan(length, 4 << 20)
        assert sum(c[1] for c in chunks) == length
        assert all(b[0] == a[0] + a[1] for a, b in itertools.pairwise(chunks))
    with pytest.raises(ValueError):
        chunk_plan(10, 0)


def test_ramped_chunk_plan_halves_the_first_and_last_chunk_and_covers_exactly():
    m = 1 << 20
    assert [ln // m for _, ln in ramped_chunk_plan(512 * m, 64 * m)] == [32, 64, 64, 64, 64, 64, 64, 64, 32]
    for length in (0, 1, 64 * m, 128 * m, 128 * m + 1, 300 * m, 513 * m + 5, 1 << 30):
        chunks = ramped_chunk_plan(length, 64 * m)
        assert sum(c[1] for c in chunks) == length
        assert all(b[0] == a[0] + a[1] for a, b in itertools.pairwise(chunks))
        assert all(0 < ln <= 64 * m for _, ln in chunks)
        if length > 128 * m:  # ramped: half a chunk at both ends
            assert chunks[0][1] == chunks[-1][1] == 32 * m
        else:  # too short to ramp: the uniform plan
            assert chunks == chunk_plan(length, 64 * m)
    assert ramped_chunk_plan(10, 1) == chunk_plan(10, 1)  # no half of a 1-byte chunk
    with pytest.raises(ValueError):
        ramped_chunk_plan(10, 0)


def test_pipeline_chunk_sizes_chunks_per_request_within_its_bounds():
    M = 1 << 20
    # about 8 chunks, rounded up to 1 MiB, between the smallest chunk (4 MiB) and the slot (16 MiB)
    assert pipeline_chunk(512 * M, 16 * M, 4 * M, 8) == 16 * M
    assert pipeline_chunk(64 * M, 16 * M, 4 * M, 8) == 8 * M
    assert pipeline_chunk(100 * M, 16 * M, 4 * M, 8) == 13 * M  # 12.5 MiB rounded up
    assert pipeline_chunk(32 * M, 16 * M, 4 * M, 8) == 4 * M
    assert pipeline_chunk(1, 16 * M, 4 * M, 8) == 4 * M
    assert pipeline_chunk(0, 16 * M, 4 * M, 8) == 4 * M
    # the slot bounds every chunk, also below the smallest chunk
    assert pipeline_chunk(512 * M, M, 4 * M, 8) == M
    # alignment of the per-request size
    assert pipeline_chunk(10 * M, 64 * M, 1, 4, align=4096) == 10 * M // 4  # 2.5 MiB: aligned already
    assert pipeline_chunk(10 * M + 4, 64 * M, 1, 4, align=4096) == 10 * M // 4 + 4096  # one byte over: next page
    for bad in ((M, 0, M, 8), (M, M, 0, 8), (M, M, M, 0)):
        with pytest.raises(ValueError):
            pipeline_chunk(*bad)
