"""Data-plane pieces in one process (embedded server, one engine): windowed verified pulls, copy-mode
staging, checksum failures, and the stager's message validation."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import msgpack
import numpy as np
import pytest
import zmq

pytest.importorskip("tent_core.engine")

from refhub import client as C  # noqa: E402
from refhub import protocol  # noqa: E402

MB = 1 << 20


@pytest.fixture
def server():
    from refhub.server import start_embedded, stop_embedded

    addr = start_embedded(hb_timeout=3.0)
    yield addr
    stop_embedded(addr)


def _tensors(sizes, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 255, n, dtype=np.uint8) for n in sizes]


def _registered_pair(server, sizes, seed):
    """A publisher of v1 and a reader with zeroed destinations, both over register()ed arrays."""
    src = _tensors(sizes, seed)
    p = C.open("m", replica="pub", server=server)
    for i, t in enumerate(src):
        p.register(f"t{i}", t)
    p.publish(1)
    r = C.open("m", replica="rd", server=server)
    dst = [np.zeros(n, np.uint8) for n in sizes]
    for i, t in enumerate(dst):
        r.register(f"t{i}", t)
    return p, r, src, dst


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(C, "BATCH", 1 * MB)
    monkeypatch.setattr(C, "CHUNK", 512 * 1024)
    monkeypatch.setattr(C, "STAGE_SLOT", 1 * MB)


@pytest.mark.parametrize("pub_mode,rd_mode", [("direct", "direct"), ("copy", "direct"), ("direct", "copy"), ("copy", "copy")])
def test_windowed_pull_verifies_every_tensor(server, small_batches, pub_mode, rd_mode) -> None:
    sizes = [3 * MB + 5, 2 * MB, 7000, 123, 2 * MB + 4096, 65536, 5 * MB - 3]
    src = _tensors(sizes, 1)
    p = C.open("m", replica="pub", server=server, mode=pub_mode)
    for i, t in enumerate(src):
        p.register(f"t{i}", t)
    p.publish(1)
    r = C.open("m", replica="rd", server=server, mode=rd_mode)
    dst = [np.zeros(n, np.uint8) for n in sizes]
    for i, t in enumerate(dst):
        r.register(f"t{i}", t)
    assert r.replicate(1, timeout=30) == 1
    assert all((a == b).all() for a, b in zip(src, dst, strict=True))
    st = r.stats
    assert st["verified"] and st["bytes"] >= sum(sizes)  # the pack pads tiny tensors to 64 bytes
    if "copy" in (pub_mode, rd_mode):
        assert st["staged_slices"] >= 10 or rd_mode == "copy"
    else:
        assert st["batches"] >= 10  # many batches, verified as each prefix completed
    r.close()
    p.close()


def test_mutated_source_fails_checksum(server, small_batches) -> None:
    sizes = [3 * MB, 4 * MB, 1000]
    src = _tensors(sizes, 2)
    p = C.open("m", replica="pub", server=server)
    for i, t in enumerate(src):
        p.register(f"t{i}", t)
    p.publish(1)
    src[1][12345] ^= 0xFF  # breaks the mutability contract after publish
    r = C.open("m", replica="rd", server=server)
    for i, n in enumerate(sizes):
        r.register(f"t{i}", np.zeros(n, np.uint8))
    with pytest.raises(C.ChecksumError, match="t1"):
        r.replicate(1, timeout=30)
    assert r.state == "idle"
    r.close()
    p.close()


def test_unpublished_replica_stops_vouching_for_its_bytes(server, small_batches) -> None:
    # a replica that unpublished may be overwritten (the burst bench junk-fills it between rounds);
    # a pipeline reader routed to it on its next replicate read its stale "v1 complete" word and
    # pulled junk (CI: end-to-end checksum mismatch). The word must say "nothing" until it re-receives.
    sizes = [2 * MB, 3000]
    src = _tensors(sizes, 3)
    p = C.open("m", replica="pub", server=server)
    for i, t in enumerate(src):
        p.register(f"t{i}", t)
    p.publish(1)
    a = C.open("m", replica="a", server=server)
    dst = [np.zeros(n, np.uint8) for n in sizes]
    for i, t in enumerate(dst):
        a.register(f"t{i}", t)
    assert a.replicate(1, timeout=30) == 1
    total = a.progress[2]
    assert a.progress == (1, total, total)
    a.unpublish()
    assert a.progress[:2] == (0, 0)
    for t in dst:
        t[:] = 0xEE
    assert a.replicate(1, timeout=30) == 1 and a.progress == (1, total, total)
    assert all((x == y).all() for x, y in zip(src, dst, strict=True))
    a.close()
    p.close()


def test_stager_validates_and_refuses(server) -> None:
    p = C.open("m", replica="pub", server=server, mode="copy")
    t = _tensors([3 * MB], 3)[0]
    p.register("w", t)
    p.publish(4)
    addr = p._ref()["stager"]
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)

    def ask(msg):
        s.send(msgpack.packb(msg) if not isinstance(msg, bytes) else msg)
        assert s.poll(3000)
        return msgpack.unpackb(s.recv(), strict_map_key=False)

    assert ask(b"\xc1garbage")["err"] == "bad_message"
    assert ask({"op": "stage", "rid": 1, "v": 4, "item": "w", "off": -1, "len": 5})["err"] == "bad_message"
    assert ask({"op": "stage", "rid": 2, "v": 3, "item": "w", "off": 0, "len": 5})["err"] == "bad_state"
    assert ask({"op": "stage", "rid": 3, "v": 4, "item": "nope", "off": 0, "len": 5})["err"] == "bad_range"
    assert ask({"op": "stage", "rid": 4, "v": 4, "item": "w", "off": 3 * MB - 2, "len": 5})["err"] == "bad_range"
    rep = ask({"op": "stage", "rid": 5, "v": 4, "item": "w", "off": 100, "len": 4096})
    assert rep["ok"] and rep["rid"] == 5
    slot = p._stager.slots[rep["slot"]]
    assert (slot.array[:4096] == t[100:4196]).all()
    s.send(msgpack.packb({"op": "release", "rid": 0, "slot": rep["slot"]}))
    p.unpublish()
    assert ask({"op": "stage", "rid": 6, "v": 4, "item": "w", "off": 0, "len": 5})["err"] == "bad_state"
    s.close()
    p.close()


def test_validate_stage_schema() -> None:
    assert protocol.validate_stage({"op": "stage", "rid": 1, "v": 1, "item": "a", "off": 0, "len": 1}) == "stage"
    assert protocol.validate_stage({"op": "release", "slot": 2}) == "release"
    for bad in ({"op": "stage", "v": 1, "item": "a", "off": 0}, {"op": "publish", "h": 1, "version": 1},
                {"op": "release", "slot": "x"}, [1], {"op": "stage", "rid": True, "v": 1, "item": "a", "off": 0, "len": 1}):
        with pytest.raises(protocol.ProtocolError):
            protocol.validate_stage(bad)


def test_checksum_is_xxh3_when_available() -> None:
    a = np.arange(1 << 16, dtype=np.float32)
    if C._xxhash is not None:
        assert C.checksum(a) == C._xxhash.xxh3_64_intdigest(a.view(np.uint8))
    assert C.checksum(a) == C.checksum(a.copy())


def _streamed_verifier(server, monkeypatch, threaded):
    """A receiving handle whose tensors already hold the publisher's bytes, and a verifier for them."""
    monkeypatch.setattr(C, "VERIFY_THREAD", threaded)
    sizes = [3 * MB + 5, 2 * MB, 7000, 123, 5 * MB - 3]
    src = _tensors(sizes, 7)
    r = C.open("m", replica="rd", server=server)
    dst = [t.copy() for t in src]
    for i, t in enumerate(dst):
        r.register(f"t{i}", t)
    r._build_layout()
    mine = r._stream()
    cks = [C.checksum(t) for _, t in sorted((f"t{i}", t) for i, t in enumerate(src))]  # the publisher's
    for it in r.items.values():  # the pack holds the tiny tensors, as a pull would have left it
        if it.pack_off >= 0:
            r._pack.array[it.pack_off:it.pack_off + it.nbytes] = it.arr
    return r, mine, cks, dst, sum(m[3] for m in mine)


