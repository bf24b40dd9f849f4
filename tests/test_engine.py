"""The declarative engine across real processes and real transports."""

from __future__ import annotations

import time

import numpy as np
import pytest
from peers import Peer, sha

from tent_core import (
    READ,
    READ_ONLY,
    WRITE,
    DeadlineExceededError,
    Engine,
    InvalidRequestError,
    NoPathError,
    NotRegisteredError,
    OutOfBoundsError,
    PeerUnreachableError,
    PermissionDeniedError,
    Request,
    UnknownSegmentError,
)
from tent_core.testing import pattern

TRANSPORTS = ["tcp", "shm"]


@pytest.fixture(scope="module")
def peer_module():
    p = Peer(size=8 << 20)
    yield p
    p.close()


@pytest.fixture(params=TRANSPORTS)
def engine(request, peer_module):
    if request.param not in peer_module.transports:
        pytest.fail(f"transport {request.param} not available in the peer: {peer_module.transports}")
    eng = Engine(transports=[request.param])
    assert request.param in eng.transports, eng.availability
    yield eng
    eng.close()


def test_read_and_write_byte_for_byte(engine, peer_module):
    n = peer_module.size
    local = engine.allocate(n)
    engine.read(local, peer_module.seg("rw"), n)
    assert np.array_equal(local.array, pattern(n, seed=0))
    # write a different pattern into the middle, unaligned, and check on the peer
    data = pattern(3_000_001, seed=7)
    local.array[:3_000_001] = data
    engine.write(local, peer_module.seg("rw"), 3_000_001, remote_offset=12_345)
    assert peer_module.digest("rw", 12_345, 3_000_001) == sha(data)
    peer_module.call(cmd="fill", segment="rw", seed=0)


def test_user_registered_numpy_and_read_only(engine, peer_module):
    arr = np.zeros(1 << 20, np.uint8)
    buf = engine.register(arr)
    engine.read(buf, peer_module.seg("ro"), 1 << 20, remote_offset=4096)
    assert np.array_equal(arr, pattern(peer_module.size, seed=1)[4096 : 4096 + (1 << 20)])
    if set(engine.transports) == {"shm"}:
        # the peer's own numpy array is not memfd-backed: only CMA reaches it, which bypasses the
        # target and is opt-in on both sides (SECURITY.md); by default no same-host path serves it
        # (refused at submit with the reason: plans leave shm out for that buffer)
        with pytest.raises(NoPathError, match="maps only engine-allocated memory"):
            engine.read(buf, peer_module.seg("user"), 1 << 20, timeout=10)
        return
    engine.read(buf, peer_module.seg("user"), 1 << 20)
    assert np.array_equal(arr, pattern(peer_module.size, seed=2)[: 1 << 20])


def test_many_concurrent_requests_zero_length_and_unaligned(engine, peer_module):
    local = engine.allocate(4 << 20)
    rng = np.random.default_rng(1)
    reqs, spans = [], []
    pos = 0
    while pos < (4 << 20) - 70_000:
        ln = int(rng.integers(0, 65_537))
        roff = int(rng.integers(0, peer_module.size - ln))
        reqs.append(Request(READ, local, pos, peer_module.seg("ro"), roff, ln))
        spans.append((pos, roff, ln))
        pos += ln + int(rng.integers(0, 7))
    handles = [engine.submit(reqs[i : i + 40]) for i in range(0, len(reqs), 40)]
    for h in handles:
        assert h.wait(30)
    src = pattern(peer_module.size, seed=1)
    for lpos, roff, ln in spans:
        assert np.array_equal(local.array[lpos : lpos + ln], src[roff : roff + ln])
    # zero-length requests complete at once
    h = engine.submit([Request(WRITE, local, 0, peer_module.seg("rw"), 0, 0)])
    assert h.wait(5) and h.poll() == "done"


def test_bad_inputs_get_typed_errors_and_peer_keeps_serving(engine, peer_module):
    local = engine.allocate(1 << 20)
    seg = peer_module.seg
    with pytest.raises(UnknownSegmentError):
        engine.submit([Request(READ, local, 0, seg("nope"), 0, 10)])
    with pytest.raises(OutOfBoundsError):
        engine.submit([Request(READ, local, 0, seg("rw"), peer_module.size - 10, 100)])
    with pytest.raises(NotRegisteredError):
        engine.submit([Request(READ, local, 0, seg("rw"), peer_module.size + 4096, 100)])
    with pytest.raises(PermissionDeniedError):
        engine.submit([Request(WRITE, local, 0, seg("ro"), 0, 100)])
    with pytest.raises(OutOfBoundsError):
        engine.submit([Request(READ, local, (1 << 20) - 5, seg("rw"), 0, 100)])
    with pytest.raises(InvalidRequestError):
        engine.submit([Request(READ, local, 0, "no-port/rw", 0, 100)])
    with pytest.raises(InvalidRequestError):
        engine.submit([Request(READ, local, 0, seg("rw"), 0, -1)])
    other = Engine(transports=[])
    try:
        foreign = other.allocate(4096)
        with pytest.raises(NotRegisteredError):
            engine.submit([Request(READ, foreign, 0, seg("rw"), 0, 100)])
    finally:
        other.close()
    with pytest.raises(NotRegisteredError):
        gone = engine.allocate(4096)
        engine.unregister(gone)
        engine.submit([Request(READ, gone, 0, seg("rw"), 0, 100)])
    # and the peer still serves
    engine.read(local, seg("rw"), 1 << 20)
    assert np.array_equal(local.array, pattern(peer_module.size, seed=0)[: 1 << 20])


