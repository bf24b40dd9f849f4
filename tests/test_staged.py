"""Synthesized paths across processes: a file here <-> memory in another process, through pooled
host staging buffers and TCP, with checksums; one batch handle, cancellation, no leaked buffers."""

from __future__ import annotations

import time

import numpy as np
import pytest
from peers import Peer, sha

from tent_core import READ, READ_ONLY, WRITE, CancelledError, Engine, NoPathError, Request, _native
from tent_core.batch import BatchHandle
from tent_core.config import EngineConfig
from tent_core.path_planner import chunk_plan
from tent_core.routing import StagedPath
from tent_core.staged import StagingPool, run_staged
from tent_core.testing import pattern
from tent_core.types import MemoryKind, OpCode

MiB = 1 << 20


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=48 << 20)
    yield p
    p.close()


@pytest.fixture
def engine():
    eng = Engine({"staging_chunk_bytes": 1 << 20, "staging_buffers": 4}, transports=["gds", "tcp"])
    if "gds" not in eng.transports:
        pytest.fail(f"gds transport unavailable: {eng.availability}")
    yield eng
    eng.close()


def test_file_to_remote_memory_and_back(engine, peer, tmp_path):
    n = 40_000_003  # not a multiple of the chunk: the tail chunk is short
    data = pattern(n, seed=5)
    path = tmp_path / "weights.bin"
    data.tofile(path)
    f = engine.register_file(path, segment="ckpt")
    h = engine.submit([Request(WRITE, f, 0, peer.seg("rw"), 1000, n)])
    assert h.wait(60)
    assert peer.digest("rw", 1000, n) == sha(data)
    # and remote memory -> the file (a different region), one batch with a direct request too
    out = engine.register_file(tmp_path / "out.bin", segment="ckpt", size=n)
    direct = engine.allocate(1 << 20)
    h = engine.submit([Request(READ, out, 0, peer.seg("ro"), 7, n), Request(READ, direct, 0, peer.seg("ro"), 0, 1 << 20)])
    assert h.wait(60) and h.poll() == "done"
    src = pattern(peer.size, seed=1)
    assert sha(np.fromfile(tmp_path / "out.bin", np.uint8)) == sha(src[7 : 7 + n])
    assert np.array_equal(direct.array, src[: 1 << 20])
    # staging is pooled and bounded: never more buffers than configured
    assert engine._submitter.staging is not None and engine._submitter.staging._made <= 4
    peer.call(cmd="fill", segment="rw", seed=0)


def test_staged_transfer_cancel_and_permissions(engine, peer, tmp_path):
    path = tmp_path / "big.bin"
    pattern(40 << 20, seed=3).tofile(path)
    f = engine.register_file(path, segment="ckpt")
    h = engine.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, 40 << 20)])
    h.cancel()
    with pytest.raises(CancelledError):
        h.wait(30)
    ro = engine.register_file(path, segment="ro-files", perm=READ_ONLY)
    from tent_core import PermissionDeniedError

    with pytest.raises(PermissionDeniedError):  # READ into a read-only file: refused at submit
        engine.submit([Request(READ, ro, 0, peer.seg("rw"), 0, 4096)])
    peer.call(cmd="fill", segment="rw", seed=0)


def test_no_path_at_all_is_a_clear_error(peer, tmp_path):
    with Engine(transports=["tcp"]) as eng:  # no file transport installed in this engine
        path = tmp_path / "x.bin"
        path.write_bytes(b"x" * 4096)
        f = eng.register_file(path)
        with pytest.raises(NoPathError, match="file"):
            eng.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, 4096)])


