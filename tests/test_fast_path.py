"""The plan cache and native submit path (`_native.FastPath`): requests of a class planned once are
validated, sliced and submitted in C. Each test checks that the fast path was really taken (its
hit counter) and that it moves the right bytes or refuses exactly what the planner refuses."""

from __future__ import annotations

import numpy as np
import pytest
from peers import Peer

from tent_core import (
    READ,
    WRITE,
    Engine,
    InvalidRequestError,
    NotRegisteredError,
    OutOfBoundsError,
    PermissionDeniedError,
    Request,
)
from tent_core.testing import TENT_E_IO, FaultPlugin, pattern

SIZE = 8 << 20
TRANSPORTS = ["shm", "tcp"]


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=SIZE)
    yield p
    p.close()


@pytest.fixture(params=TRANSPORTS)
def eng(request, peer):
    if request.param not in peer.transports:
        pytest.fail(f"transport {request.param} not available in the peer: {peer.transports}")
    with Engine(transports=[request.param]) as e:
        yield e


def _bytes_by_transport(eng: Engine) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in eng.rail_stats():
        out[r["transport"]] = out.get(r["transport"], 0) + r["bytes"]
    return out


def test_repeated_requests_take_the_fast_path_byte_for_byte(eng, peer):
    local = eng.allocate(1 << 20)
    rw = peer.seg("rw")
    want = pattern(SIZE, seed=0)  # the peer's "rw" segment
    rng = np.random.default_rng(1)
    # plans the class (remote segment, local buffer, READ, MID) and caches it; the first request
    # also connects the route, which retires plans made before it: plan once more
    eng.read(local, rw, 4096)
    eng.read(local, rw, 4096)
    hits = eng._fast.hits
    for _ in range(60):
        n = int(rng.integers(1, 256 << 10))
        lo, ro = int(rng.integers(0, (1 << 20) - n)), int(rng.integers(0, SIZE - n))
        local.array[lo : lo + n] = 0
        h = eng.submit(Request(READ, local, lo, rw, ro, n))
        assert h.wait(10)
        assert np.array_equal(local.array[lo : lo + n], want[ro : ro + n])
    assert eng._fast.hits == hits + 60
    # a batch of several requests of the class: one native call
    reqs = [Request(READ, local, i << 16, rw, (i * 7) << 16, 1 << 16) for i in range(16)]
    local.array[:] = 0
    eng.submit(reqs).wait(10)
    assert eng._fast.hits == hits + 61
    for i in range(16):
        assert np.array_equal(local.array[i << 16 : (i + 1) << 16], want[(i * 7) << 16 : ((i * 7) + 1) << 16])
    # writes: their own class
    src = pattern(1 << 20, seed=9)
    local.array[:] = src
    eng.write(local, rw, 1 << 16, remote_offset=0)
    before = eng._fast.hits
    for i in range(1, 16):
        eng.write(local, rw, 1 << 16, local_offset=i << 16, remote_offset=i << 16)
    assert eng._fast.hits == before + 15
    assert peer.digest("rw", 0, 1 << 20) == _sha(src)
    peer.call(cmd="fill", segment="rw", seed=0)


