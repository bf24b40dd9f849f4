"""Batch.wait polls the completion counter briefly before it sleeps; the poll never outlives
the caller's timeout, and completions from another thread end it early."""

from __future__ import annotations

import threading
import time

import pytest

from tent_core import Engine, _native
from tent_core.abi import Status
from tent_core.errors import InvalidRequestError


@pytest.fixture
def restore_spin():
    old = _native.set_wait_spin_ns(0)
    yield
    _native.set_wait_spin_ns(old)


def test_poll_is_bounded_by_the_timeout(restore_spin) -> None:
    _native.set_wait_spin_ns(10_000_000)  # 10 ms of polling asked for
    b = _native.Batch(1)
    fastest = float("inf")
    # an unfinished batch: the 1 ms timeout wins over the 10 ms poll; the fastest of several tries,
    # so a try the scheduler preempted on a loaded machine cannot fail the check, while a poll
    # that ignored the timeout makes every try last >= 10 ms
    for _ in range(20):
        t0 = time.monotonic()
        assert b.wait(0.001) is False
        fastest = min(fastest, time.monotonic() - t0)
    assert fastest < 0.009, fastest
    b.fail_slice(Status.E_INTERNAL)
    assert b.wait(0) is True


def test_completion_during_the_poll_and_after_it(restore_spin) -> None:
    for spin_ns in (0, 2_000_000):
        _native.set_wait_spin_ns(spin_ns)
        for delay in (0.0005, 0.02):  # inside the poll window, then well after it (sleeping)
            b = _native.Batch(1)
            t = threading.Timer(delay, lambda b=b: b.complete_slice(1))
            t.start()
            assert b.wait(5.0) is True
            t.join()
            assert b.remaining == 0


def test_bad_values_are_refused(restore_spin) -> None:
    with pytest.raises(ValueError):
        _native.set_wait_spin_ns(-1)
    with pytest.raises(ValueError):
        _native.set_wait_spin_ns(10_000_001)
    with pytest.raises(InvalidRequestError, match="wait_spin_us"):
        Engine({"wait_spin_us": -5}, transports=[])


def test_engine_config_sets_the_poll(restore_spin) -> None:
    with Engine({"wait_spin_us": 7}, transports=[]):
        assert _native.set_wait_spin_ns(0) == 7000


def test_a_sleeping_wait_does_not_poll(restore_spin) -> None:
    # a 10 ms poll configured: wait(spin=False) sleeps at once (no CPU), the default polls (CPU);
    # thread CPU time, not wall time: the scheduler's delays on a loaded machine do not matter
    _native.set_wait_spin_ns(10_000_000)
    b = _native.Batch(1)

    def cpu_of(spin: bool) -> float:
        t0 = time.thread_time()
        assert b.wait(0.02, spin) is False
        return time.thread_time() - t0

    sleeping = min(cpu_of(False) for _ in range(5))
    polling = max(cpu_of(True) for _ in range(5))
    assert sleeping < 0.003, sleeping
    assert polling > 0.003, polling  # the check tells the two apart
    b.fail_slice(Status.E_INTERNAL)
    assert b.wait(0, False) is True


def test_wait_sleeping_returns_and_raises_like_wait() -> None:
    with Engine({}, transports=["tcp"]) as a, Engine({}, transports=["tcp"]) as b:
        dst = b.allocate(8 << 20, segment="dst")
        src = a.allocate(8 << 20)
        src.array[:] = 7
        from tent_core.request import Request
        from tent_core.types import OpCode

        h = a.submit([Request(OpCode.WRITE, src, 0, f"{b.engine_id}/dst", 0, 8 << 20)])
        assert h.wait_sleeping(30) is True
        assert int(dst.array[-1]) == 7
    from tent_core.batch import BatchHandle
    from tent_core.errors import PermissionDeniedError

    pending = BatchHandle(None, 1, time.monotonic() + 30, 1)
    assert pending.wait_sleeping(0.01) is False  # the timeout: the batch keeps running
    pending.fail_slice(Status.E_PERMISSION)
    with pytest.raises(PermissionDeniedError):  # a failure raises its typed error, as wait() does
        pending.wait_sleeping(1)


def test_wait_on_a_running_batch_returns_and_raises_like_the_python_wait() -> None:
    """wait() on a batch still running waits in C (no Python frame per small request); what it
    answers is what `_wait` answers: True once done, False when the timeout ran out, the typed
    error of a failure or of a missed deadline."""
    from tent_core.batch import BatchHandle
    from tent_core.errors import DeadlineExceededError, PermissionDeniedError

    pending = BatchHandle(None, 1, time.monotonic() + 30, 1)
    assert pending.wait(0.01) is False and pending.wait(timeout=0) is False
    assert pending.remaining == 1 and not pending.cancelled  # the timeout: the batch keeps running

    done_later = BatchHandle(None, 2, time.monotonic() + 30, 1)
    t = threading.Thread(target=lambda: (time.sleep(0.02), done_later.complete_slice(), done_later.complete_slice()))
    t.start()
    assert done_later.wait() is True  # finished by another thread while this one waited
    t.join()

    failing = BatchHandle(None, 1, time.monotonic() + 30, 1)
    t = threading.Thread(target=lambda: (time.sleep(0.02), failing.fail_slice(Status.E_PERMISSION)))
    t.start()
    with pytest.raises(PermissionDeniedError):  # failed while this one waited
        failing.wait(10)
    t.join()

    late = BatchHandle(None, 1, time.monotonic() + 0.05, 1)
    with pytest.raises(DeadlineExceededError):  # no timeout: the deadline ends the wait
        late.wait()
    assert late.cancelled  # and cancels the batch, as `_wait` does


def test_notify_signals_the_eventfd_once_when_the_batch_finishes() -> None:
    """Batch.notify: the thread that finishes the batch signals the notifier (a serving thread
    polls its fd); armed after the batch finished, it signals at once; a failed batch too."""
    import select

    n = _native.Notifier()

    def readable() -> bool:
        return bool(select.select([n.fileno()], [], [], 0)[0])

    b = _native.Batch(2)
    b.notify(n)
    b.complete_slice(1)
    assert not readable()
    t = threading.Thread(target=b.complete_slice, args=(1,))
    t.start()
    t.join(10)
    assert readable() and n.drain() == 1 and not readable()
    done = _native.Batch(1)
    done.complete_slice(0)
    done.notify(n)
    assert n.drain() == 1
    failed = _native.Batch(1)
    failed.notify(n)
    failed.fail_slice(Status.E_BOUNDS)
    assert n.drain() == 1 and failed.error == Status.E_BOUNDS
    with pytest.raises(TypeError):
        b.notify(object())


def test_a_batch_keeps_its_notifier_open_after_the_owner_drops_it() -> None:
    """The eventfd lives until the last armed batch lets go of it: a finisher never writes to a
    closed descriptor (whose number another file may have taken)."""
    import os

    n = _native.Notifier()
    fd = n.fileno()
    b = _native.Batch(1)
    b.notify(n)
    del n
    os.fstat(fd)  # still open: the batch holds it
    r, w = os.pipe()  # nothing else can take the number while the batch holds it
    try:
        assert fd not in (r, w)
    finally:
        os.close(r)
        os.close(w)
    b.complete_slice(0)  # signals and lets go (closes it); not checked: another thread may reuse the number