@pytest.mark.parametrize(
    ("length", "chunk", "count"),
    [
        (4096, 4 * MiB, 1),  # small: one chunk (of 4096 bytes)
        (4 * MiB, 4 * MiB, 1),
        (10 * MiB, 4 * MiB, 3),  # below 4 chunks of the smallest chunk: the smallest chunk wins
        (40 * MiB, 10 * MiB, 4),
        (64 * MiB, 16 * MiB, 4),  # the path-buffered benchmark's block: 4 chunks, not 16 of 4 MiB
        (64 * MiB + 1, 16 * MiB, 5),  # capped at the buffer: the tail chunk is 1 byte
        (48 * MiB + 1, 13 * MiB, 4),  # rounded up to whole MiB: the tail chunk is short
        (1 << 30, 16 * MiB, 64),  # large: capped at the buffer, fewer submits per GiB
    ],
)
def test_initiator_staging_sizes_chunks_per_request(length, chunk, count):
    """The defaults cut a request into about 4 chunks, 4 MiB at least, a pooled buffer (16 MiB) at most."""
    cfg = EngineConfig()
    pool = StagingPool(None, cfg.staging_chunk_bytes, cfg.staging_buffers,  # type: ignore[arg-type]
                       cfg.staging_min_chunk_bytes, cfg.staging_chunks)  # fmt: skip
    assert pool.chunk_for(length) == chunk
    assert len(chunk_plan(length, pool.chunk_for(length))) == count
    assert cfg.staging_buffers * cfg.staging_chunk_bytes == 128 * MiB  # the documented bound on staging memory
    # an explicit chunk size with no smallest chunk keeps every chunk a whole buffer, as before
    assert StagingPool(None, MiB, 4).chunk_for(length) == MiB  # type: ignore[arg-type]


class _Counting:
    """The engine's own leg submitter, counting the first-stage legs (file -> staging) per request."""

    def __init__(self, inner):
        self.inner = inner
        self.reads: list[int] = []

    def submit_leg(self, request, decision, deadline):
        if request.op == OpCode.READ:
            self.reads.append(request.length)
        return self.inner.submit_leg(request, decision, deadline)

    def segment_name(self, segment):
        return self.inner.segment_name(segment)

    def allocate(self, size, segment, perm):
        return self.inner.allocate(size, segment, perm)


@pytest.mark.parametrize(("n", "chunks"), [(3 * MiB + 5, 4), (45 * MiB + 3, 8)])
def test_staged_file_to_tcp_moves_per_request_chunks(peer, tmp_path, n, chunks):
    """file -> pooled staging -> tcp with chunks sized per request (at most 8 MiB, at least 1 MiB,
    about 8 per request): a small request keeps 1 MiB chunks, a large one moves in 6 MiB chunks, both
    land byte for byte (a non-repeating pattern), and no more buffers are made than the pool allows."""
    data = pattern(n, seed=11 + chunks)
    data.tofile(tmp_path / "w.bin")
    with Engine({"staging_chunk_bytes": 8 * MiB, "staging_min_chunk_bytes": MiB, "staging_chunks": 8,
                 "staging_buffers": 3}, transports=["gds", "tcp"]) as eng:  # fmt: skip
        f = eng.register_file(tmp_path / "w.bin", segment="ckpt")
        sub = _Counting(eng._submitter)
        pool = StagingPool(sub, 8 * MiB, 3, MiB, 8)
        path = StagedPath("gds", "tcp", OpCode.WRITE, local_kind=MemoryKind.FILE, remote_kind=MemoryKind.HOST)
        handle = BatchHandle(eng, _native.Batch(1), time.monotonic() + 60, 1)
        run_staged(sub, handle, Request(WRITE, f, 0, peer.seg("rw"), 17, n), path, pool)
        assert handle.wait(60) and handle.poll() == "done"
        assert peer.digest("rw", 17, n) == sha(data)
        want = pool.chunk_for(n)
        assert sub.reads == [c for _, c in chunk_plan(n, want)] and len(sub.reads) == chunks
        assert pool._made <= 3
        # the engine's own pool cuts the same way when the request goes through submit()
        back = eng.register_file(tmp_path / "back.bin", segment="ckpt", size=n)
        h = eng.submit([Request(READ, back, 0, peer.seg("rw"), 17, n)])
        assert h.wait(60) and h.poll() == "done"
        assert sha(np.fromfile(tmp_path / "back.bin", np.uint8)) == sha(data)
        assert eng._submitter.staging.chunk_for(n) == want and eng._submitter.staging._made <= 3
    peer.call(cmd="fill", segment="rw", seed=0)


