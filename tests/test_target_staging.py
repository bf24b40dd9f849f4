"""Target-side staging across processes: host memory here <-> simulated device memory in another
process that no transport of ours reaches (its device IPC is off), over TCP through the target's
staging slots; and device memory here <-> device memory there (both sides stage). Byte-exact with
patterns that never repeat, the target's own checks, leases, cancellation, busy slots."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from peers import sha
from sim_peers import SimPeer

from tent_core import (
    READ,
    WRITE,
    CancelledError,
    Engine,
    NoPathError,
    OutOfBoundsError,
    PermissionDeniedError,
    Request,
    TentError,
)
from tent_core.metadata import ControlClient
from tent_core.path_planner import chunk_plan, ramped_chunk_plan
from tent_core.simdev import SimArray, SimDevicePlugin
from tent_core.testing import pattern

SIZE = 24 << 20
NO_IPC = {"transports": {"simdev": {"ipc": False}}}
# small slots and chunks: every request below crosses many chunks and reuses slots
TARGET = {**NO_IPC, "target_staging_chunk_bytes": 1 << 20, "target_staging_slots": 6, "target_staging_depth": 3,
          "target_staging_lease_s": 2.0}


@pytest.fixture(scope="module")
def peer():
    p = SimPeer(size=SIZE, config=TARGET, transports=["tcp", "simdev"])
    yield p
    p.close()


@pytest.fixture
def host_engine():
    eng = Engine(transports=["tcp"])
    yield eng
    eng.close()


@pytest.fixture
def dev_engine():
    eng = Engine({**NO_IPC, "staging_chunk_bytes": 1 << 20, "staging_buffers": 4}, transports=["tcp", "simdev"],
                 plugins=[SimDevicePlugin()])
    yield eng
    eng.close()


def test_host_to_remote_device_and_back_through_target_staging(host_engine, peer):
    n = 9 * (1 << 20) + 12_345  # not a multiple of the chunk
    buf = host_engine.allocate(SIZE)
    buf.array[:] = pattern(SIZE, seed=41)
    before = peer.stats()["staging"]
    ex = host_engine.explain(Request(WRITE, buf, 3, peer.seg("dev"), 777, n))
    assert ex.chosen == "target-staged" and ex.remote_kind == "sim"
    assert "tcp" in ex.route and "target" in ex.route
    h = host_engine.submit([Request(WRITE, buf, 3, peer.seg("dev"), 777, n)])
    assert h.wait(60) and h.poll() == "done"
    assert peer.digest("dev", 777, n) == sha(pattern(SIZE, seed=41)[3 : 3 + n])
    assert peer.digest("dev", 0, 777) == sha(pattern(SIZE, seed=0)[:777])  # neighbours untouched
    assert peer.digest("dev", 777 + n, 4096) == sha(pattern(SIZE, seed=0)[777 + n : 777 + n + 4096])
    after = peer.stats()["staging"]
    assert after["pushed_bytes"] - before["pushed_bytes"] == n  # the target copied every byte itself
    # and back: remote device -> host, into a different place
    out = host_engine.allocate(n + 100)
    host_engine.transfer(READ, out, 100, peer.seg("dev"), 777, n)
    assert np.array_equal(out.array[100:], pattern(SIZE, seed=41)[3 : 3 + n])
    assert peer.stats()["staging"]["pulled_bytes"] - after["pulled_bytes"] == n
    peer.call(cmd="fill", segment="dev", seed=0)


def test_device_to_remote_device_both_sides_stage(dev_engine, peer):
    n = 7 * (1 << 20) + 4_097
    src = SimArray(SIZE)
    src.upload(pattern(SIZE, seed=52))
    lb = dev_engine.register(src, segment="mine")
    ex = dev_engine.explain(Request(WRITE, lb, 11, peer.seg("dev"), 5, n))
    assert ex.chosen == "both-staged", str(ex)
    dev_engine.transfer(WRITE, lb, 11, peer.seg("dev"), 5, n, timeout=60)
    assert peer.digest("dev", 5, n) == sha(pattern(SIZE, seed=52)[11 : 11 + n])
    # remote read-only device memory -> local device memory
    dst = SimArray(n + 3)
    lb2 = dev_engine.register(dst, segment="mine2")
    dev_engine.transfer(READ, lb2, 3, peer.seg("devro"), 1000, n, timeout=60)
    assert np.array_equal(dst.download(3, n), pattern(SIZE, seed=1)[1000 : 1000 + n])
    assert not dst.download(0, 3).any()
    peer.call(cmd="fill", segment="dev", seed=0)


def test_many_concurrent_requests_share_few_slots(host_engine, peer):
    """Six slots, depth three: four concurrent 3 MiB requests wait for slots (busy) and all land."""
    m = 3 << 20
    bufs = [host_engine.allocate(m) for _ in range(4)]
    for i, b in enumerate(bufs):
        b.array[:] = pattern(SIZE, seed=60 + i)[:m]
    h = host_engine.submit([Request(WRITE, b, 0, peer.seg("dev"), i * m, m) for i, b in enumerate(bufs)])
    assert h.wait(60)
    for i in range(4):
        assert peer.digest("dev", i * m, m) == sha(pattern(SIZE, seed=60 + i)[:m])
    peer.call(cmd="fill", segment="dev", seed=0)


def test_the_target_enforces_range_and_permission_itself(host_engine, peer):
    """The initiator's own checks are bypassed here: raw stage_open messages to the target."""
    c = ControlClient(peer.engine_id)
    try:
        rep = c.call({"op": "stage_open", "seg": "devro", "offset": 0, "length": 4096, "write": True, "depth": 2}, 10)
        assert not rep["ok"] and rep["code"] == "PermissionDeniedError"
        rep = c.call({"op": "stage_open", "seg": "dev", "offset": SIZE - 10, "length": 4096, "write": False, "depth": 2}, 10)
        assert not rep["ok"] and rep["code"] == "OutOfBoundsError"
        rep = c.call({"op": "stage_open", "seg": "host", "offset": 0, "length": 4096, "write": False, "depth": 2}, 10)
        assert not rep["ok"] and "not staged" in rep["error"]  # host memory needs no staging
        for bad in ({"op": "stage_open"}, {"op": "stage_open", "seg": "dev", "offset": -1, "length": 1, "write": True,
                     "depth": 1}, {"op": "stage_push", "sid": "x"}, {"op": "stage_pull", "sid": 999, "slot": 0, "off": 0,
                     "len": 1}):
            rep = c.call(bad, 10)
            assert not rep["ok"] and rep["error"], bad
        # a READ session cannot push, nor reach past its range
        rep = c.call({"op": "stage_open", "seg": "devro", "offset": 0, "length": 8192, "write": False, "depth": 1}, 10)
        assert rep["ok"]
        sid = rep["sid"]
        assert c.call({"op": "stage_push", "sid": sid, "slot": 0, "off": 0, "len": 4096}, 10)["code"] == "InvalidRequestError"
        assert c.call({"op": "stage_pull", "sid": sid, "slot": 0, "off": 4096, "len": 8192}, 10)["code"] == "OutOfBoundsError"
        assert c.call({"op": "stage_pull", "sid": sid, "slot": 5, "off": 0, "len": 1}, 10)["ok"] is False
        assert c.call({"op": "stage_pull", "sid": sid, "slot": 0, "off": 0, "len": 4096}, 10)["ok"]
        assert c.call({"op": "stage_close", "sid": sid}, 10)["ok"]
        assert c.call({"op": "ping"}, 10)["ok"]  # still serving
    finally:
        c.close()
    # the initiator refuses the same at submit, before anything moves
    buf = host_engine.allocate(4096)
    with pytest.raises(PermissionDeniedError):
        host_engine.submit([Request(WRITE, buf, 0, peer.seg("devro"), 0, 4096)])
    with pytest.raises(OutOfBoundsError):
        host_engine.submit([Request(READ, buf, 0, peer.seg("dev"), SIZE - 10, 4096)])