def _advance_in_steps(ver, total, seed):
    rng = np.random.default_rng(seed)
    done = 0
    while done < total:  # odd step sizes: ranges straddle tensor and hash-piece boundaries
        done = min(total, done + int(rng.integers(1, 3 * MB)))
        ver.advance(done)
    ver.finish()


@pytest.mark.parametrize("threaded", [True, False])
def test_streamed_verify_accepts_the_published_bytes(server, monkeypatch, threaded) -> None:
    if C._xxhash is None:
        pytest.skip("streamed verification needs xxhash")
    r, mine, cks, _, total = _streamed_verifier(server, monkeypatch, threaded)
    for seed in range(3):
        ver = C._Verifier(r, mine, cks, 1)
        assert ver.streamed == {"t0", "t1", "t4"}  # the large tensors stream
        _advance_in_steps(ver, total, seed)
        assert not ver.streams  # every streamed tensor was compared
    r.close()


@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.parametrize("where", ["first", "piece_edge", "last"])
def test_streamed_verify_rejects_one_wrong_landed_byte(server, monkeypatch, threaded, where) -> None:
    """The receiver hashes the bytes in its own destination buffer: one byte that did not land right
    (first byte, across a hash-piece edge, last byte of a tensor) fails the replicate, naming it."""
    if C._xxhash is None:
        pytest.skip("streamed verification needs xxhash")
    r, mine, cks, dst, total = _streamed_verifier(server, monkeypatch, threaded)
    t = dst[4]
    pos = {"first": 0, "piece_edge": C.HASH_PIECE, "last": t.size - 1}[where]
    t[pos] ^= 0x01
    ver = C._Verifier(r, mine, cks, 1)
    with pytest.raises(C.ChecksumError, match="t4"):
        _advance_in_steps(ver, total, 11)
    ver.close()
    r.close()