def test_unreachable_peer_is_an_error_within_the_deadline():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with Engine({"control_timeout_s": 0.5}) as eng:
        local = eng.allocate(4096)
        t0 = time.monotonic()
        with pytest.raises(PeerUnreachableError):
            eng.submit([Request(READ, local, 0, f"127.0.0.1:{port}/rw", 0, 100)], deadline=1.0)
        assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_killed_peer_gives_error_not_hang(peer_factory, transport):
    peer = peer_factory(size=64 << 20)
    with Engine({"max_retries_per_slice": 2}, transports=[transport]) as eng:
        local = eng.allocate(64 << 20)
        eng.read(local, peer.seg("rw"), 1 << 20)  # connected and working
        peer.kill()
        t0 = time.monotonic()
        with pytest.raises((PeerUnreachableError, DeadlineExceededError)):
            for _ in range(50):
                eng.submit([Request(READ, local, 0, peer.seg("rw"), 0, 64 << 20)], deadline=3.0).wait()
        assert time.monotonic() - t0 < 3.5


def test_deadline_and_cancel(peer_module):
    with Engine(transports=["tcp"]) as eng:
        local = eng.allocate(8 << 20)
        h = eng.submit([Request(READ, local, 0, peer_module.seg("rw"), 0, 8 << 20)] * 20)
        h.cancel()
        from tent_core import CancelledError

        with pytest.raises(CancelledError):
            h.wait(10)
        assert h.poll() == "cancelled"
        assert h.bytes_done < 20 * (8 << 20)
        with pytest.raises(InvalidRequestError):
            eng.submit([Request(READ, local, 0, peer_module.seg("rw"), 0, 10)], deadline=0)


def test_same_host_prefers_shm(peer_module):
    with Engine() as eng:
        local = eng.allocate(1 << 20)
        eng.read(local, peer_module.seg("rw"), 1 << 20)
        used = {r["transport"] for r in eng.rail_stats() if r["bytes"] > 0}
        assert used == {"shm"}, eng.rail_stats()


def test_read_only_local_registration_and_segments(peer_module):
    with Engine(transports=["tcp"]) as eng:
        a = eng.allocate(1 << 16, segment="kv", perm=READ_ONLY)
        b = eng.allocate(1 << 16, segment="kv")
        assert b.offset >= a.offset + a.length
        with pytest.raises(InvalidRequestError):
            eng.allocate(0)
        with pytest.raises(InvalidRequestError):
            eng.register(object())
        with pytest.raises(InvalidRequestError):
            eng.register(np.zeros((4, 4))[:, ::2])


def test_control_port_answers_garbage_with_errors_and_keeps_serving(peer_module):
    import msgpack
    import zmq

    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{peer_module.engine_id}")
    try:
        for payload in (b"\xc1\xff not msgpack", msgpack.packb([1, 2, 3]), msgpack.packb({"op": 7}),
                        msgpack.packb({"op": "format-disk"})):  # fmt: skip
            s.send_multipart([b"", payload])
            assert s.poll(5000), "no reply to a malformed message"
            reply = msgpack.unpackb(s.recv_multipart()[-1])
            assert reply["ok"] is False and reply["error"]
    finally:
        s.close(0)
    with Engine(transports=["tcp"]) as eng:  # and it still serves real requests
        local = eng.allocate(4096)
        eng.read(local, peer_module.seg("rw"), 4096)
        assert np.array_equal(local.array, pattern(peer_module.size, seed=0)[:4096])


def test_torch_tensors_register_and_move(peer_module):
    torch = pytest.importorskip("torch")
    t = torch.zeros(1 << 18, dtype=torch.float32)
    with Engine(transports=["tcp"]) as eng:
        buf = eng.register(t)
        assert buf.length == t.numel() * 4 and buf.kind.value == "host"
        eng.read(buf, peer_module.seg("ro"), buf.length)
        assert np.array_equal(t.numpy().view(np.uint8), pattern(peer_module.size, seed=1)[: buf.length])
        with pytest.raises(InvalidRequestError):
            eng.register(torch.zeros(8, 8)[:, ::2])


def test_deadline_exceeded_when_the_peer_stalls(peer_factory):
    import signal

    peer = peer_factory(size=8 << 20)
    with Engine(transports=["tcp"]) as eng:
        local = eng.allocate(8 << 20)
        eng.read(local, peer.seg("rw"), 1 << 20)
        peer.stop()  # alive but silent: no socket error, just no progress
        try:
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceededError):
                eng.submit([Request(READ, local, 0, peer.seg("rw"), 0, 8 << 20)], deadline=0.3).wait()
            assert time.monotonic() - t0 < 1.0
        finally:
            peer.proc.send_signal(signal.SIGCONT)