def test_an_abandoned_session_is_reclaimed_after_its_lease(peer):
    c = ControlClient(peer.engine_id)
    try:
        expired = peer.stats()["staging"]["expired"]
        rep = c.call({"op": "stage_open", "seg": "dev", "offset": 0, "length": 1 << 20, "write": True, "depth": 3}, 10)
        assert rep["ok"]
        # the initiator vanishes; after the lease (2 s) the next open reclaims the session
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.5)
            r2 = c.call({"op": "stage_open", "seg": "dev", "offset": 0, "length": 4096, "write": True, "depth": 1}, 10)
            assert r2["ok"]
            c.call({"op": "stage_close", "sid": r2["sid"]}, 10)
            if peer.stats()["staging"]["expired"] > expired:
                break
        assert peer.stats()["staging"]["expired"] > expired
        with_closed = c.call({"op": "stage_push", "sid": rep["sid"], "slot": 0, "off": 0, "len": 4096}, 10)
        assert not with_closed["ok"] and "expired" in with_closed["error"]
    finally:
        c.close()


def test_cancel_a_target_staged_transfer(host_engine, peer):
    buf = host_engine.allocate(SIZE)
    h = host_engine.submit([Request(WRITE, buf, 0, peer.seg("dev"), 0, SIZE)])
    h.cancel()
    with pytest.raises(CancelledError):
        h.wait(60)
    # the slots came back: a full transfer still succeeds
    buf.array[:] = pattern(SIZE, seed=77)
    host_engine.transfer(WRITE, buf, 0, peer.seg("dev"), 0, SIZE, timeout=60)
    assert peer.digest("dev", 0, SIZE) == sha(pattern(SIZE, seed=77))
    peer.call(cmd="fill", segment="dev", seed=0)