def test_streamed_verify_in_a_real_pull_rejects_a_mutated_source(server, small_batches, monkeypatch) -> None:
    """End to end: a source whose bytes changed after publish (a byte deep inside a tensor that
    spans many batches) fails the streamed check of the receiver, and the bytes that passed it are
    the ones in the receiver's tensors."""
    sizes = [6 * MB + 7, 3 * MB, 1000]
    p, r, src, dst = _registered_pair(server, sizes, 5)
    assert r.replicate(1, timeout=30) == 1 and r.stats["verified"]
    assert all((a == b).all() for a, b in zip(src, dst, strict=True))
    r.unpublish()
    src[0][5 * MB + 3] ^= 0x80
    with pytest.raises(C.ChecksumError, match="t0"):
        r.replicate(1, timeout=30)
    r.close()
    p.close()


@pytest.fixture
def fused_lanes(monkeypatch):
    """Two lanes on any machine, and small shards may take the fused pull (the production guard keeps
    a tensor larger than 1/(4 x lanes) of the shard on the windowed pull; tested on its own below)."""
    monkeypatch.setattr(C, "VERIFY_THREADS", 2)
    monkeypatch.setattr(C, "FUSED_MAX_SHARE", 1)


def _engine_memory_pair(server, sizes, seed):
    """A publisher and a reader whose tensors are engine memory (the same-host transport reaches it
    and copies a piece on the submitting thread: the fused pull's path)."""
    rng = np.random.default_rng(seed)
    p = C.open("m", replica="pub", server=server)
    src = []
    for i, n in enumerate(sizes):
        src.append(p.allocate(f"t{i}", n))
        src[-1][:] = rng.integers(0, 255, n, dtype=np.uint8)
    p.publish(1)
    r = C.open("m", replica="rd", server=server)
    dst = [r.allocate(f"t{i}", n) for i, n in enumerate(sizes)]
    for t in dst:
        t[:] = 0xEE
    return p, r, src, dst


FUSED_SIZES = [6 * MB + 7, 3 * MB, 1000, 5000, 2 * MB, 9 * MB - 1]


@pytest.mark.parametrize("fused,threaded", [(True, True), (True, False), (False, True)])
def test_fused_pull_moves_and_verifies_every_byte(server, monkeypatch, fused_lanes, fused, threaded) -> None:
    if C._xxhash is None:
        pytest.skip("the fused pull streams xxh3_64")
    monkeypatch.setattr(C, "FUSED_VERIFY", fused)
    monkeypatch.setattr(C, "VERIFY_THREAD", threaded)
    p, r, src, dst = _engine_memory_pair(server, FUSED_SIZES, 3)
    assert r.replicate(1, timeout=30) == 1
    assert r.stats["verified"] and r.stats["fused"] == fused
    assert all((a == b).all() for a, b in zip(src, dst, strict=True))
    assert r.progress[1] == r.progress[2]  # the progress word covers the whole stream
    r.close()
    p.close()


