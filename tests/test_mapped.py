"""Mapped paths: a WRITE from a registered file sent straight from a read-only mapping of it.

The planner's choice (pure, literals): which files and transports get a MappedPath and which stay
staged (O_DIRECT file transports, user-space-copy transports like shm, READs, the knob off). Then
the real thing: another process over loopback tcp, bytes checked; a file truncated before and
while it is sent; the mapping windows' lifetime."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from peers import Peer, sha

from tent_core import READ, WRITE, Engine, Request, TransferError, mapped
from tent_core.policy_rules import RequestTraits, Rule
from tent_core.routing import MappedPath, Router, StagedPath, path_kind
from tent_core.testing import pattern
from tent_core.types import CapabilityProfile, MemoryKind, OpCode, Priority

MiB = 1 << 20
H, F = MemoryKind.HOST, MemoryKind.FILE


def _profiles(file_page_cache: bool = True, tcp_kernel: bool = True, shm: bool = True) -> dict[str, CapabilityProfile]:
    out = {
        "gds": CapabilityProfile(frozenset({(H, F)}), True, False, rank=20, page_cache_files=file_page_cache),
        "tcp": CapabilityProfile(frozenset({(H, H)}), True, True, rank=50, kernel_copy_sends=tcp_kernel),
    }
    if shm:  # copies with memcpy / process_vm_writev in user space: never gets a mapped source
        out["shm"] = CapabilityProfile(frozenset({(H, H)}), True, False, rank=10)
    return out


def _plan(profiles, op=OpCode.WRITE, same_host=True, reachable=("tcp", "shm"), local=F, mapped_on=True, rule=None,
          nbytes=64 * MiB):
    router = Router(profiles, mapped=mapped_on)
    traits = RequestTraits(Priority.MID, nbytes, local, H, same_host, None)
    reach = tuple(t for t in reachable if t in profiles)
    path = router.plan(traits, reach, ("gds",), op, rule)
    cands = {c.kind: c for c in router.candidates(traits, reach, ("gds",), op, rule, nbytes=nbytes)}
    return path, cands


def test_page_cache_file_to_kernel_copy_wire_is_mapped_and_shm_never_carries_it():
    path, cands = _plan(_profiles())
    assert isinstance(path, MappedPath) and path_kind(path) == "mapped"
    # shm ranks above tcp for host<->host on one host, yet a mapped source goes to tcp only
    assert path.wire_order == ("tcp",) and path.wire_leg.transports == ("tcp",)
    assert path.file_stage == "gds" and isinstance(path.fallback, StagedPath)
    assert path.fallback.remote_stage == "shm"  # the staged fallback keeps its own choice
    assert cands["mapped"].cost_s < cands["initiator-staged"].cost_s
    assert "mmap" in path.describe() and "tcp" in path.describe()


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"profiles": {"file_page_cache": False}}, "page cache"),  # gds direct=1: O_DIRECT reads
        ({"profiles": {"tcp_kernel": False}}, "in the kernel"),  # no wire copies in the kernel
        ({"reachable": ("shm",)}, "in the kernel"),  # only shm reaches the peer
        ({"op": OpCode.READ}, "only a WRITE"),  # remote -> file: a writable shared mapping, staged
        ({"mapped_on": False}, "mapped_paths"),  # the knob
    ],
)
def test_what_stays_staged(kw, reason):
    prof = _profiles(**kw.pop("profiles", {}))
    path, cands = _plan(prof, **kw)
    assert isinstance(path, StagedPath), path
    assert not cands["mapped"].viable and reason in cands["mapped"].reason


def test_host_memory_and_cross_host_rules():
    path, cands = _plan(_profiles(), local=H)  # nothing to map: direct
    assert path_kind(path) == "direct" and "not a file" in cands["mapped"].reason
    # across hosts (no shm there) tcp still sends from the mapping
    path, _ = _plan(_profiles(shm=False), same_host=False, reachable=("tcp",))
    assert isinstance(path, MappedPath)
    # a rule that allows only shm leaves the mapped path no wire: staged through shm
    only_shm = Rule(name="shm-only", transports=("shm", "gds"))
    path, cands = _plan(_profiles(), rule=only_shm)
    assert isinstance(path, StagedPath) and path.remote_stage == "shm"
    assert cands["mapped"].reason.startswith("policy: ")


# ---- real processes -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=40 << 20)
    yield p
    p.close()


def _engine(**cfg):
    eng = Engine(cfg, transports=["gds", "tcp"])
    if "gds" not in eng.transports or "tcp" not in eng.transports:
        eng.close()
        pytest.fail(f"gds or tcp unavailable: {eng.availability}")
    return eng


def test_file_to_another_process_over_tcp_from_the_mapping(peer, tmp_path):
    """Several windows (1 MiB windows, unaligned offsets), the bytes checked at the target, the
    windows kept for the next request and unmapped when the file is unregistered."""
    seed = random.randrange(1 << 30)
    n = 5 * MiB + 12_345
    data = pattern(n + 4099, seed=seed)
    data.tofile(tmp_path / "w.bin")
    with _engine(mapped_window_bytes=MiB, mapped_cache_bytes=64 * MiB) as eng:
        f = eng.register_file(tmp_path / "w.bin", segment="ckpt")
        req = Request(WRITE, f, 4099, peer.seg("rw"), 777, n)
        ex = eng.explain(req)
        assert ex.chosen == "mapped" and "mmap" in ex.route, str(ex)
        assert "mapped" in str(ex)
        assert eng.submit([req]).wait(60)
        assert peer.digest("rw", 777, n) == sha(data[4099 : 4099 + n]), f"seed {seed}"
        st = eng._submitter.mappings.stats()
        assert st["files"] == 1 and st["windows"] == 6  # [4099, 4099 + n) touches windows 0..5
        assert eng._submitter.staging is None or eng._submitter.staging._made == 0  # no staging buffer made
        # the same windows serve the next request (no new mapping), a file rewritten in place shows
        # its new bytes through them (MAP_SHARED over the page cache)
        fresh = pattern(MiB, seed=seed + 1)
        with open(tmp_path / "w.bin", "r+b") as fh:
            fh.seek(2 * MiB)
            fh.write(fresh.tobytes())
        assert eng.submit([Request(WRITE, f, 2 * MiB, peer.seg("rw"), 0, MiB)]).wait(60)
        assert peer.digest("rw", 0, MiB) == sha(fresh)
        assert eng._submitter.mappings.stats()["windows"] == 6
        eng.unregister(f)
        assert eng._submitter.mappings.stats() == {"files": 0, "windows": 0, "mapped_bytes": 0}
        assert all(not s.startswith("_tent_mapped") for s in eng._segments.table())
    peer.call(cmd="fill", segment="rw", seed=0)


def test_idle_windows_beyond_the_cache_bound_are_unmapped(peer, tmp_path):
    data = pattern(8 * MiB, seed=random.randrange(1 << 30))
    data.tofile(tmp_path / "c.bin")
    with _engine(mapped_window_bytes=MiB, mapped_cache_bytes=2 * MiB) as eng:
        f = eng.register_file(tmp_path / "c.bin", segment="ckpt")
        assert eng.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, 8 * MiB)]).wait(60)
        assert peer.digest("rw", 0, 8 * MiB) == sha(data)
        assert eng._submitter.mappings.stats()["mapped_bytes"] <= 2 * MiB
    peer.call(cmd="fill", segment="rw", seed=0)


def test_truncated_file_fails_clearly_and_the_engine_keeps_serving(peer, tmp_path):
    n = 8 * MiB
    data = pattern(n, seed=random.randrange(1 << 30))
    data.tofile(tmp_path / "t.bin")
    with _engine() as eng:
        f = eng.register_file(tmp_path / "t.bin", segment="ckpt")
        # shorter than the request before it is sent: refused before anything is mapped
        os.truncate(tmp_path / "t.bin", n // 2)
        with pytest.raises(TransferError, match="is 4194304 bytes now"):
            eng.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, n)]).wait(60)
        assert eng._submitter.mappings.stats()["windows"] == 0
        # truncated while it is sent (after the check, before the send): the kernel's copy meets the
        # vanished pages (EFAULT), the request fails naming the truncation, the process lives
        data.tofile(tmp_path / "t.bin")
        mapped.TRACE = lambda req, pieces: os.truncate(tmp_path / "t.bin", 4096)
        try:
            with pytest.raises(TransferError, match="truncated to 4096 bytes"):
                eng.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, n)]).wait(60)
        finally:
            mapped.TRACE = None
        assert eng._submitter.mappings.stats()["windows"] == 0  # dropped with the failure
        # the engine and the peer keep serving: the file restored, the same request lands
        data.tofile(tmp_path / "t.bin")
        assert eng.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, n)]).wait(60)
        assert peer.digest("rw", 0, n) == sha(data)
        buf = eng.allocate(MiB)
        buf.array[:] = 7
        assert eng.submit([Request(WRITE, buf, 0, peer.seg("rw"), 0, MiB)]).wait(60)
    peer.call(cmd="fill", segment="rw", seed=0)


@pytest.mark.parametrize("cfg", [{"mapped_paths": False}, {"transports": {"gds": {"direct": 1}}}])
def test_knob_off_or_direct_file_stays_staged(peer, tmp_path, cfg):
    n = 3 * MiB + 1
    data = pattern(n, seed=random.randrange(1 << 30))
    data.tofile(tmp_path / "s.bin")
    with _engine(**cfg) as eng:
        f = eng.register_file(tmp_path / "s.bin", segment="ckpt")
        req = Request(WRITE, f, 0, peer.seg("rw"), 0, n)
        ex = eng.explain(req)
        assert ex.chosen == "initiator-staged", str(ex)
        assert eng.submit([req]).wait(60)
        assert peer.digest("rw", 0, n) == sha(data)
        assert eng._submitter._mappings is None and eng._submitter.staging._made > 0
    peer.call(cmd="fill", segment="rw", seed=0)


def test_shm_wire_never_gets_a_mapped_source(peer, tmp_path):
    data = pattern(2 * MiB, seed=random.randrange(1 << 30))
    data.tofile(tmp_path / "m.bin")
    with Engine(transports=["gds", "shm"]) as eng:
        if "shm" not in eng.transports:
            pytest.fail(f"shm unavailable: {eng.availability}")
        f = eng.register_file(tmp_path / "m.bin", segment="ckpt")
        req = Request(WRITE, f, 0, peer.seg("rw"), 0, 2 * MiB)
        ex = eng.explain(req)
        assert ex.chosen == "initiator-staged", str(ex)
        mapped_row = next(c for c in ex.candidates if c["kind"] == "mapped")
        assert not mapped_row["viable"] and "in the kernel" in mapped_row["reason"]
        assert eng.submit([req]).wait(60)
        assert peer.digest("rw", 0, 2 * MiB) == sha(data)
        # and a READ into the file stays staged over tcp-less engines too
        out = eng.register_file(tmp_path / "o.bin", segment="ckpt", size=2 * MiB)
        assert eng.explain(Request(READ, out, 0, peer.seg("rw"), 0, 2 * MiB)).chosen == "initiator-staged"
    peer.call(cmd="fill", segment="rw", seed=0)


def test_mapping_never_outlives_the_engine(peer, tmp_path):
    data = pattern(MiB, seed=3)
    data.tofile(tmp_path / "e.bin")
    eng = _engine()
    f = eng.register_file(tmp_path / "e.bin", segment="ckpt")
    assert eng.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, MiB)]).wait(60)
    maps = eng._submitter.mappings
    assert maps.stats()["windows"] == 1
    eng.close()
    assert maps.stats() == {"files": 0, "windows": 0, "mapped_bytes": 0}
    assert np.array_equal(np.fromfile(tmp_path / "e.bin", np.uint8), data)
    peer.call(cmd="fill", segment="rw", seed=0)


def test_a_file_that_cannot_be_mapped_takes_the_staged_path(peer, tmp_path):
    """The mapped path opens the file by its path on first use; gds opened it when it connected.
    Unlinked in between, the file cannot be mapped: the request falls back to the staged path,
    which reads through gds's open fd, and lands byte for byte."""
    n = 3 * MiB + 5
    data = pattern(n, seed=random.randrange(1 << 30))
    data.tofile(tmp_path / "u.bin")
    with _engine() as eng:
        f = eng.register_file(tmp_path / "u.bin", segment="ckpt")
        local = eng.allocate(n)
        assert eng.submit([Request(READ, local, 0, eng.segment_name("ckpt"), 0, n)]).wait(60)  # gds opens it
        os.unlink(tmp_path / "u.bin")
        assert eng.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, n)]).wait(60)
        assert peer.digest("rw", 0, n) == sha(data)
        assert eng._submitter.staging._made > 0 and eng._submitter.mappings.stats()["windows"] == 0
    peer.call(cmd="fill", segment="rw", seed=0)