def test_concurrent_reads_and_writes_of_different_ranges(host_engine, peer):
    m = 2 << 20
    src = host_engine.allocate(m)
    src.array[:] = pattern(m, seed=91)
    outs = [host_engine.allocate(m) for _ in range(3)]
    errors: list[BaseException] = []

    def reader(i: int) -> None:
        try:
            host_engine.transfer(READ, outs[i], 0, peer.seg("devro"), i * m, m, timeout=60)
        except BaseException as exc:
            errors.append(exc)

    ts = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    host_engine.transfer(WRITE, src, 0, peer.seg("dev"), 3 * m, m, timeout=60)
    for t in ts:
        t.join(60)
    assert not errors
    for i in range(3):
        assert np.array_equal(outs[i].array, pattern(SIZE, seed=1)[i * m : (i + 1) * m])
    assert peer.digest("dev", 3 * m, m) == sha(pattern(m, seed=91))
    peer.call(cmd="fill", segment="dev", seed=0)


def test_no_path_when_the_target_does_not_stage(host_engine):
    p = SimPeer(size=1 << 20, config={**NO_IPC, "target_staging": False}, transports=["tcp", "simdev"])
    try:
        buf = host_engine.allocate(4096)
        with pytest.raises(NoPathError, match="offers no staging"):
            host_engine.submit([Request(WRITE, buf, 0, p.seg("dev"), 0, 4096)])
        ex_text = str(host_engine.explain(op="READ", remote=p.seg("host"), length=4096))
        assert "chosen: direct" in ex_text  # host memory there: TCP reaches it directly
    finally:
        p.close()


def test_memory_a_transport_keeps_local_is_reached_through_staging():
    """Device memory shared with other processes goes direct; a READ-only buffer the owner's device
    transport keeps to its own process (as nvlink does: CUDA IPC cannot enforce READ-only) is
    reached through the owner's staging, where the owner checks every access."""
    p = SimPeer(size=4 << 20, config={"transports": {"simdev": {"share_read_only": False}}}, transports=["tcp", "simdev"])
    try:
        with Engine(transports=["tcp", "simdev"], plugins=[SimDevicePlugin()]) as eng:
            dst = SimArray(4 << 20)
            lb = eng.register(dst, segment="mine")
            assert eng.explain(Request(READ, lb, 0, p.seg("dev"), 0, 4 << 20)).chosen == "direct"
            ex = eng.explain(Request(READ, lb, 0, p.seg("devro"), 0, 4 << 20))
            assert ex.chosen == "both-staged", str(ex)
            eng.transfer(READ, lb, 0, p.seg("devro"), 0, 4 << 20, timeout=60)
            assert np.array_equal(dst.download(), pattern(4 << 20, seed=1))
            eng.transfer(READ, lb, 0, p.seg("dev"), 0, 4 << 20, timeout=60)
            assert np.array_equal(dst.download(), pattern(4 << 20, seed=0))
            with pytest.raises(PermissionDeniedError):
                eng.submit([Request(WRITE, lb, 0, p.seg("devro"), 0, 4096)])
    finally:
        p.close()


# A target whose device copies outlast its request deadline: 1 MiB takes 3 s on its one stream, a
# copy may take 0.3 s. The copy's reply goes out at the deadline, its slot stays leased until the
# device lets go of it.
SLOW = {"transports": {"simdev": {"ipc": False, "streams": 1, "copy_ns_per_mib": 3_000_000_000}},
        "target_staging_chunk_bytes": 1 << 20, "target_staging_slots": 2, "target_staging_depth": 2,
        "target_staging_lease_s": 2.0, "request_deadline_s": 0.3}


@pytest.fixture(scope="module")
def slow_peer():
    p = SimPeer(size=4 << 20, config=SLOW, transports=["tcp", "simdev"])
    yield p
    p.close()


def _open(c: ControlClient, depth: int) -> dict:
    return c.call({"op": "stage_open", "seg": "dev", "offset": 0, "length": 2 << 20, "write": True, "depth": depth}, 10)