@pytest.mark.parametrize("digest_piece", [0, 4 * MB, MB])  # 0: the lanes hash in Python
@pytest.mark.parametrize("where", [0, 7 * MB + 11, 9 * MB - 2])  # first, middle, last byte of t5
def test_fused_pull_rejects_a_mutated_source(server, monkeypatch, fused_lanes, digest_piece, where) -> None:
    if C._xxhash is None:
        pytest.skip("the fused pull streams xxh3_64")
    monkeypatch.setattr(C, "FUSED_VERIFY", True)
    monkeypatch.setattr(C, "DIGEST_PIECE", digest_piece)
    p, r, src, dst = _engine_memory_pair(server, FUSED_SIZES, 4)
    src[5][where] ^= 0x40  # after publish: one byte no longer matches the announced checksum
    with pytest.raises(C.ChecksumError, match="t5"):
        r.replicate(1, timeout=30)
    assert r.state == "idle" and r.progress[:2] == (0, 0)
    r.close()
    p.close()


LARGE = sum(n for n in FUSED_SIZES if n >= C.TINY)


@pytest.mark.parametrize("digest_piece", [4 * MB, MB, 64 * 1024 + 3])
def test_fused_pull_hashes_inside_the_executors_copy(server, monkeypatch, fused_lanes, digest_piece) -> None:
    """Where the route folds what it copies into the armed digest (shm, memfd), every large tensor's
    bytes but the probe piece are hashed inside the executor's copy loop, whatever the piece size."""
    if C._xxhash is None:
        pytest.skip("the fused pull streams xxh3_64")
    monkeypatch.setattr(C, "FUSED_VERIFY", True)
    monkeypatch.setattr(C, "DIGEST_PIECE", digest_piece)
    p, r, src, dst = _engine_memory_pair(server, FUSED_SIZES, 6)
    assert r.replicate(1, timeout=30) == 1
    assert r.stats["verified"] and r.stats["fused"]
    assert r.stats["digest_in_copy_bytes"] == LARGE - C.FUSED_PIECE  # the probe's piece is hashed by the lane
    assert all((a == b).all() for a, b in zip(src, dst, strict=True))
    r.close()
    p.close()


GROUP_SIZES = [2 * MB + 4096 * i + 13 * (i % 3) for i in range(16)] + [1000, 7000]


@pytest.mark.parametrize("mutate", [None, 11])  # t11: the 4th tensor of the stream (t0 t1 t10 t11 ...), the first group
def test_fused_digest_pull_reads_several_tensors_per_submit(server, monkeypatch, fused_lanes, mutate) -> None:
    """With the executor's digest, a lane READs several whole tensors in one submit (one digest armed
    per tensor): fewer submits than tensors, every byte verified; a byte of one tensor in the middle
    of a group that does not match fails the pull, naming that tensor."""
    if C._xxhash is None:
        pytest.skip("the fused pull streams xxh3_64")
    monkeypatch.setattr(C, "FUSED_VERIFY", True)
    monkeypatch.setattr(C, "FUSED_TAIL", 1)  # groups of up to half of what is left (16 MiB at most)
    p, r, src, dst = _engine_memory_pair(server, GROUP_SIZES, 13)
    if not any(getattr(t, "inline_digest", False) for t in r.engine.transports.values()):
        pytest.skip("no same-host transport with inline_digest in this engine")
    real_submit = r._submit
    armed: list[int] = []

    def submit(reqs, deadline, digest=None):
        if digest is not None:
            armed.append(len(digest))
        return real_submit(reqs, deadline, digest)

    monkeypatch.setattr(r, "_submit", submit)
    if mutate is not None:
        src[mutate][MB + 5] ^= 0x10
        with pytest.raises(C.ChecksumError, match=f"t{mutate}"):
            r.replicate(1, timeout=30)
    else:
        assert r.replicate(1, timeout=30) == 1
        assert r.stats["verified"] and r.stats["fused"]
        large = sum(n for n in GROUP_SIZES if n >= C.TINY)
        assert r.stats["digest_in_copy_bytes"] == large - C.FUSED_PIECE
        assert all((a == b).all() for a, b in zip(src, dst, strict=True))
        assert sum(armed) == 16 and len(armed) < 16
    assert max(armed) > 4  # the first group: 7 tensors (16 MiB)
    r.close()
    p.close()


