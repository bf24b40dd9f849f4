"""Handles the application let go are kept for the next submit (a few, native side): a
submit(...).wait() loop then costs no allocation per request. These tests hold a reused handle to
being a fresh one: nothing of the previous batch shows (fields, slots set by recovery), what a
dropped handle held in its slots is released at once, a handle still held is never handed out
again, the handle type's references stay bounded (and the bound is checked and can be lowered),
and a Python subclass of BatchHandle still releases its own slots and BatchHandle's."""

from __future__ import annotations

import gc
import sys
import time
import weakref
from typing import Any

import pytest
from peers import Peer

from tent_core import READ, WRITE, Engine, Request, _native
from tent_core.batch import BatchHandle

KiB = 1 << 10


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=1 << 20)
    yield p
    p.close()


@pytest.fixture
def eng():
    with Engine(transports=["shm"]) as e:
        yield e


class Marker:
    """Something a handle's slot can hold, whose release a weak reference shows."""


def _warm(eng: Engine, local: Any, seg: str) -> None:
    for _ in range(3):  # the first requests connect and plan; then the class is cached
        eng.submit(Request(READ, local, 0, seg, 0, 4 * KiB)).wait(30)


def test_a_reused_handle_shows_nothing_of_its_previous_batch(eng, peer):
    local = eng.allocate(64 * KiB)
    rw = peer.seg("rw")
    _warm(eng, local, rw)
    for i in range(50):
        before = time.monotonic()
        n = 1 + i % 3
        reqs = [Request(WRITE if i % 2 else READ, local, k * 4 * KiB, rw, k * 4 * KiB, 4 * KiB) for k in range(n)]
        h = eng.submit(reqs, 5.0 + i)
        after = time.monotonic()
        # what a handle starts with, whatever the previous one at this address carried
        assert h.ordering == "" and h.outage is None and h.failure_detail is None
        assert not h._deadline_hit and not h.is_probe and h.engine is eng
        assert h.num_requests == n and h.total >= n and h.remaining in range(0, h.total + 1)
        assert before - 1e-3 <= h.submitted_at <= after + 1e-3
        assert h.deadline == pytest.approx(h.submitted_at + 5.0 + i)
        assert h.wait(30) is True and h.remaining == 0 and h.error == 0 and h.bytes_done == n * 4 * KiB
        # what recovery may set on a handle: must not survive into the next one
        h.ordering, h.failure_detail, h.outage = "host", "gone", Marker()
        h._deadline_hit = True
        del h


def test_what_a_dropped_handle_held_is_released_at_once(eng, peer):
    local = eng.allocate(64 * KiB)
    rw = peer.seg("rw")
    _warm(eng, local, rw)
    refs = []
    for _ in range(40):
        h = eng.submit(Request(READ, local, 0, rw, 0, 4 * KiB))
        h.wait(30)
        m = Marker()
        h.outage = m
        refs.append(weakref.ref(m))
        del h, m
        assert refs[-1]() is None, "a dropped handle kept its slot's object"


def test_a_held_handle_is_never_handed_out_again(eng, peer):
    local = eng.allocate(64 * KiB)
    rw = peer.seg("rw")
    _warm(eng, local, rw)
    held = []
    for i in range(64):  # more than the native side keeps
        h = eng.submit(Request(READ, local, 0, rw, 0, (i % 4 + 1) * KiB))
        h.ordering = f"h{i}"
        held.append(h)
        for _ in range(3):  # others made and dropped between
            eng.submit(Request(READ, local, 0, rw, 0, 4 * KiB)).wait(30)
    assert len({id(h) for h in held}) == len(held)
    for i, h in enumerate(held):
        assert h.wait(30) and h.ordering == f"h{i}" and h.bytes_done == (i % 4 + 1) * KiB
    del held, h
    # dropped all at once: the next ones are sound
    for _ in range(64):
        h = eng.submit(Request(READ, local, 0, rw, 0, 4 * KiB))
        assert h.ordering == "" and h.wait(30) and h.bytes_done == 4 * KiB


def test_the_handle_type_is_not_leaked(eng, peer):
    local = eng.allocate(64 * KiB)
    rw = peer.seg("rw")
    _warm(eng, local, rw)
    gc.collect()
    before = sys.getrefcount(BatchHandle)
    for _ in range(2000):
        eng.submit(Request(READ, local, 0, rw, 0, 4 * KiB)).wait(30)
        eng.run(Request(WRITE, local, 0, rw, 0, 4 * KiB))
    gc.collect()
    # each kept handle holds its type; the native side keeps a few, never more
    assert sys.getrefcount(BatchHandle) - before <= 64


def test_a_subclass_of_the_handle_releases_its_slots_and_the_handles(eng):
    class Sub(BatchHandle):
        __slots__ = ("extra", "__dict__", "__weakref__")

    before = sys.getrefcount(Sub)
    refs = []
    for _ in range(100):
        h = Sub(eng, 2, time.monotonic() + 30, 1)
        a, b, c = Marker(), Marker(), Marker()
        h.extra, h.outage, h.anything = a, b, c
        refs += [weakref.ref(a), weakref.ref(b), weakref.ref(c)]
        w = weakref.ref(h)
        h.complete_slice(4)
        h.complete_slice(4)
        assert h.wait(1) is True and h.bytes_done == 8 and h.engine is eng
        del h, a, b, c
        assert w() is None
    gc.collect()
    assert all(r() is None for r in refs)
    assert sys.getrefcount(Sub) == before


def test_the_bound_of_kept_handles_is_checked_and_can_be_lowered(eng, peer):
    local = eng.allocate(64 * KiB)
    rw = peer.seg("rw")
    _warm(eng, local, rw)
    bound = _native.handle_freelist()
    assert 0 <= bound <= 256  # BATCH_CACHE in _native/native.c
    for bad in (-1, 257):
        with pytest.raises(ValueError):
            _native.handle_freelist(bad)
    with pytest.raises(TypeError):
        _native.handle_freelist("4")
    assert _native.handle_freelist() == bound
    gc.collect()
    before = sys.getrefcount(BatchHandle)
    try:
        assert _native.handle_freelist(0) == bound  # those kept are freed: their type references go
        assert sys.getrefcount(BatchHandle) <= before
        for _ in range(100):
            h = eng.submit(Request(READ, local, 0, rw, 0, 4 * KiB))
            assert h.ordering == "" and h.wait(30) and h.bytes_done == 4 * KiB
            del h
        gc.collect()
        assert sys.getrefcount(BatchHandle) <= before  # none kept now
    finally:
        _native.handle_freelist(bound)