def test_a_copy_past_its_deadline_fails_and_its_slot_waits_for_the_device(slow_peer):
    c = ControlClient(slow_peer.engine_id)
    try:
        rep = _open(c, 2)
        assert rep["ok"] and len(rep["slots"]) == 2  # every slot of the target
        sid = rep["sid"]
        before = slow_peer.stats()["staging"]
        # the first copy runs (3 s), the second waits behind it on the stream: both miss 0.3 s
        rids = [c.send({"op": "stage_push", "sid": sid, "slot": i, "off": i << 20, "len": 1 << 20}, 10) for i in range(2)]
        got: dict[int, dict] = {}
        end = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < end:
            for r in c.replies(max(0.0, end - time.monotonic())):
                got[r["id"]] = r
        assert sorted(got) == sorted(rids)
        for r in got.values():
            assert not r["ok"] and r["code"] == "DeadlineExceededError", r
        assert c.call({"op": "stage_close", "sid": sid}, 10)["ok"]
        # the device still copies into the first slot: no slot is leased again before it is done
        busy = _open(c, 1)
        assert not busy["ok"] and busy["error"].startswith("busy"), busy
        end = time.monotonic() + 30
        while time.monotonic() < end:
            again = _open(c, 2)
            if again["ok"]:
                break
            assert again["error"].startswith("busy"), again
            time.sleep(0.2)
        assert again["ok"] and len(again["slots"]) == 2  # both back once the device let go
        assert c.call({"op": "stage_close", "sid": again["sid"]}, 10)["ok"]
        after = slow_peer.stats()["staging"]
        assert after["pushed_bytes"] == before["pushed_bytes"]  # a failed copy is not counted as moved
        assert c.call({"op": "ping"}, 10)["ok"]
    finally:
        c.close()


def _open_when_free(c: ControlClient, depth: int) -> dict:
    end = time.monotonic() + 30
    while True:
        rep = _open(c, depth)
        if rep["ok"] or not rep["error"].startswith("busy") or time.monotonic() > end:
            return rep
        time.sleep(0.2)  # an earlier test's copy still holds a slot on the device


def test_a_queued_copy_of_a_closed_session_gets_its_error_reply(slow_peer):
    """A copy that never reached the device (waiting behind the session's running one) when the
    session closes gets its error reply (no batch of it ever finishes to signal the control
    thread), and the copy already on the device gets its own at its deadline."""
    c = ControlClient(slow_peer.engine_id)
    try:
        rep = _open_when_free(c, 2)
        assert rep["ok"], rep
        sid = rep["sid"]
        running, queued = (c.send({"op": "stage_push", "sid": sid, "slot": i, "off": i << 20, "len": 1 << 20}, 10)
                           for i in range(2))
        assert c.call({"op": "stage_close", "sid": sid}, 10)["ok"]
        got: dict[int, dict] = {}
        end = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < end:
            for r in c.replies(max(0.0, end - time.monotonic())):
                got[r["id"]] = r
        assert sorted(got) == sorted([running, queued])
        assert not got[queued]["ok"] and got[queued]["code"] == "InvalidRequestError", got[queued]
        assert f"session {sid} is closed" in got[queued]["error"]
        # the running copy outlives its 0.3 s deadline on the device
        assert not got[running]["ok"] and got[running]["code"] == "DeadlineExceededError", got[running]
        assert c.call({"op": "ping"}, 10)["ok"]
    finally:
        c.close()


def test_a_failing_target_copy_fails_the_transfer_with_its_error(host_engine, slow_peer):
    buf = host_engine.allocate(2 << 20)
    # chunk 0's copy misses its deadline on the device, chunk 1's waiting behind it in the session's
    # queue; both replies come at ~0.3 s and the pipeline raises whichever it sees first
    with pytest.raises(TentError, match="target staging: .*(missed its 0.3s deadline|waited for the session's previous one)"):
        host_engine.transfer(WRITE, buf, 0, slow_peer.seg("dev"), 0, 2 << 20, timeout=60)


WIDE = {**NO_IPC, "target_staging_chunk_bytes": 4 << 20, "target_staging_slots": 8, "target_staging_depth": 3}


