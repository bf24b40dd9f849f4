"""The native fast path and the Python planner answer every request the same way: the same bytes
for what succeeds (one request of one piece, one of several pieces the submitting thread shares
with the executor's workers, batches), the same typed error for what is refused (bounds on either
side, permission) and for a peer that died. The fast-path engine's classes are cached before the
comparison (its hit counter proves the valid requests went through C); the planner's engine has
the fast path off."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from peers import Peer

from tent_core import READ, WRITE, Engine, Request, TentError
from tent_core.testing import pattern

SIZE = 8 << 20
LOCAL = 4 << 20
KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=SIZE)
    yield p
    p.close()


def _sha(a: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _outcome(fn: Callable[[], Any]) -> str:
    try:
        h = fn()
        return "done" if h.wait(30) else "timeout"
    except TentError as exc:
        return type(exc).__name__


def _run(eng: Engine, peer: Peer) -> list[tuple[str, str, str]]:
    """(case, outcome, digest of what moved) for every case, in order."""
    local = eng.allocate(LOCAL)
    rw, ro = peer.seg("rw"), peer.seg("ro")
    want = pattern(SIZE, seed=0)
    out: list[tuple[str, str, str]] = []

    def case(name: str, fn: Callable[[], Any], digest: Callable[[], str] = lambda: "") -> None:
        local.array[:] = 0
        res = _outcome(fn)
        out.append((name, res, digest() if res == "done" else ""))

    for _ in range(3):  # caches every class on the fast-path engine (the first rounds connect)
        for op, seg in ((READ, rw), (WRITE, rw), (READ, ro)):
            eng.submit(Request(op, local, 0, seg, 0, 4 * KiB)).wait(30)
    peer.call(cmd="fill", segment="rw", seed=0)
    hits = eng._fast.hits if eng._fast is not None else 0
    case("read 64K", lambda: eng.submit(Request(READ, local, 4 * KiB, rw, 3 * MiB + 8, 64 * KiB)),
         lambda: _sha(local.array[4 * KiB : 68 * KiB]))  # fmt: skip
    case("read 256K from ro", lambda: eng.submit(Request(READ, local, 0, ro, 12345, 256 * KiB)),
         lambda: _sha(local.array[: 256 * KiB]))  # fmt: skip
    case("read 4M (pieces)", lambda: eng.submit(Request(READ, local, 0, rw, MiB + 4096, 4 * MiB)),
         lambda: _sha(local.array))  # fmt: skip
    case("read 3M+5 (uneven pieces)", lambda: eng.submit(Request(READ, local, 7, rw, 11, 3 * MiB + 5)),
         lambda: _sha(local.array[7 : 7 + 3 * MiB + 5]))  # fmt: skip
    case("batch 16 x 64K", lambda: eng.submit([Request(READ, local, i * 64 * KiB, rw, (15 - i) * 128 * KiB, 64 * KiB)
                                                 for i in range(16)]),
         lambda: _sha(local.array[: MiB]))  # fmt: skip
    src = pattern(LOCAL, seed=7)

    def write_4m() -> Any:
        local.array[:] = src
        return eng.submit(Request(WRITE, local, 0, rw, 2 * MiB, 4 * MiB))

    case("write 4M (pieces)", write_4m, lambda: peer.digest("rw", 2 * MiB, 4 * MiB))
    if eng._fast is not None:
        assert eng._fast.hits == hits + 6, "a valid request missed the fast path"
    peer.call(cmd="fill", segment="rw", seed=0)
    case("remote out of bounds", lambda: eng.submit(Request(READ, local, 0, rw, SIZE - 100, 4 * KiB)))
    case("remote out of bounds, pieces", lambda: eng.submit(Request(READ, local, 0, rw, SIZE - 2 * MiB, 4 * MiB)))
    case("local out of bounds", lambda: eng.submit(Request(READ, local, LOCAL - 10, rw, 0, 4 * KiB)))
    case("write to read-only", lambda: eng.submit(Request(WRITE, local, 0, ro, 0, 64 * KiB)))
    case("write 4M to read-only", lambda: eng.submit(Request(WRITE, local, 0, ro, 0, 4 * MiB)))
    case("batch with one bad request", lambda: eng.submit([Request(READ, local, 0, rw, 0, 64 * KiB),
                                                           Request(READ, local, 0, rw, SIZE, 1)]))  # fmt: skip
    # the bytes that moved are the peer's
    assert out[0][2] == _sha(want[3 * MiB + 8 : 3 * MiB + 8 + 64 * KiB])
    assert out[2][2] == _sha(want[MiB + 4096 : MiB + 4096 + 4 * MiB])
    assert out[5][2] == _sha(src)
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_fast_path_and_planner_agree(peer, transport):
    if transport not in peer.transports:
        pytest.fail(f"transport {transport} not available in the peer: {peer.transports}")
    with Engine(transports=[transport]) as fast, Engine({"fast_path": False}, transports=[transport]) as planner:
        got_fast = _run(fast, peer)
        got_planner = _run(planner, peer)
        assert planner._fast is None
    assert got_fast == got_planner
    assert [r[1] for r in got_fast] == ["done"] * 6 + ["OutOfBoundsError"] * 3 + ["PermissionDeniedError"] * 2 + [
        "OutOfBoundsError"]  # fmt: skip


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_dead_peer_fails_the_same_way_on_both_paths(transport):
    results = []
    for cfg in ({}, {"fast_path": False}):
        p = Peer(size=SIZE)
        try:
            with Engine(cfg, transports=[transport]) as eng:
                local = eng.allocate(LOCAL)
                for _ in range(3):
                    eng.read(local, p.seg("rw"), 64 * KiB)
                    eng.read(local, p.seg("rw"), 4 * MiB)
                hits = eng._fast.hits if eng._fast is not None else None
                p.kill()
                seg = p.seg("rw")
                got = [_outcome(lambda n=n: eng.submit(Request(READ, local, 0, seg, 0, n), deadline=10))  # noqa: B023
                       for n in (64 * KiB, 4 * MiB)]  # fmt: skip
                results.append((got, hits))
        finally:
            p.close()
    (fast, fast_hits), (planner, _) = results
    assert fast == planner, (fast, planner)
    assert all(r == "PeerUnreachableError" for r in fast), fast
    assert fast_hits is not None and fast_hits >= 4


def test_handles_stay_out_of_cycle_collection(peer):
    """Handles of both paths are untracked: thousands queued must not make every collection walk
    them (a slot added to BatchHandle once made them all tracked)."""
    import gc

    for cfg in ({}, {"fast_path": False}):
        with Engine(cfg, transports=["shm"]) as eng:
            local = eng.allocate(64 * KiB)
            hs = [eng.submit(Request(READ, local, 0, peer.seg("rw"), 0, 64 * KiB)) for _ in range(5)]
            for h in hs:
                assert h.wait(30)
                assert not gc.is_tracked(h)
