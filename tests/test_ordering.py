"""Stream ordering end to end on CPU with the simulated device: transfers that wait for a producer
stream or event and signal an event when done, on the device (the simdev executor's streams wait)
and on the host (a staged path over TCP to another process), with deadlines, cancellation and
bad handles."""

from __future__ import annotations

import time

import numpy as np
import pytest
from peers import sha
from sim_peers import SimPeer

from tent_core import (
    READ,
    WRITE,
    CancelledError,
    DeadlineExceededError,
    Engine,
    InvalidRequestError,
    LocalBuffer,
    Request,
)
from tent_core.simdev import SimArray, SimDevicePlugin, SimEvent, SimStream
from tent_core.testing import pattern

N = 4 << 20
NO_IPC = {"transports": {"simdev": {"ipc": False}}}


@pytest.fixture
def engine():
    eng = Engine(transports=["tcp", "simdev"], plugins=[SimDevicePlugin()])
    yield eng
    eng.close()


def _dev(eng: Engine, seg: str, n: int = N) -> tuple[SimArray, LocalBuffer]:
    a = SimArray(n)
    return a, eng.register(a, segment=seg)


def test_a_read_waits_on_the_device_for_the_producer_stream(engine):
    dev, _ = _dev(engine, "dev")
    host = engine.allocate(N)
    s = SimStream()
    s.sleep(0.4)
    s.fill(dev, 5)  # a slow kernel produces the data
    t0 = time.monotonic()
    h = engine.submit([Request(READ, host, 0, engine.segment_name("dev"), 0, N, wait_stream=s)])
    assert time.monotonic() - t0 < 0.3, "submit blocked on the producer"
    assert h.ordering == "native"  # the simdev executor's streams wait, not a host thread
    assert h.wait(10)
    assert time.monotonic() - t0 >= 0.35
    assert np.array_equal(host.array, pattern(N, 5))
    assert engine.transports["simdev"].stats()["ordered_waits"] >= 1
    # without the wait the same read runs at once and sees what is there before the kernel
    s.sleep(0.4)
    s.fill(dev, 6)
    engine.transfer(READ, host, 0, engine.segment_name("dev"), 0, N)
    assert np.array_equal(host.array, pattern(N, 5))
    s.synchronize()


def test_a_write_waits_for_an_event_and_signals_one(engine):
    dev, _ = _dev(engine, "dev")
    src, src_buf = _dev(engine, "src")
    s = SimStream()
    s.sleep(0.3)
    s.fill(src, 9)
    produced = s.record()
    done = SimEvent()
    consumer = SimStream()
    h = engine.submit([Request(WRITE, src_buf, 0, engine.segment_name("dev"), 0, N, wait_event=produced,
                               signal_event=done)])
    out = SimArray(N)
    consumer.wait_event(done)  # right after submit: the event fires when the transfer is final
    consumer.copy(out.ptr, dev.ptr, N)
    consumer.synchronize(10)
    assert h.poll() == "done"
    assert np.array_equal(out.download(), pattern(N, 9))


def test_host_side_ordering_for_a_staged_path_over_tcp():
    """Device memory here -> device memory in another process (both sides stage over TCP): the
    staged pipeline cannot wait on the device, so the batch is held on the host until the producer
    is done; the signal fires when the last chunk landed there."""
    p = SimPeer(size=N, config=NO_IPC, transports=["tcp", "simdev"])
    try:
        with Engine(NO_IPC, transports=["tcp", "simdev"], plugins=[SimDevicePlugin()]) as eng:
            src, lb = _dev(eng, "src")
            s = SimStream()
            s.sleep(0.3)
            s.fill(src, 13)
            done = SimEvent()
            h = eng.submit([Request(WRITE, lb, 0, p.seg("dev"), 0, N, wait_stream=s, signal_event=done)])
            assert h.ordering == "host"
            assert done.synchronize(30)
            assert h.poll() == "done"
            assert p.digest("dev", 0, N) == sha(pattern(N, 13))
            # READ into local device memory, signalled; a consumer kernel copies it after the event
            dst, lb2 = _dev(eng, "dst")
            fired = SimEvent()
            h = eng.submit([Request(READ, lb2, 0, p.seg("devro"), 0, N, signal_event=fired)])
            consumer = SimStream()
            consumer.wait_event(fired)
            out = SimArray(N)
            consumer.copy(out.ptr, dst.ptr, N)
            consumer.synchronize(30)
            assert h.poll() == "done"
            assert np.array_equal(out.download(), pattern(N, 1))
    finally:
        p.close()


