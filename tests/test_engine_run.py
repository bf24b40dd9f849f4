"""`Engine.run(requests, deadline)`: submit and wait in one call. On the fast path a batch finished
inside the call (a small same-host copy run on the calling thread) gets no handle at all, so these
tests hold it to exactly what `submit(...).wait()` does: the same bytes, the same typed errors for
every refusal (bounds on either side, permission, a bad deadline, a closed engine), the metrics
hook still told of every batch, and correct bytes when many threads run at once."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import numpy as np
import pytest
from peers import Peer

from tent_core import READ, WRITE, Engine, Request, TentError, batch, errors
from tent_core.testing import pattern

SIZE = 8 << 20
KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=SIZE)
    yield p
    p.close()


def _sha(a: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _outcome(fn: Any) -> str:
    try:
        fn()
        return "done"
    except TentError as exc:
        return type(exc).__name__


def _cases(eng: Engine, peer: Peer, via_run: bool) -> list[tuple[str, str, str]]:
    """Every case through run() or through submit().wait(): (case, outcome, digest of what moved)."""
    local = eng.allocate(4 * MiB)
    rw, ro = peer.seg("rw"), peer.seg("ro")

    def go(reqs: Any, deadline: float | None = None) -> None:
        if via_run:
            assert eng.run(reqs, deadline) is None
        else:
            eng.submit(reqs, deadline).wait()

    for _ in range(3):  # the classes are cached on a fast-path engine (the first rounds connect)
        for op, seg in ((READ, rw), (WRITE, rw), (READ, ro)):
            eng.submit(Request(op, local, 0, seg, 0, 4 * KiB)).wait(30)
    peer.call(cmd="fill", segment="rw", seed=0)
    out: list[tuple[str, str, str]] = []

    def case(name: str, fn: Any, digest: Any = lambda: "") -> None:
        local.array[:] = 0
        res = _outcome(fn)
        out.append((name, res, digest() if res == "done" else ""))

    hits = eng._fast.hits if eng._fast is not None else 0
    case("read 64K", lambda: go(Request(READ, local, 4 * KiB, rw, 3 * MiB + 8, 64 * KiB)),
         lambda: _sha(local.array[4 * KiB : 68 * KiB]))  # fmt: skip
    case("read 4M (pieces)", lambda: go([Request(READ, local, 0, rw, MiB + 4096, 4 * MiB)]),
         lambda: _sha(local.array))  # fmt: skip
    case("batch 16 x 64K", lambda: go(tuple(Request(READ, local, i * 64 * KiB, ro, (15 - i) * 128 * KiB, 64 * KiB)
                                            for i in range(16))),
         lambda: _sha(local.array[:MiB]))  # fmt: skip
    src = pattern(64 * KiB, seed=11)

    def write_64k() -> None:
        local.array[: 64 * KiB] = src
        go(Request(WRITE, local, 0, rw, 5 * MiB + 3, 64 * KiB))

    case("write 64K", write_64k, lambda: peer.digest("rw", 5 * MiB + 3, 64 * KiB))
    if eng._fast is not None:
        assert eng._fast.hits == hits + 4, "a valid request missed the fast path"
    case("remote out of bounds", lambda: go(Request(READ, local, 0, rw, SIZE - 100, 4 * KiB)))
    case("local out of bounds", lambda: go(Request(READ, local, 4 * MiB - 10, rw, 0, 4 * KiB)))
    case("write to read-only", lambda: go(Request(WRITE, local, 0, ro, 0, 64 * KiB)))
    case("batch with one bad request", lambda: go([Request(READ, local, 0, rw, 0, 64 * KiB),
                                                   Request(READ, local, 0, rw, SIZE, 1)]))  # fmt: skip
    case("deadline 0", lambda: go(Request(READ, local, 0, rw, 0, 64 * KiB), 0.0))
    want = pattern(SIZE, seed=0)
    assert out[0][2] == _sha(want[3 * MiB + 8 : 3 * MiB + 8 + 64 * KiB])
    assert out[3][2] == _sha(src)
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_run_answers_as_submit_then_wait(peer, transport):
    with Engine(transports=[transport]) as fast, Engine({"fast_path": False}, transports=[transport]) as planner:
        got = {(name, via): _cases(eng, peer, via) for name, eng in (("fast", fast), ("planner", planner))
               for via in (True, False)}  # fmt: skip
    first = got[("fast", True)]
    assert all(v == first for v in got.values()), got
    assert [r[1] for r in first] == ["done"] * 4 + ["OutOfBoundsError", "OutOfBoundsError", "PermissionDeniedError",
                                                    "OutOfBoundsError", "InvalidRequestError"]  # fmt: skip


def test_run_on_a_closed_engine_raises(peer):
    eng = Engine(transports=["shm"])
    local = eng.allocate(64 * KiB)
    req = Request(READ, local, 0, peer.seg("rw"), 0, 64 * KiB)
    eng.run(req)
    eng.close()
    with pytest.raises(TentError, match="closed"):
        eng.run(req)


def test_run_reports_every_batch_to_the_metrics_hook(peer):
    """With a completion hook set, run() keeps a handle so the hook hears of each batch it ran."""
    seen: list[str] = []
    old = batch.COMPLETION_HOOK
    batch.COMPLETION_HOOK = lambda h, outcome: seen.append(outcome)
    try:
        with Engine(transports=["shm"]) as eng:
            local = eng.allocate(64 * KiB)
            ok = Request(READ, local, 0, peer.seg("rw"), 0, 64 * KiB)
            for _ in range(3):
                eng.run(ok)
            with pytest.raises(errors.OutOfBoundsError):
                eng.run(Request(READ, local, 0, peer.seg("rw"), SIZE - 8, 64 * KiB))
    finally:
        batch.COMPLETION_HOOK = old
    assert seen == ["done"] * 3, seen  # a request refused at submit never became a batch


@pytest.mark.parametrize("op", ["READ", "WRITE"])
def test_run_from_many_threads_moves_each_threads_own_bytes(peer, op):
    """Threads share one engine and its cached plans; each moves its own region with its own pattern
    and checks every transfer byte for byte (READ) or the peer's copy at the end (WRITE)."""
    threads, rounds, block = 4, 150, 64 * KiB
    rw = peer.seg("rw")
    peer.call(cmd="fill", segment="rw", seed=0)
    want = pattern(SIZE, seed=0)
    errors_seen: list[BaseException] = []
    with Engine(transports=["shm"]) as eng:
        locals_ = [eng.allocate(block) for _ in range(threads)]
        start = threading.Barrier(threads)

        def worker(k: int) -> None:
            try:
                local = locals_[k]
                start.wait(60)
                for i in range(rounds):
                    off = ((k * rounds + i) * 4099 * 8) % (SIZE - block)
                    if op == "READ":
                        local.array[:] = 0
                        eng.run(Request(READ, local, 0, rw, off, block))
                        assert np.array_equal(local.array, want[off : off + block]), (k, i)
                    else:
                        local.array[:] = pattern(block, seed=100 + k)
                        eng.run(Request(WRITE, local, 0, rw, k * block, block))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors_seen.append(exc)

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        assert not any(t.is_alive() for t in ts)
        assert not errors_seen, errors_seen[:3]
        assert eng._fast.hits >= threads * rounds // 2  # the fast path took them (a first request per buffer plans)
    if op == "WRITE":
        for k in range(threads):
            assert peer.digest("rw", k * block, block) == _sha(pattern(block, seed=100 + k))


def test_run_waits_through_the_handles_own_wait(peer, monkeypatch):
    """run() calls the handle's `wait` directly only while it is Batch.wait_handle itself: a `wait`
    that a subclass or a patch puts in its place is the one called (tcp: the answer is read there)."""
    calls: list[int] = []
    native_wait = batch.BatchHandle.wait

    def counted(self: Any, timeout: float | None = None) -> bool:
        calls.append(1)
        return bool(native_wait(self, timeout))

    with Engine(transports=["tcp"]) as eng:
        local = eng.allocate(64 * KiB)
        req = Request(READ, local, 0, peer.seg("rw"), 0, 64 * KiB)
        eng.run(req)  # connected, the plan cached
        peer.call(cmd="fill", segment="rw", seed=5)
        eng.run(req)
        assert calls == []
        assert _sha(local.array) == _sha(pattern(SIZE, seed=5)[: 64 * KiB])
        monkeypatch.setattr(batch.BatchHandle, "wait", counted)
        local.array[:] = 0
        for _ in range(3):
            eng.run(req)
        assert len(calls) == 3
        assert _sha(local.array) == _sha(pattern(SIZE, seed=5)[: 64 * KiB])