def _sha(a: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(a.tobytes()).hexdigest()


def test_fast_path_refuses_what_the_planner_refuses(eng, peer):
    local = eng.allocate(1 << 16)
    rw, ro = peer.seg("rw"), peer.seg("ro")
    for _ in range(2):
        eng.read(local, rw, 4096)
        eng.read(local, ro, 4096)  # both classes cached
    hits = eng._fast.hits
    with pytest.raises(OutOfBoundsError):  # runs past the peer's buffer
        eng.read(local, rw, 4096, remote_offset=SIZE - 100)
    with pytest.raises(OutOfBoundsError):  # runs past the local buffer
        eng.submit(Request(READ, local, (1 << 16) - 10, rw, 0, 4096))
    with pytest.raises(PermissionDeniedError):  # "ro" is read-only
        eng.write(local, ro, 4096)
    with pytest.raises(InvalidRequestError):
        eng.submit(Request(READ, local, -1, rw, 0, 4096))
    with pytest.raises(InvalidRequestError):
        eng.submit(Request(READ, local, 0, rw, 0, 4096), deadline=0)
    with pytest.raises(InvalidRequestError):
        eng.submit([Request(READ, local, 0, rw, 0, 4096), "not a request"])  # type: ignore[list-item]
    assert eng._fast.hits == hits  # none of these went through
    h = eng.submit(Request(READ, local, 0, rw, 0, 0))  # nothing to move: done at once
    assert h.wait(1) and h.poll() == "done"
    eng.read(local, rw, 4096)
    assert eng._fast.hits == hits + 1


def test_an_unregistered_buffer_is_refused_after_its_class_was_cached(eng, peer):
    buf = eng.allocate(8192)
    eng.read(buf, peer.seg("rw"), 4096)
    eng.read(buf, peer.seg("rw"), 4096)
    assert eng._fast.size >= 1
    eng.unregister(buf)
    with pytest.raises(NotRegisteredError):
        eng.read(buf, peer.seg("rw"), 4096)


def test_a_segment_of_many_buffers_is_one_cached_class(peer):
    """Requests anywhere in a segment of many registered buffers share one entry (the buffer
    table is bisected in C); a range across two buffers goes to the planner."""
    with Engine(transports=["tcp"]) as tgt, Engine(transports=["tcp"]) as ini:
        n = 2000
        back = np.zeros(n * 4096, np.uint8)
        back[:] = pattern(n * 4096, seed=3)
        for i in range(n):
            tgt.register(back[i * 4096 : (i + 1) * 4096], segment="kv")
        local = ini.allocate(4096)
        for _ in range(2):
            ini.read(local, tgt.segment_name("kv"), 4096)
        hits, size = ini._fast.hits, ini._fast.size
        for k in range(200):
            i = (k * 7919) % n
            ini.read(local, tgt.segment_name("kv"), 4096, remote_offset=i * 4096)
            assert np.array_equal(local.array, back[i * 4096 : (i + 1) * 4096])
        assert ini._fast.hits == hits + 200 and ini._fast.size == size
        # spanning two registrations: two pieces, which the planner handles (not a fast-path class)
        ini.read(local, tgt.segment_name("kv"), 4096, remote_offset=4096 + 100)
        assert np.array_equal(local.array, back[4096 + 100 : 2 * 4096 + 100])
        assert ini._fast.hits == hits + 200


def test_fast_path_off_plans_every_request(peer):
    with Engine({"fast_path": False}, transports=["tcp"]) as eng:
        assert eng._fast is None
        local = eng.allocate(1 << 16)
        for _ in range(3):
            eng.read(local, peer.seg("rw"), 1 << 16)
        assert np.array_equal(local.array, pattern(SIZE, seed=0)[: 1 << 16])


def test_size_rules_key_the_cache_by_length(peer):
    rules = [{"name": "big-over-tcp", "match": {"min_size": 1 << 20}, "transports": ["tcp"]}]
    with Engine({"rules": rules}, transports=["shm", "tcp"]) as eng:
        local = eng.allocate(2 << 20)
        for _ in range(5):  # the first two rounds connect the routes (retiring earlier plans)
            eng.read(local, peer.seg("rw"), 64 << 10)
            eng.read(local, peer.seg("rw"), 1 << 20)
        used = _bytes_by_transport(eng)
        assert used.get("shm", 0) == 5 * (64 << 10) and used.get("tcp", 0) == 5 * (1 << 20), used
        assert eng._fast.hits >= 6


def test_a_fast_path_batch_is_retried_on_another_transport(peer):
    """The failing slice of a batch the fast path submitted is re-routed like any other: recovery
    finds its Decision through the plan-cache entry the batch records."""
    fp = FaultPlugin("shm")
    with Engine(plugins=[fp], transports=["tcp", "faulty_shm"]) as eng:
        local = eng.allocate(1 << 20)
        want = pattern(SIZE, seed=1)[: 1 << 20]  # the peer's "ro" segment
        for _ in range(3):
            eng.read(local, peer.seg("ro"), 1 << 20)
        assert _bytes_by_transport(eng).get("faulty_shm", 0) == 3 << 20
        hits = eng._fast.hits
        fp.instances["shm"].inject(TENT_E_IO)
        local.array[:] = 0
        h = eng.submit([Request(READ, local, i << 16, peer.seg("ro"), i << 16, 1 << 16) for i in range(16)], deadline=20)
        assert eng._fast.hits == hits + 1  # submitted natively ...
        h.wait()  # ... failed on shm, finished over tcp
        assert np.array_equal(local.array, want)
        assert h.retries >= 1 and fp.instances["shm"].injected > 0
        assert _bytes_by_transport(eng)["tcp"] >= 1 << 20


def test_write_through_the_fast_path_is_checked_by_the_target(peer):
    """The peer's "ro" buffer refuses writes on the planner side; a WRITE class to "rw" cached
    first does not open "ro" (different remote segment, different class)."""
    with Engine(transports=["tcp"]) as eng:
        local = eng.allocate(1 << 16)
        local.array[:] = pattern(1 << 16, seed=4)
        eng.write(local, peer.seg("rw"), 1 << 16)
        eng.write(local, peer.seg("rw"), 1 << 16)
        with pytest.raises(PermissionDeniedError):
            eng.write(local, peer.seg("ro"), 1 << 16)
        assert peer.digest("ro", 0, 1 << 16) == _sha(pattern(SIZE, seed=1)[: 1 << 16])
        peer.call(cmd="fill", segment="rw", seed=0)
        assert WRITE is not None


def test_a_refresh_after_a_registration_fetches_only_the_new_buffers():
    """The first request into a buffer the peer registered after we read its segment re-reads just
    that segment, and only the buffers registered since (not the thousand already known)."""
    with Engine(transports=["tcp"]) as tgt, Engine(transports=["tcp"]) as ini:
        back = np.zeros(1100 * 4096, np.uint8)
        back[:] = pattern(len(back), seed=6)
        for i in range(1000):
            tgt.register(back[i * 4096 : (i + 1) * 4096], segment="kv")
        local = ini.allocate(4096)
        seg = tgt.segment_name("kv")
        ini.read(local, seg, 4096)
        peer = ini.peers.lookup(tgt.engine_id)
        answers: list[dict] = []
        call = peer.client.call

        def spy(msg, timeout):
            out = call(msg, timeout)
            answers.append(out)
            return out

        peer.client.call = spy
        for i in range(1000, 1003):
            b = tgt.register(back[i * 4096 : (i + 1) * 4096], segment="kv")
            ini.read(local, seg, 4096, remote_offset=b.offset)
            assert np.array_equal(local.array, back[i * 4096 : (i + 1) * 4096])
        assert [len(a["buffers"]) for a in answers] == [1, 1, 1] and all(a["incremental"] for a in answers)
        # a buffer left the segment: the next refresh reads it whole, and the gone buffer is refused
        first = tgt._segments._segments["kv"].buffers[0]
        tgt.unregister(first)
        b = tgt.register(back[1003 * 4096 : 1004 * 4096], segment="kv")
        ini.read(local, seg, 4096, remote_offset=b.offset)
        assert np.array_equal(local.array, back[1003 * 4096 : 1004 * 4096])
        assert not answers[-1]["incremental"] and len(answers[-1]["buffers"]) == 1003
        with pytest.raises(NotRegisteredError):
            ini.read(local, seg, 4096, remote_offset=first.offset)


def test_concurrent_refreshes_of_a_segment_lose_no_buffer():
    """Two threads meeting new buffers of the same segment re-read it at once (the staged workers of
    refhub's device pulls meeting a peer's fresh staging slots): the reply a thread got first must
    not be applied over the newer view another thread applied meanwhile, or the buffers known before
    vanish from the map and the next request into them is refused as out of bounds."""
    import threading

    with Engine(transports=["tcp"]) as tgt, Engine(transports=["tcp"]) as ini:
        back = np.zeros(3 * 4096, np.uint8)
        back[:] = pattern(len(back), seed=7)
        bufs = [tgt.register(back[:4096], segment="kv")]
        seg = tgt.segment_name("kv")
        local = [ini.allocate(4096) for _ in range(2)]
        ini.read(local[0], seg, 4096)
        peer = ini.peers.lookup(tgt.engine_id)
        bufs += [tgt.register(back[i * 4096 : (i + 1) * 4096], segment="kv") for i in (1, 2)]
        first_replied, second_done = threading.Event(), threading.Event()
        call = peer.client.call
        calls: list[dict] = []

        def slow_first(msg, timeout):
            out = call(msg, timeout)
            calls.append(msg)
            if msg.get("segment") == "kv" and len(calls) == 1:
                first_replied.set()
                # hold this reply until the other thread is done (bounded: with the fix the other
                # thread waits for this one, so this wait runs out and the test goes on)
                second_done.wait(5.0)
            return out

        peer.client.call = slow_first
        errs: list[BaseException] = []

        def read(i: int) -> None:
            try:
                ini.read(local[i - 1], seg, 4096, remote_offset=bufs[i].offset)
                assert np.array_equal(local[i - 1].array, back[i * 4096 : (i + 1) * 4096])
            except BaseException as exc:  # reported by the main thread
                errs.append(exc)

        t1 = threading.Thread(target=read, args=(1,))
        t1.start()
        assert first_replied.wait(60)
        t2 = threading.Thread(target=read, args=(2,))
        t2.start()
        t2.join(5.0)
        second_done.set()
        t1.join(60)
        t2.join(60)
        assert not t1.is_alive() and not t2.is_alive() and not errs, errs
        assert [b.offset for b in peer.segments["kv"]] == [b.offset for b in bufs]
        for i, b in enumerate(bufs):
            ini.peers.map_remote(peer, "kv", b.offset, 4096, READ)
            ini.read(local[0], seg, 4096, remote_offset=b.offset)
            assert np.array_equal(local[0].array, back[i * 4096 : (i + 1) * 4096])


def test_stream_ordered_requests_are_left_to_the_planner(peer):
    """A request naming a stream (or event) never takes the cached plan of its class: the planner
    holds it until the stream's work is done."""
    import time

    from tent_core.simdev import SimDevicePlugin, SimStream

    with Engine(transports=["tcp", "simdev"], plugins=[SimDevicePlugin()]) as eng:
        local = eng.allocate(1 << 16)
        rw = peer.seg("rw")
        eng.read(local, rw, 4096)
        eng.read(local, rw, 4096)
        hits = eng._fast.hits
        eng.read(local, rw, 4096)
        assert eng._fast.hits == hits + 1  # the class is cached
        s = SimStream()
        s.sleep(0.3)
        t0 = time.monotonic()
        h = eng.submit(Request(READ, local, 0, rw, 0, 4096, wait_stream=s))
        assert eng._fast.hits == hits + 1  # not taken from the cache
        h.wait()
        assert time.monotonic() - t0 >= 0.25  # ordered after the stream's work
        assert h.ordering in ("host", "native")
        s.synchronize(30)
