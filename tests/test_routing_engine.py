"""Routing through a real engine, real transports and a real peer process: every choice after the
first (retry, substitution, staged legs) follows the Decision of the request it serves. Faults are
injected by the fault executor wrapping the real transports; the bytes still move for real.

Each test here is a regression test for a bug of the engine before routing had one home."""

from __future__ import annotations

import time

import numpy as np
import pytest
from peers import Peer, sha

from tent_core import READ, WRITE, Engine, PeerUnreachableError, Request, _native
from tent_core.batch import BatchHandle
from tent_core.routing import StagedPath
from tent_core.staged import StagingPool, run_staged
from tent_core.testing import TENT_E_IO, FaultPlugin
from tent_core.types import MemoryKind, OpCode

RAILS2 = {"rails": ["127.0.0.1", "127.0.0.2"]}


def pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def peer_pattern(n: int, seed: int) -> np.ndarray:
    """What tests/peer_process.py fills its segments with (rw: seed 0, ro: seed 1)."""
    from tent_core.testing import pattern as bench_pattern

    return bench_pattern(n, seed=seed)


def bytes_by(eng: Engine, key: str = "transport") -> dict:
    out: dict = {}
    for r in eng.rail_stats():
        out[r[key]] = out.get(r[key], 0) + r["bytes"]
    return out


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=64 << 20, config={"transports": {"tcp": RAILS2}})
    yield p
    p.close()


def test_substitution_keeps_the_failed_slices_memory_kinds(tmp_path):
    """A host<->host slice whose transport fails is substituted by a host<->host transport, even
    when the peer also serves another kind pair (here host<->file through gds): the engine used to
    pick the replacement from whichever kind pair it had cached first."""
    fp = FaultPlugin("shm")
    with Engine() as target, Engine(plugins=[fp], transports=["faulty_shm", "tcp", "gds"]) as eng:
        assert {"gds", "tcp", "faulty_shm"} <= set(eng.transports), eng.availability
        n = 4 << 20
        mem = target.allocate(n, segment="mem")
        mem.array[:] = pattern(n, 3)
        target.register_file(tmp_path / "f.bin", segment="files", size=n)
        local = eng.allocate(n)
        local.array[:] = pattern(n, 4)
        eng.write(local, target.segment_name("files"), 1 << 20, timeout=20)  # the peer now has a (host, file) route
        assert bytes_by(eng).get("gds", 0) == 1 << 20
        fp.instances["shm"].inject(TENT_E_IO)
        local.array[:] = 0
        eng.submit([Request(READ, local, 0, target.segment_name("mem"), 0, n)], deadline=20).wait()
        assert np.array_equal(local.array, mem.array)
        used = bytes_by(eng)
        assert used["tcp"] >= n and used.get("gds", 0) == 1 << 20, used


def test_deny_transports_holds_on_failover(peer):
    """A rule denying tcp to tagged requests still denies it when their first transport fails:
    failover used to re-route without the matched rule."""
    fp = FaultPlugin("shm")
    rules = [{"name": "no-tcp-ckpt", "match": {"tag": "ckpt"}, "deny_transports": ["tcp"]}]
    with Engine({"rules": rules}, plugins=[fp], transports=["faulty_shm", "tcp"]) as eng:
        local = eng.allocate(8 << 20)
        fp.instances["shm"].inject(TENT_E_IO)
        t0 = time.monotonic()
        # its only allowed path keeps failing: it waits (retried with back-off) until its deadline
        with pytest.raises(PeerUnreachableError, match="tried faulty_shm"):
            eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 8 << 20, tag="ckpt")], deadline=2).wait()
        assert 1.9 < time.monotonic() - t0 < 4
        assert bytes_by(eng).get("tcp", 0) == 0, bytes_by(eng)
        # the same request without the tag may fail over to tcp
        eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 8 << 20)], deadline=20).wait()
        assert np.array_equal(local.array, peer_pattern(64 << 20, 1)[: 8 << 20])
        assert bytes_by(eng)["tcp"] >= 8 << 20