def _unarmed_submit(r: C.ShardHandle, unarmed: Callable[[list], bool], corrupt: list[int],
                    per_request: bool = False) -> Callable:
    """A stand-in for `r._submit` that drops the digest of the armed submits `unarmed` picks (as if
    another route, or a retry, had carried them: their bytes land unfolded); once `corrupt` names an
    offset of t5, that byte is changed right after its piece landed, before the lane folds it.
    `per_request`: `unarmed` picks single requests ([request]); a submit's requests then go out as
    runs, armed or not, in order, each landed before the next (a retry in the middle of a tensor)."""
    real_submit = r._submit

    def spoil(reqs: list, hdl) -> None:
        for lb, loff, _seg, _roff, n in reqs:
            if corrupt and lb is r.items["t5"].buf and loff <= corrupt[0] < loff + n:
                hdl.wait(30)
                r.items["t5"].arr[corrupt[0]] ^= 0x02

    def submit(reqs, deadline, digest=None):
        if digest is None:
            return real_submit(reqs, deadline)
        if not per_request:
            if not unarmed(reqs):
                return real_submit(reqs, deadline, digest)
            hdl = real_submit(reqs, deadline)
            spoil(reqs, hdl)
            return hdl
        for off, run in itertools.groupby(reqs, key=lambda q: unarmed([q])):
            run = list(run)
            hdl = real_submit(run, deadline, None if off else digest)
            if off:
                spoil(run, hdl)
            assert hdl.wait(30)
        return hdl

    return submit