def _traced_staged_write(peer, tmp_path, n: int, seed: int, config: dict) -> tuple[list[tuple[str, int, int]], list]:
    """A staged file -> tcp WRITE of n pattern bytes under `config` (2 MiB chunks, 1 MiB at least,
    mapped paths off), its bytes checked at the target; the pipeline's TRACE events and chunk plan."""
    from tent_core import staged

    data = pattern(n, seed=seed)
    data.tofile(tmp_path / "t.bin")
    events: list[tuple[str, int, int]] = []
    cfg = {"staging_chunk_bytes": 2 * MiB, "staging_min_chunk_bytes": MiB, "mapped_paths": False, **config}
    with Engine(cfg, transports=["gds", "tcp"]) as eng:
        f = eng.register_file(tmp_path / "t.bin", segment="ckpt")
        staged.TRACE = lambda ev, i, ln: events.append((ev, i, ln))
        try:
            assert eng.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, n)]).wait(60)
        finally:
            staged.TRACE = None
        assert peer.digest("rw", 0, n) == sha(data)
        return events, chunk_plan(n, eng._submitter.staging.chunk_for(n))


def test_staged_trace_hook_shows_the_legs_of_every_chunk_overlapping(peer, tmp_path):
    """`tent_core.staged.TRACE` (the hook tent_bench.path_trace measures the pipeline with) sees each
    chunk's legs in order, and chunk 1's first stage starts before chunk 0's second stage ends: the
    file leg of the next chunk runs beside the tcp leg of this one, not after it."""
    n = 6 * MiB + 7
    events, chunks = _traced_staged_write(peer, tmp_path, n, 23, {"staging_chunks": 4, "staging_buffers": 3})
    assert len(chunks) >= 3 and events[0] == ("begin", -1, n) and events[-1] == ("end", -1, n)
    names = ["stage1_submit", "stage1_done", "stage2_submit", "stage2_done"]
    for i, (_, ln) in enumerate(chunks):
        seen = [k for k, e in enumerate(events) if e[1] == i]
        assert [events[k] for k in seen] == [(name, i, ln) for name in names]
    at = {(e[0], e[1]): k for k, e in enumerate(events)}
    assert at[("stage1_submit", 1)] < at[("stage2_done", 0)]
    peer.call(cmd="fill", segment="rw", seed=0)


@pytest.mark.parametrize("depth", [1, 2])
def test_staged_first_stage_depth_bounds_the_reads_in_flight(peer, tmp_path, depth):
    """`staging_first_depth` first-stage legs at most are in flight for one request (chunks in flight
    in one stage share it, so more of them only delay the first one's end), the next chunk's first
    stage is submitted before this chunk's second stage (the first stage never waits for a tcp
    submit), and the bytes land whole."""
    n = 9 * MiB + 11
    # a buffer for every chunk: with fewer, the next read may wait for a send to free one, and the
    # order checked below is then the buffers' (the depth bound holds either way)
    events, chunks = _traced_staged_write(peer, tmp_path, n, 31 + depth,
                                          {"staging_chunks": 8, "staging_buffers": 16, "staging_first_depth": depth})  # fmt: skip
    assert len(chunks) >= 5
    in_flight = most = 0
    for ev, _, _ in events:
        in_flight += {"stage1_submit": 1, "stage1_done": -1}.get(ev, 0)
        most = max(most, in_flight)
    assert most == depth
    at = {(e[0], e[1]): k for k, e in enumerate(events)}
    for i in range(len(chunks) - depth):
        assert at[("stage1_submit", i + depth)] < at[("stage2_submit", i)]
    peer.call(cmd="fill", segment="rw", seed=0)


def test_staged_first_stage_depth_must_be_positive():
    with pytest.raises(ValueError, match="staging_first_depth"):
        EngineConfig(staging_first_depth=0)
    with pytest.raises(ValueError, match="first_depth"):
        StagingPool(None, MiB, 2, MiB, 4, first_depth=0)  # type: ignore[arg-type]