def test_a_large_request_moves_in_fewer_larger_chunks_up_to_the_slot():
    """The initiator sizes a request's chunks (about target_staging_chunks of them, at least its
    smallest chunk, at most the target's slot): each chunk is one device copy at the target. A
    request cut into whole slots starts and ends with half a slot (`ramped_chunk_plan`)."""
    m = 1 << 20
    size = 48 * m
    p = SimPeer(size=size, config=WIDE, transports=["tcp", "simdev"])
    # a small reference size: the router's cached path must not fix every later request's chunk at
    # the one it priced (1 MiB here)
    eng = Engine({"target_staging_min_chunk_bytes": m, "target_staging_chunks": 4,
                  "path_cost": {"reference_bytes": 4 * m}}, transports=["tcp"])
    try:
        buf = eng.allocate(size)
        buf.array[:] = pattern(size, seed=88)
        # (length, chunk): 3 MiB chunks (a quarter, rounded up to 1 MiB); 4 MiB (the slot caps 10 MiB);
        # 1 MiB (the smallest chunk beats a quarter of 2 MiB)
        for n, chunk in ((10 * m + 4097, 3 * m), (40 * m, 4 * m), (2 * m + 5, m)):
            before = p.stats()["staging"]
            eng.transfer(WRITE, buf, 7, p.seg("dev"), 11, n, timeout=60)
            assert p.digest("dev", 11, n) == sha(pattern(size, seed=88)[7 : 7 + n])
            after = p.stats()["staging"]
            slot_sized = chunk == WIDE["target_staging_chunk_bytes"]
            assert after["copies"] - before["copies"] == len((ramped_chunk_plan if slot_sized else chunk_plan)(n, chunk))
            assert after["pushed_bytes"] - before["pushed_bytes"] == n
        out = eng.allocate(40 * m + 3)
        before = p.stats()["staging"]
        eng.transfer(READ, out, 3, p.seg("dev"), 11, 40 * m, timeout=60)
        assert np.array_equal(out.array[3:], pattern(size, seed=88)[7 : 7 + 40 * m])
        assert p.stats()["staging"]["copies"] - before["copies"] == 11  # 2 MiB, 9 x 4 MiB, 2 MiB
    finally:
        eng.close()
        p.close()


def test_the_chunk_timeline_records_each_chunk_of_both_halves_in_order():
    """`target_staging.TIMELINE` (the diagnosis tool's hook): with both halves in this process, every
    chunk's stages at the initiator and its device copy at the target appear once each, in the order
    the pipeline runs them; off (None), nothing is recorded."""
    from tent_core import target_staging

    m = 1 << 20
    size = 12 * m
    target = Engine({**NO_IPC, "target_staging_chunk_bytes": 2 * m, "target_staging_slots": 4,
                     "target_staging_depth": 2}, transports=["tcp", "simdev"], plugins=[SimDevicePlugin()])
    eng = Engine({"target_staging_min_chunk_bytes": 2 * m}, transports=["tcp"])
    try:
        dev = SimArray(size)
        target.register(dev, segment="dev")
        seg = f"{target.engine_id}/dev"
        buf = eng.allocate(size)
        buf.array[:] = pattern(size, seed=5)
        eng.transfer(WRITE, buf, 0, seg, 0, size, timeout=60)  # connections and sessions: before recording
        for op, push_stage in ((WRITE, 1), (READ, 0)):
            target_staging.TIMELINE = []
            try:
                out = eng.allocate(size)
                eng.transfer(op, buf if op == WRITE else out, 0, seg, 0, size, timeout=60)
                events = list(target_staging.TIMELINE)
            finally:
                target_staging.TIMELINE = None
            if op == READ:
                assert np.array_equal(out.array, buf.array)
            at: dict[tuple, int] = {}
            assert any(ev[1] == "sleep" for ev in events)  # the pipeline waited at least once
            for ev in events:
                if ev[1] == "sleep":
                    continue
                key = ev[1:]
                assert key not in at, f"{key} recorded twice"
                at[key] = ev[0]
            offsets = sorted(k[1] for k in at if k[0] == "arrive")
            # seven chunks (1 MiB, five of 2 MiB, 1 MiB: slot-sized chunks ramp), each copied once at the target
            assert offsets == [off for off, _ in ramped_chunk_plan(size, 2 * m)] == [0, *range(m, size, 2 * m)]
            for off in offsets:
                # WRITE: the wire leg, then the copy request; READ: the copy request, then the wire leg
                order = [("submit", off, 0), ("done", off, 0), ("arrive", off), ("start", off), ("finish", off),
                         ("done", off, 1)]
                if push_stage == 0:
                    order = [("submit", off, 0), ("arrive", off), ("start", off), ("finish", off), ("done", off, 0),
                             ("done", off, 1)]
                times = [at[k] for k in order]
                assert times == sorted(times), f"chunk {off}: {order} at {times}"
        eng.transfer(WRITE, buf, 0, seg, 0, size, timeout=60)
        assert target_staging.TIMELINE is None
    finally:
        eng.close()
        target.close()