def test_a_wait_that_never_ends_fails_at_the_deadline(engine):
    dev, _ = _dev(engine, "dev")
    host = engine.allocate(N)
    s = SimStream()
    s.sleep(10.0)  # far longer than the deadline
    t0 = time.monotonic()
    h = engine.submit([Request(READ, host, 0, engine.segment_name("dev"), 0, N, wait_stream=s)], deadline=0.5)
    with pytest.raises(DeadlineExceededError):
        h.wait()
    assert time.monotonic() - t0 < 8.0  # the deadline ended it, not the producer
    end = time.monotonic() + 10
    while h._batch.remaining and time.monotonic() < end:
        time.sleep(0.01)
    assert h._batch.remaining == 0  # every unit finalized, nothing left behind
    s.synchronize(30)


def test_a_held_batch_finalized_at_its_deadline_reports_the_deadline():
    """The ordering thread finalizes a held batch at its deadline before anyone waits on it: the
    wait that comes later reports the deadline, not a path failure."""
    p = SimPeer(size=N, config=NO_IPC, transports=["tcp", "simdev"])
    try:
        with Engine(transports=["tcp", "simdev"], plugins=[SimDevicePlugin()]) as eng:
            buf = eng.allocate(N)
            # the peer described and connected first: under load, a first contact takes longer than the
            # 0.2 s deadline (the submit then fails resolving the peer, which is not what this tests)
            eng.read(buf, p.seg("host"), 4096, timeout=30)
            s = SimStream()
            s.sleep(3.0)
            h = eng.submit([Request(READ, buf, 0, p.seg("host"), 0, N, wait_stream=s)], deadline=0.2)
            assert h.ordering == "host"
            end = time.monotonic() + 10
            while h._batch.remaining and time.monotonic() < end:  # finalized by the ordering thread
                time.sleep(0.01)
            assert h._batch.remaining == 0
            with pytest.raises(DeadlineExceededError):
                h.wait(5)
            s.synchronize(30)
    finally:
        p.close()


def test_host_held_batches_fail_at_deadline_or_cancel():
    """Requests to host memory in another process go over TCP: held on the host."""
    p = SimPeer(size=N, config=NO_IPC, transports=["tcp", "simdev"])
    try:
        with Engine(transports=["tcp", "simdev"], plugins=[SimDevicePlugin()]) as eng:
            buf = eng.allocate(N)
            eng.read(buf, p.seg("host"), 4096, timeout=30)  # first contact outside the 0.4 s deadline
            s = SimStream()
            s.sleep(2.0)
            h = eng.submit([Request(READ, buf, 0, p.seg("host"), 0, N, wait_stream=s)], deadline=0.4)
            assert h.ordering == "host"
            with pytest.raises(DeadlineExceededError):
                h.wait()
            h2 = eng.submit([Request(READ, buf, 0, p.seg("host"), 0, N, wait_stream=s)])
            h2.cancel()
            with pytest.raises(CancelledError):
                h2.wait(10)
            # once the producer is done a held batch runs
            h3 = eng.submit([Request(READ, buf, 0, p.seg("host"), 0, N, wait_stream=s)])
            assert h3.wait(30)
            assert np.array_equal(buf.array, pattern(N, 2))
            # close with a batch still held: it fails (cancelled), close does not hang
            s.sleep(5.0)
            h4 = eng.submit([Request(READ, buf, 0, p.seg("host"), 0, N, wait_stream=s)])
        with pytest.raises(CancelledError):
            h4.wait(1)
    finally:
        p.close()


def test_bad_stream_or_event_objects_are_refused_at_submit(engine):
    host = engine.allocate(4096)
    _dev(engine, "dev")
    with pytest.raises(InvalidRequestError):
        engine.submit([Request(READ, host, 0, engine.segment_name("dev"), 0, 4096, wait_stream="stream 0")])
    with pytest.raises(InvalidRequestError):
        engine.submit([Request(READ, host, 0, engine.segment_name("dev"), 0, 4096, signal_event=object())])


def test_several_waits_in_one_batch_are_joined(engine):
    a, _ = _dev(engine, "a")
    b, _ = _dev(engine, "b")
    host = engine.allocate(2 * N)
    s1, s2 = SimStream(), SimStream()
    s1.sleep(0.2)
    s1.fill(a, 21)
    s2.sleep(0.4)
    s2.fill(b, 22)
    h = engine.submit([
        Request(READ, host, 0, engine.segment_name("a"), 0, N, wait_stream=s1),
        Request(READ, host, N, engine.segment_name("b"), 0, N, wait_stream=s2),
    ])
    assert h.ordering == "native"
    assert h.wait(10)
    assert np.array_equal(host.array[:N], pattern(N, 21)) and np.array_equal(host.array[N:], pattern(N, 22))