def test_fused_digest_pull_folds_what_the_copy_did_not(server, monkeypatch, fused_lanes) -> None:
    """Pieces submitted without the digest (as if another route, or a retry, had carried them) are
    folded by the lane from the landed bytes, in order: the pull still verifies; and one byte that
    landed wrong in such a piece fails it."""
    if C._xxhash is None:
        pytest.skip("the fused pull streams xxh3_64")
    monkeypatch.setattr(C, "FUSED_VERIFY", True)
    monkeypatch.setattr(C, "DIGEST_PIECE", MB)
    p, r, src, dst = _engine_memory_pair(server, FUSED_SIZES, 7)
    corrupt: list[int] = []
    # every other MiB of a tensor: not armed
    monkeypatch.setattr(r, "_submit", _unarmed_submit(r, lambda reqs: (reqs[0][1] // MB) % 2 == 1, corrupt,
                                                      per_request=True))
    assert r.replicate(1, timeout=30) == 1
    assert 0 < r.stats["digest_in_copy_bytes"] < LARGE - C.FUSED_PIECE
    assert all((a == b).all() for a, b in zip(src, dst, strict=True))
    r.unpublish()
    corrupt.append(5 * MB + 9)  # in t5's sixth MiB: a piece the lane folds
    with pytest.raises(C.ChecksumError, match="t5"):
        r.replicate(1, timeout=30)
    r.close()
    p.close()


@pytest.mark.parametrize("where", ["probe_piece", "middle_piece", "last_byte"])
def test_fused_pull_hashes_what_landed_in_the_destination(server, monkeypatch, fused_lanes, where) -> None:
    """The fused lanes hash the receiver's own buffer after each piece landed: a byte that landed
    wrong (changed in the destination right after the READ completed) fails the replicate."""
    if C._xxhash is None:
        pytest.skip("the fused pull streams xxh3_64")
    monkeypatch.setattr(C, "FUSED_VERIFY", True)
    monkeypatch.setattr(C, "DIGEST_PIECE", 0)  # the lanes' Python hash (the executor's digest: test above)
    p, r, src, dst = _engine_memory_pair(server, FUSED_SIZES, 5)
    victim = r.items["t0"]
    pos = {"probe_piece": 17, "middle_piece": 3 * MB + 5, "last_byte": FUSED_SIZES[0] - 1}[where]
    real_submit = r._submit
    hit = []

    class Corrupting:
        def __init__(self, hdl, lo, n):
            self.hdl, self.lo, self.n = hdl, lo, n

        def poll(self):
            return self.hdl.poll()

        def cancel(self):
            return self.hdl.cancel()

        def routes(self):
            return self.hdl.routes()

        def wait(self, *a):
            out = self.hdl.wait(*a)
            if self.lo <= pos < self.lo + self.n and not hit:
                hit.append(pos)
                victim.arr[pos] ^= 0x01
            return out

    def submit(reqs, deadline):
        hdl = real_submit(reqs, deadline)
        for lb, loff, _seg, _roff, n in reqs:
            if lb is victim.buf:
                return Corrupting(hdl, loff, n)  # the fused pull READs one piece per submit
        return hdl

    monkeypatch.setattr(r, "_submit", submit)
    with pytest.raises(C.ChecksumError, match="t0"):
        r.replicate(1, timeout=30)
    assert hit == [pos]
    r.close()
    p.close()


def test_fused_pull_only_where_the_transport_copies_inline(server, monkeypatch) -> None:
    """register()'d arrays are out of the same-host transport's reach (memfd mode): tcp carries them,
    whose inline requests are sent, not complete, when submit returns: the windowed pull runs."""
    monkeypatch.setattr(C, "FUSED_VERIFY", True)
    sizes = [3 * MB + 5, 2 * MB, 7000]
    p, r, src, dst = _registered_pair(server, sizes, 8)
    for _ in range(3):  # not a race: decided from the transport, every time
        assert r.replicate(1, timeout=30) == 1
        assert r.stats["verified"] and not r.stats["fused"]
        assert all((a == b).all() for a, b in zip(src, dst, strict=True))
        r.unpublish()
        for t in dst:
            t[:] = 0
    assert {x["transport"] for x in r.engine.rail_stats() if x["bytes"]} >= {"tcp"}
    r.close()
    p.close()


def test_one_dominant_tensor_keeps_the_windowed_pull(server, monkeypatch) -> None:
    """A tensor is copied and hashed by one lane: one holding most of the shard would leave the other
    cores idle, so such a shard takes the windowed pull (its batches use every core); still verified."""
    monkeypatch.setattr(C, "FUSED_VERIFY", True)
    monkeypatch.setattr(C, "VERIFY_THREADS", 2)
    p, r, src, dst = _engine_memory_pair(server, [12 * MB, 2 * MB + 1, 3000], 9)
    assert r.replicate(1, timeout=30) == 1
    assert r.stats["verified"] and not r.stats["fused"]
    assert all((a == b).all() for a, b in zip(src, dst, strict=True))
    r.close()
    p.close()


# ---- the windowed pull over tcp: the transport folds each tensor's READ answers where they land ----


@pytest.fixture
def tcp_pair(server):
    """A publisher and a reader on their own tcp-only engines (two processes' worth of engines: the
    windowed pull, every READ answer received by the tcp executor's threads)."""
    from tent_core import Engine

    engines = [Engine(transports=["tcp"]), Engine(transports=["tcp"])]
    made = []

    def make(sizes, seed):
        rng = np.random.default_rng(seed)
        p = C.open("m", replica="pub", server=server, engine=engines[0])
        src = []
        for i, n in enumerate(sizes):
            src.append(p.allocate(f"t{i}", n))
            src[-1][:] = rng.integers(0, 255, n, dtype=np.uint8)
        p.publish(1)
        r = C.open("m", replica="rd", server=server, engine=engines[1])
        dst = [r.allocate(f"t{i}", n) for i, n in enumerate(sizes)]
        for t in dst:
            t[:] = 0xEE
        made.extend([r, p])
        return p, r, src, dst

    yield make
    for h in made:
        h.close()
    for e in engines:
        e.close()


def test_tcp_pull_folds_every_large_byte_where_it_lands(tcp_pair, monkeypatch) -> None:
    if C._xxhash is None:
        pytest.skip("the digest is xxh3_64")
    monkeypatch.setattr(C, "RECV_DIGEST", True)
    p, r, src, dst = tcp_pair(FUSED_SIZES, 8)
    assert r.engine.transports["tcp"].receive_digest
    real_submit = r._submit
    batches: list[list] = []

    def submit(reqs, deadline, digest=None):
        batches.append([(q[0], q[1], q[4]) for q in reqs])
        return real_submit(reqs, deadline, digest)

    monkeypatch.setattr(r, "_submit", submit)
    for _ in range(2):
        assert r.replicate(1, timeout=30) == 1
        assert r.stats["verified"] and not r.stats["fused"]
        # every large tensor's bytes folded by the receiving threads, none by the lanes
        assert r.stats["digest_in_copy_bytes"] == LARGE
        # ... and compared on the pulling thread, each once its last batch landed (no lane hop)
        if C.INLINE_CHECK:
            assert r.stats["digest_checked_inline"] == sum(1 for n in FUSED_SIZES if n >= C.TINY)
        assert 0 <= r.stats["digest_late_bytes"] <= LARGE
        # a batch's READs: pieces of at most RECV_DIGEST_PIECE, each tensor's in stream order, the
        # tensors taking turns (no two pieces of one tensor back to back while another has pieces left)
        for reqs in batches:
            assert all(n <= C.RECV_DIGEST_PIECE for _, _, n in reqs)
            for buf in {id(q[0]) for q in reqs}:
                offs = [q[1] for q in reqs if id(q[0]) == buf]
                assert offs == sorted(offs)
            for i in range(1, len(reqs)):
                if reqs[i][0] is reqs[i - 1][0]:
                    assert all(q[0] is reqs[i][0] for q in reqs[i:]), "a tensor's pieces back to back"
        batches.clear()
        assert all((a == b).all() for a, b in zip(src, dst, strict=True))
        r.unpublish()
        for t in dst:
            t[:] = 0xEE


def test_tcp_pull_without_receive_digest_hashes_in_the_lanes(tcp_pair, monkeypatch) -> None:
    monkeypatch.setattr(C, "RECV_DIGEST", False)
    p, r, src, dst = tcp_pair(FUSED_SIZES, 9)
    assert r.replicate(1, timeout=30) == 1
    assert r.stats["verified"] and r.stats["digest_in_copy_bytes"] == 0
    assert all((a == b).all() for a, b in zip(src, dst, strict=True))


def test_tcp_only_engine_skips_the_fused_probe(tcp_pair, monkeypatch) -> None:
    """No transport of a tcp-only engine completes a READ inside submit: the pull goes straight to the
    window (no pack READ alone, no probe READ waited for before it), and verifies every byte."""
    monkeypatch.setattr(C, "FUSED_VERIFY", True)
    p, r, src, dst = tcp_pair(FUSED_SIZES, 12)
    alone: list[list] = []
    real_read = r._read

    def read(reqs, deadline):
        alone.append(reqs)
        return real_read(reqs, deadline)

    monkeypatch.setattr(r, "_read", read)
    assert r.replicate(1, timeout=30) == 1
    assert r.stats["verified"] and not r.stats["fused"] and alone == []
    assert all((a == b).all() for a, b in zip(src, dst, strict=True))


@pytest.mark.parametrize("recv_digest,inline_check", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("where", [0, 7 * MB + 11, 9 * MB - 2])  # first, middle, last byte of t5
def test_tcp_pull_rejects_a_mutated_source(tcp_pair, monkeypatch, recv_digest, inline_check, where) -> None:
    if C._xxhash is None:
        pytest.skip("the digest is xxh3_64")
    monkeypatch.setattr(C, "RECV_DIGEST", recv_digest)
    monkeypatch.setattr(C, "INLINE_CHECK", inline_check)
    p, r, src, dst = tcp_pair(FUSED_SIZES, 10)
    src[5][where] ^= 0x40  # after publish: one byte no longer matches the announced checksum
    with pytest.raises(C.ChecksumError, match="t5"):
        r.replicate(1, timeout=30)
    assert r.state == "idle" and r.progress[:2] == (0, 0)


def test_tcp_pull_folds_what_the_transport_did_not(tcp_pair, monkeypatch) -> None:
    """Batches submitted without their digests (as if another route, or a retry, had carried them)
    land unfolded: the lanes fold them from the landed bytes, in order, and the pull verifies; one
    byte that landed wrong in such a batch fails it."""
    if C._xxhash is None:
        pytest.skip("the digest is xxh3_64")
    monkeypatch.setattr(C, "RECV_DIGEST", True)
    monkeypatch.setattr(C, "BATCH", MB)  # many batches: every other one unarmed
    p, r, src, dst = tcp_pair(FUSED_SIZES, 11)
    seen = [0]
    corrupt: list[int] = []

    def every_other(reqs: list) -> bool:
        seen[0] += 1
        return seen[0] % 2 == 1

    monkeypatch.setattr(r, "_submit", _unarmed_submit(r, every_other, corrupt))
    assert r.replicate(1, timeout=30) == 1
    assert 0 < r.stats["digest_in_copy_bytes"] < LARGE
    assert all((a == b).all() for a, b in zip(src, dst, strict=True))
    r.unpublish()
    seen[0] = 0
    corrupt.append(5 * MB + 9)
    with pytest.raises(C.ChecksumError, match="t5"):
        r.replicate(1, timeout=30)


def test_windowed_pull_beside_the_same_host_transport_is_not_armed(server, monkeypatch) -> None:
    """An engine whose same-host transport copies a digested READ inside submit (inline_digest) would
    copy a whole armed batch on the submitting thread: the windowed pull there does not arm its
    batches; the lanes fold every byte (and still verify)."""
    if C._xxhash is None:
        pytest.skip("the digest is xxh3_64")
    monkeypatch.setattr(C, "FUSED_VERIFY", False)
    monkeypatch.setattr(C, "RECV_DIGEST", True)
    p, r, src, dst = _engine_memory_pair(server, FUSED_SIZES, 12)
    if not any(getattr(t, "inline_digest", False) for t in r.engine.transports.values()):
        pytest.skip("no same-host transport with inline_digest in this engine")
    real_submit = r._submit
    armed: list = []

    def submit(reqs, deadline, digest=None):
        armed.append(digest)
        return real_submit(reqs, deadline, digest)

    monkeypatch.setattr(r, "_submit", submit)
    assert r.replicate(1, timeout=30) == 1
    assert r.stats["verified"] and r.stats["digest_in_copy_bytes"] == 0
    assert armed and all(d is None for d in armed)
    assert all((a == b).all() for a, b in zip(src, dst, strict=True))
    r.close()
    p.close()


def test_stream_and_reference_follow_every_layout_change(server) -> None:
    """The byte stream and the reference are kept between calls (a replicate asks for them several
    times) and rebuilt after each change of layout: a tensor added, replaced (same size, new memory),
    removed, a tiny one packed."""
    h = C.open("m", replica="layout", server=server)
    a = h.allocate("a", 3 * MB)
    h._build_layout()
    assert [m[0] for m in h._stream()] == ["a"] and h._ref()["items"][0][2] == 3 * MB
    assert h._ref() == h._ref() and h._ref() is not h._ref()
    h.allocate("b", 2 * MB + 5)
    h._build_layout()
    assert [m[0] for m in h._stream()] == ["a", "b"] and h._ref()["total"] == 5 * MB + 5
    buf_a = h._stream()[0][1]
    h.register("a", np.zeros(3 * MB, np.uint8))  # the same size, other memory
    assert h._stream()[0][1] is not buf_a and h._stream()[0][1] is h.items["a"].buf
    h.register("t", np.zeros(100, np.uint8))  # tiny: packed
    h._build_layout()
    assert [m[0] for m in h._stream()] == ["__pack__", "a", "b"]
    assert h._ref()["pack"] == [["t", 0, 100]]
    h.unregister("b")
    h._build_layout()
    assert [m[0] for m in h._stream()] == ["__pack__", "a"]
    assert [i[0] for i in h._ref()["items"]] == ["__pack__", "a"]
    del a
    h.close()



def test_tcp_pull_arms_no_more_digests_per_submit_than_the_engine_takes(tcp_pair, monkeypatch) -> None:
    """Large batches (REFHUB_BATCH_MB, REFHUB_BATCH_S) over many large tensors: a batch stops at the
    engine's digest limit per submit (FUSED_GROUP_MAX) instead of failing the pull; every byte verified."""
    if C._xxhash is None:
        pytest.skip("the digest is xxh3_64")
    monkeypatch.setattr(C, "RECV_DIGEST", True)
    monkeypatch.setattr(C, "BATCH", 256 * MB)
    monkeypatch.setattr(C, "BATCH_S", 10.0)
    p, r, src, dst = tcp_pair([C.TINY + 64 * i for i in range(C.FUSED_GROUP_MAX + 6)], 21)
    real_submit = r._submit
    armed: list[int] = []

    def submit(reqs, deadline, digest=None):
        armed.append(len(digest or ()))
        return real_submit(reqs, deadline, digest)

    monkeypatch.setattr(r, "_submit", submit)
    assert r.replicate(1, timeout=60) == 1
    assert r.stats["verified"] and all((a == b).all() for a, b in zip(src, dst, strict=True))
    assert max(armed) == C.FUSED_GROUP_MAX  # a batch reached the limit, and none went past it