def test_staged_legs_carry_the_requests_tag(peer, tmp_path):
    """Tag rules apply to the legs of a synthesized path: they used to be submitted without the tag."""
    rules = [{"name": "no-shm-ckpt", "match": {"tag": "ckpt"}, "deny_transports": ["shm"]}]
    with Engine({"rules": rules, "staging_chunk_bytes": 1 << 20}, transports=["gds", "shm", "tcp"]) as eng:
        n = 5_000_011
        data = pattern(n, 8)
        data.tofile(tmp_path / "w.bin")
        f = eng.register_file(tmp_path / "w.bin", segment="ckpt")
        eng.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, n, tag="ckpt")], deadline=30).wait()
        assert peer.digest("rw", 0, n) == sha(data)
        used = bytes_by(eng)
        assert used.get("shm", 0) == 0 and used["tcp"] >= n, used
        peer.call(cmd="fill", segment="rw", seed=0)


def test_staged_plan_follows_the_requests_rule(peer, tmp_path):
    """A rule matching the original request (a file here) decides the stages: staged requests
    used to bypass the rules entirely."""
    n = 3_000_017
    data = pattern(n, 9)
    data.tofile(tmp_path / "s.bin")
    rules = [{"name": "files-over-tcp", "match": {"local_kind": "file"}, "transports": ["gds", "tcp"]}]
    with Engine({"rules": rules, "staging_chunk_bytes": 1 << 20}, transports=["gds", "shm", "tcp"]) as eng:
        f = eng.register_file(tmp_path / "s.bin", segment="ckpt")
        eng.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, n)], deadline=30).wait()
        assert peer.digest("rw", 0, n) == sha(data)
        used = bytes_by(eng)
        assert used.get("shm", 0) == 0 and used["tcp"] >= n, used
    peer.call(cmd="fill", segment="rw", seed=0)


def test_staged_legs_follow_the_planned_transports(peer, tmp_path):
    """The transports a StagedPath names are the ones its legs use, whatever a fresh resolution
    would pick (shm here): legs used to be resolved again from scratch, ignoring the plan."""
    n = 3_000_017
    data = pattern(n, 10)
    data.tofile(tmp_path / "s.bin")
    with Engine({"staging_chunk_bytes": 1 << 20}, transports=["gds", "shm", "tcp"]) as eng:
        f = eng.register_file(tmp_path / "s.bin", segment="ckpt")
        path = StagedPath("gds", "tcp", OpCode.WRITE, local_kind=MemoryKind.FILE, remote_kind=MemoryKind.HOST)
        submitter = eng._submitter
        handle = BatchHandle(eng, _native.Batch(1), time.monotonic() + 30, 1)
        run_staged(submitter, handle, Request(WRITE, f, 0, peer.seg("rw"), 0, n), path, StagingPool(submitter, 1 << 20, 2))
        assert handle.wait(30)
        assert peer.digest("rw", 0, n) == sha(data)
        used = bytes_by(eng)
        assert used.get("shm", 0) == 0 and used["tcp"] >= n, used
    peer.call(cmd="fill", segment="rw", seed=0)


def test_a_slice_out_of_paths_leaves_other_batches_routes_alone(peer):
    """One request running out of retries used to forget the peer and disconnect its routes,
    failing every other batch in flight to that peer. Now the request out of paths waits for its
    path to return (retried with back-off until its deadline) and the others go on meanwhile."""
    fp = FaultPlugin("tcp")
    rules = [{"name": "pin", "match": {"tag": "pinned"}, "rails": [0]}]
    cfg = {"rules": rules, "transports": {"faulty_tcp": RAILS2}}
    with Engine(cfg, plugins=[fp], transports=["faulty_tcp"]) as eng:
        n = 64 << 20
        local = eng.allocate(n)
        other = eng.allocate(1 << 20)
        eng.read(local, peer.seg("ro"), 1 << 20)  # connect both rails
        big = eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, n) for _ in range(8)], deadline=60)
        fp.instances["tcp"].inject(TENT_E_IO, rails=[0])
        # pinned to the broken rail: out of paths, it waits
        pinned = eng.submit([Request(READ, other, 0, peer.seg("ro"), 0, 1 << 20, tag="pinned")], deadline=60)
        big.wait()  # still served, over rail 1
        assert np.array_equal(local.array, peer_pattern(64 << 20, 1))
        assert pinned.poll() == "pending" and eng._recovery.parked() > 0
        # the rail heals: the waiting request completes, and the peer keeps working for new ones
        fp.instances["tcp"].heal()
        pinned.wait()
        assert np.array_equal(other.array, peer_pattern(1 << 20, 1))
        eng.read(other, peer.seg("ro"), 1 << 20, timeout=20)
